"""``OneHotCategoricalKernel`` computes BoTorch's ``CategoricalKernel`` (to 1e-12 relative).

Both kernels get the same lengthscales; they are compared on points at the levels (the
one-hot product), with a point off the levels (BoTorch's computation), in diag mode, with a
batch of lengthscales (a batched multi-output GP) and with batched inputs (an acquisition
batch).
"""

from __future__ import annotations

import pytest
import torch
from botorch.models.kernels.categorical import CategoricalKernel

from tuner.designer.models.kernels import OneHotCategoricalKernel

LEVELS = [[0.0, 0.5, 1.0], [0.0, 1.0], [0.125, 0.375, 0.625, 0.875], [0.0, 1.0 / 3, 2.0 / 3, 1.0]]
TOLERANCE = 1e-12
UNBATCHED = torch.Size()


def _pair(batch_shape: torch.Size = UNBATCHED) -> tuple[CategoricalKernel, CategoricalKernel]:
    c = len(LEVELS)
    reference = CategoricalKernel(batch_shape=batch_shape, ard_num_dims=c).double()
    onehot = OneHotCategoricalKernel(LEVELS, batch_shape=batch_shape, ard_num_dims=c).double()
    generator = torch.Generator().manual_seed(0)
    lengthscale = 0.05 + 5 * torch.rand(*batch_shape, 1, c, generator=generator).double()
    reference.lengthscale = lengthscale
    onehot.lengthscale = lengthscale
    return reference, onehot


def _points(*shape: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    columns = []
    for levels in LEVELS:
        index = torch.randint(len(levels), shape, generator=generator)
        columns.append(torch.tensor(levels, dtype=torch.float64)[index])
    return torch.stack(columns, dim=-1)


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return got.shape == expected.shape and bool(
        ((got - expected).abs() <= TOLERANCE * expected.abs()).all()
    )


@pytest.mark.parametrize("batch_shape", [torch.Size(), torch.Size([2])])
def test_matches_botorch_on_levels(batch_shape: torch.Size) -> None:
    reference, onehot = _pair(batch_shape)
    x1, x2 = _points(30), _points(20, seed=2)
    with torch.no_grad():
        assert onehot._one_hot(x1) is not None  # the one-hot product is what is compared
        for a, b in ((x1, x2), (x1, x1)):
            assert _close(onehot.forward(a, b), reference.forward(a, b))
            assert _close(onehot(a, b).to_dense(), reference(a, b).to_dense())


def test_matches_botorch_on_batched_inputs() -> None:
    """Batched beyond the kernel's batch shape: BoTorch's computation (module doc)."""
    reference, onehot = _pair()
    x1, x2 = _points(8, 5), _points(8, 12, seed=3)
    with torch.no_grad():
        assert _close(onehot.forward(x1, x2), reference.forward(x1, x2))


def test_a_point_off_the_levels_uses_botorch() -> None:
    reference, onehot = _pair()
    x1, x2 = _points(10), _points(7, seed=2)
    x1[3, 2] = 0.5  # between two levels of the third dimension
    with torch.no_grad():
        assert onehot._one_hot(x1) is None
        assert _close(onehot.forward(x1, x2), reference.forward(x1, x2))
        assert _close(onehot.forward(x2, x1), reference.forward(x2, x1))


@pytest.mark.parametrize("batch_shape", [torch.Size(), torch.Size([2])])
def test_diag_mode_matches_botorch(batch_shape: torch.Size) -> None:
    reference, onehot = _pair(batch_shape)
    x1, x2 = _points(15), _points(15, seed=2)
    x2[4, 0] = 0.25  # off the levels
    with torch.no_grad():
        for a, b in ((x1, x2), (x1, x1)):
            expected = reference.forward(a, b, diag=True)
            assert _close(onehot.forward(a, b, diag=True), expected)
            assert _close(onehot(a, b, diag=True), reference(a, b, diag=True))


def test_lengthscale_gradients_match_botorch() -> None:
    reference, onehot = _pair()
    x1, x2 = _points(12), _points(9, seed=2)
    for kernel in (reference, onehot):
        kernel.zero_grad()
        kernel.forward(x1, x2).sum().backward()
    grad_ref = reference.raw_lengthscale.grad
    grad = onehot.raw_lengthscale.grad
    assert grad is not None and grad_ref is not None
    assert torch.allclose(grad, grad_ref, rtol=1e-10, atol=0.0)
