"""The GP fit's objective in plain torch: the exact marginal log likelihood of a single-output
GP of ``models/model.py``, without GPyTorch's lazy operators.

A warm-started fit is 25 L-BFGS-B iterations of about 30 likelihood evaluations; through
GPyTorch each evaluation of a 100-point, 16-knob GP cost about 3.4 ms on one core (lazy
kernel tensors, linear operators, validated ``torch.distributions`` priors), the same
arithmetic in plain torch about 1.4 ms. ``loss_closure`` computes that arithmetic:

    loss = -(log N(y | m(X), K(X, X) + s^2 I) + sum of the priors' log densities) / n

with ``K`` the product of the kernels' own ``forward`` on their active dimensions, ``m`` the
mean module's ``forward``, the noise ``s^2`` and every hyperparameter read through its
constraint as GPyTorch reads it, the Cholesky factor from linear_operator's
``psd_safe_cholesky`` (the jitter GPyTorch would add to a nearly singular matrix) and the
priors GPyTorch registers (a log-normal one by its formula, any other by its ``log_prob``). That is
``-ExactMarginalLogLikelihood(...)`` as BoTorch's closure computes it, up to rounding, for
every ``n`` (GPyTorch switches to iterative solves above 800 points; this stays exact).

A study whose trials were measured at different fidelities (a trial EARLY_STOPPED after part
of its windows: ``models/model.py``) gets ``ScaledNoiseLikelihood``: the same one learned
noise level ``s^2``, times a known factor per training row (``s^2 r_i``, ``r_i >= 1``); the
closure then adds ``s^2 diag(r)`` instead of ``s^2 I``.

BoTorch's ``scipy_minimize`` drives it exactly as ``fit_gpytorch_mll_scipy`` does (the same
parameters, bounds, options and status), so only the evaluation changes. Models of another
structure, and batched multi-output GPs (BoTorch fits their outputs independently, with its
batched L-BFGS-B), get None and are fitted by BoTorch's routine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from botorch.models import SingleTaskGP
from botorch.models.utils.gpytorch_modules import get_gaussian_likelihood_with_lognormal_prior
from botorch.optim.core import OptimizationResult, scipy_minimize
from botorch.optim.utils import get_parameters_and_bounds
from gpytorch.kernels import Kernel, ProductKernel, RBFKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, LinearMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.priors import LogNormalPrior, Prior
from linear_operator import LinearOperator
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from tuner.designer.models.kernels import OneHotCategoricalKernel
from tuner.designer.models.means import PriorMean

_LOG_2PI = math.log(2 * math.pi)
_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))
_KERNELS = (RBFKernel, OneHotCategoricalKernel)


class ScaledNoiseLikelihood(GaussianLikelihood):
    """GaussianLikelihood whose noise at the ``n`` training rows is ``s^2 * scale``: one
    learned level ``s^2`` (BoTorch's default prior and bound), a known factor per row.

    GPyTorch applies a likelihood's noise to the training rows only (the marginal
    likelihood, and the prediction caches of an exact GP); a posterior asked for with
    observation noise at other points gets ``s^2``, the noise of a full measurement. The
    rows are recognised by their number, ``n``: the models here never ask for observation
    noise at ``n`` new points at once.

    Args:
        scale: ``n`` factors, each at least 1 (1: a full measurement).
        batch_shape: The GP's batch shape (one noise level per output).
    """

    def __init__(self, scale: Tensor, batch_shape: torch.Size) -> None:
        default = get_gaussian_likelihood_with_lognormal_prior(batch_shape)  # its prior, bound
        super().__init__(
            noise_prior=default.noise_covar.noise_prior,
            batch_shape=batch_shape,
            noise_constraint=default.noise_covar.raw_noise_constraint,
        )
        self.scale = scale.detach().reshape(-1)

    def _shaped_noise_covar(
        self, base_shape: torch.Size, *params: Any, **kwargs: Any
    ) -> Tensor | LinearOperator:
        noise = super()._shaped_noise_covar(base_shape, *params, **kwargs)
        if noise.shape[-1] != self.scale.shape[-1]:
            return noise  # not the training rows: full measurements' noise
        return DiagLinearOperator(noise.diagonal(dim1=-2, dim2=-1) * self.scale)


_LIKELIHOODS = (GaussianLikelihood, ScaledNoiseLikelihood)


def fit_plain(mll: ExactMarginalLogLikelihood, maxiter: int) -> OptimizationResult | None:
    """``fit_gpytorch_mll_scipy(mll, options={"maxiter": maxiter})`` with the plain-torch
    objective; None for a model it does not cover (module doc)."""
    closure = loss_closure(mll)
    if closure is None:
        return None
    parameters, bounds = get_parameters_and_bounds(mll)
    parameters = {name: p for name, p in parameters.items() if p.requires_grad}
    tensors = list(parameters.values())

    def with_grads() -> tuple[Tensor, Sequence[Tensor | None]]:
        loss = closure()
        return loss, torch.autograd.grad(loss, tensors)

    return scipy_minimize(
        closure=with_grads, parameters=parameters, bounds=bounds, options={"maxiter": maxiter}
    )


def loss_closure(mll: ExactMarginalLogLikelihood) -> Callable[[], Tensor] | None:
    """The negative marginal log likelihood per observation of ``mll``'s model at its current
    hyperparameters, as a callable; None for a model of another structure."""
    model: Any = mll.model  # GPyTorch's module attributes are untyped
    if type(mll.model) is not SingleTaskGP or len(model._aug_batch_shape) != 0:
        return None
    if getattr(model, "input_transform", None) is not None:
        return None
    if type(mll) is not ExactMarginalLogLikelihood or mll.likelihood is not model.likelihood:
        return None
    likelihood = model.likelihood
    if type(likelihood) not in _LIKELIHOODS or list(model.added_loss_terms()):
        return None
    mean = model.mean_module
    if type(mean) is not ConstantMean and not _linear(mean) and type(mean) is not PriorMean:
        return None
    factors = _factors(model.covar_module)
    if factors is None:
        return None
    X = model.train_inputs[0]
    y = model.train_targets
    if X.dim() != 2 or y.dim() != 1:
        return None
    inputs = [X if dims is None else X.index_select(-1, dims) for _, dims in factors]
    # the model's priors (the likelihood's among them, once), as GPyTorch's MLL adds them
    priors = [(prior, closure, module) for _, module, prior, closure, _ in model.named_priors()]
    n = y.shape[-1]
    # the noise s^2 times this: I, or a ScaledNoiseLikelihood's diag(r)
    per_row = torch.eye(n, dtype=X.dtype)
    if type(likelihood) is ScaledNoiseLikelihood:
        per_row = torch.diag(likelihood.scale.to(X.dtype))

    def loss() -> Tensor:
        covariance = None
        for (kernel, _), x in zip(factors, inputs, strict=True):
            term = kernel.forward(x, x)
            covariance = term if covariance is None else covariance * term
        assert covariance is not None
        covariance = covariance + likelihood.noise * per_row
        factor = psd_safe_cholesky(covariance)
        residual = (y - mean.forward(X)).unsqueeze(-1)
        whitened = torch.linalg.solve_triangular(factor, residual, upper=False)
        log_det = 2.0 * factor.diagonal().log().sum()
        value = -0.5 * (whitened.square().sum() + log_det + n * _LOG_2PI)
        for prior, closure, module in priors:
            value = value + _log_density(prior, closure(module)).sum()
        return -value / n

    return loss


def _linear(mean: Any) -> bool:
    """A ``LinearMean``, or a subclass that only initializes it otherwise (``models/model.py``)."""
    return isinstance(mean, LinearMean) and type(mean).forward is LinearMean.forward


def _log_density(prior: Prior, value: Tensor) -> Tensor:
    """``prior.log_prob(value)``; a log-normal prior's by its formula (torch's distributions
    validate their arguments at every call, which cost more than the rest of the prior)."""
    if type(prior) is not LogNormalPrior:
        return prior.log_prob(value)
    log_value = value.log()
    loc, scale = prior.loc, prior.scale
    normal = -((log_value - loc) ** 2) / (2 * scale**2) - scale.log() - _LOG_SQRT_2PI
    return normal - log_value


def _factors(kernel: Kernel) -> list[tuple[Kernel, Tensor | None]] | None:
    """The kernels whose product is ``kernel`` with their active dimensions; None for any
    other composition."""
    parts = list(kernel.kernels) if type(kernel) is ProductKernel else [kernel]
    out: list[tuple[Kernel, Tensor | None]] = []
    for part in parts:
        if type(part) not in _KERNELS or (part.active_dims is None and len(parts) > 1):
            return None
        if len(part.batch_shape) != 0:
            return None
        out.append((part, part.active_dims))
    return out
