"""Prior means of the designer's GPs beyond GPyTorch's constant and linear ones."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from gpytorch.means import Mean
from torch import Tensor
from torch.nn import Parameter


@dataclass(frozen=True)
class Prior:
    """The prior mean of one outcome's GP: ``function`` of its encoded inputs."""

    outcome: str
    function: Callable[[Tensor], Tensor]


class PriorMean(Mean):
    """A constant plus a fixed function of the inputs for the outputs ``active`` marks
    (``prior(x)``: the weighted sources' mean); without a function, a constant mean.

    The constant is a parameter named as GPyTorch's ``ConstantMean``'s (``raw_constant``),
    so hyperparameters fitted either way warm-start the other.
    """

    def __init__(
        self,
        prior: Callable[[Tensor], Tensor] | None,
        active: Sequence[bool] = (True,),
        batch_shape: torch.Size | None = None,
    ) -> None:
        super().__init__()
        batch_shape = batch_shape or torch.Size()
        self.prior = prior
        self.register_parameter("raw_constant", Parameter(torch.zeros(batch_shape)))
        self.register_buffer(
            "active", torch.tensor([float(a) for a in active], dtype=torch.float64)
        )
        self.batched = len(batch_shape) > 0

    @property
    def constant(self) -> Tensor:
        return self.raw_constant

    def forward(self, x: Tensor) -> Tensor:
        constant = self.raw_constant.unsqueeze(-1) if self.batched else self.raw_constant
        base = constant.expand(x.shape[:-1])
        if self.prior is None or not bool(self.active.any()):
            return base
        prior = self.prior(x)
        if self.batched:
            prior = prior * self.active.to(x.dtype).unsqueeze(-1)
        return base + prior
