"""Posterior moments at single candidates of RBF GPs, from arrays computed once per acquisition.

L-BFGS-B maximizes qLogNEI on a box space by evaluating it (and its gradient) at a few
candidates at a time, some 30-40 times a suggestion. Each evaluation needs, per output, the
posterior mean and variance at each candidate ``x`` and its posterior covariances with the
acquisition's baseline ``B`` (``fast/candidate_samples.py``). As GPyTorch's exact prediction
computes them (``shared_rows.model_moments``), with the training inputs ``T``, the prior
mean ``m``, the GP's ``mean_cache`` ``a`` and ``covar_cache`` ``S`` (``S S^T = (K_TT +
s^2 I)^-1``):

    mean(x) = m(x) + k(x, T) a
    var(x)  = k(x, x) - |k(x, T) S|^2
    cov(x, B) = k(x, B) - (k(x, T) S) (k(B, T) S)^T

then un-standardized. Everything that does not depend on ``x`` is computed here once: the
scaled training and baseline rows in the padded layout of GPyTorch's squared distances
(``sq_dist``) and the baseline's ``k(B, T) S``. An evaluation is then some 20 array
operations on ``b x (n + n_b)`` numbers, where the general path rebuilds the baseline's rows
and GPyTorch's kernel objects every time (its operations, not its arithmetic, were the cost:
about 1,000 of them forward and backward for some 100 KB of numbers).

``CandidateMoments.samples`` goes on to the candidates' posterior samples (the solve
against the baseline's factor and the product with the base samples that
``fast/candidate_samples.py`` describes), and ``backward`` and ``samples_backward`` write out
their gradient: the chain rule through the steps above. It is all NumPy: on arrays this
small an operation's cost is its call, and a NumPy call costs a fraction of a torch one
(with autograd's graph, some 40 nodes forward and backward). ``candidate_samples.direct_values``
goes on with ``sample_terms.LogNEITerms``, also in NumPy, and hands autograd one node;
``CandidateMoments.__call__`` gives the moments as tensors with their gradient (``_Moments``)
to the general path.

The arithmetic is GPyTorch's with one difference in rounding: ``sq_dist`` centres both sets
of rows on the mean of its first argument before the quadratic expansion; here they are
centred on the mean of the scaled training inputs, which does not depend on the candidates.
The values and gradients agree with the general path's and BoTorch's to rounding (the tests
check 1e-9, relative).

Covered: a ``SingleTaskGP`` (one output, or several as its batch) or a ``ModelListGP`` of
single-output ones, each with exactly GPyTorch's ``RBFKernel`` over all inputs (BoTorch's
default kernel for box spaces; not scaled), a constant, zero or linear prior mean, a
``Standardize`` outcome transform or none, no input transform, in eval mode with its
prediction caches; ``build`` gives None for anything else (categorical knobs, a Matern or
product kernel), and the general path answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.models.utils.assorted import gpt_posterior_settings
from gpytorch.kernels import RBFKernel
from gpytorch.means import ConstantMean, LinearMean, ZeroMean
from scipy.linalg.lapack import get_lapack_funcs
from torch import Tensor

from tuner.designer.fast.shared_rows import caches_settings, output_gps, prediction_caches


@dataclass(frozen=True)
class _Output:
    """The fixed arrays of one ``SingleTaskGP`` with ``m`` outputs (its batch when ``m > 1``),
    as NumPy arrays (module doc: on these sizes a NumPy operation costs a fraction of a
    torch one).

    Shapes below without the leading ``m`` where ``m == 1``."""

    model: SingleTaskGP
    m: int
    n: int  # training rows
    lengthscale: np.ndarray  # (m x) 1 x d
    centre: np.ndarray  # (m x) 1 x d: the mean of the scaled training rows
    # (m x) (d + 2) x (n + n_b): the scaled, centred, padded training and baseline rows
    rows: np.ndarray
    mean_cache: np.ndarray  # (m x) n x 1
    covar_cache: np.ndarray  # (m x) n x r
    baseline_root: np.ndarray  # (m x) r x n_b: (k(B, T) S)^T
    offset: np.ndarray | None  # m x 1: Standardize's means
    scale: np.ndarray | None  # m x 1: Standardize's standard deviations
    prior_constant: np.ndarray  # (m x) 1: the prior mean's constant (a linear mean's bias)
    prior_slopes: np.ndarray | None  # (m x) d x 1: a linear prior mean's weights, or None

    def forward(
        self, x: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
        """At the ``b x d`` candidates: ``m x b`` means and variances and ``m x b x n_b``
        covariances with the baseline, and what ``backward`` needs of the computation."""
        centred = x / self.lengthscale - self.centre  # (m x) b x d
        norms = np.einsum("...i,...i->...", centred, centred)[..., None]
        padded = np.concatenate([-2.0 * centred, norms, np.ones_like(norms)], axis=-1)
        # GPyTorch's RBF: exp(-|x - y|^2 / 2) on the scaled rows, distances clamped at 0
        distances = padded @ self.rows
        prior = np.exp(np.maximum(distances, 0.0) * -0.5)
        cross, with_baseline = prior[..., : self.n], prior[..., self.n :]
        mean = (cross @ self.mean_cache)[..., 0] + self.prior_constant
        if self.prior_slopes is not None:  # GPyTorch's LinearMean: x @ w + c
            mean = mean + (x @ self.prior_slopes)[..., 0]
        root = cross @ self.covar_cache
        variance = 1.0 - np.einsum("...i,...i->...", root, root)  # k(x, x) = 1
        covariance = with_baseline - root @ self.baseline_root
        if self.m == 1:
            mean, variance, covariance = mean[None], variance[None], covariance[None]
        if self.offset is not None and self.scale is not None:
            mean = self.offset + self.scale * mean
            squared = self.scale * self.scale
            variance = variance * squared
            covariance = covariance * squared[..., None]
        return mean, variance, covariance, (centred, distances, prior, root)

    def backward(
        self,
        saved: tuple[np.ndarray, ...],
        d_mean: np.ndarray,
        d_variance: np.ndarray,
        d_covariance: np.ndarray,
    ) -> np.ndarray:
        """The ``b x d`` gradient at the candidates from those of ``forward``'s moments
        (``m x b``, ``m x b``, ``m x b x n_b``): the chain rule through each step above."""
        centred, distances, prior, root = saved
        if self.offset is not None and self.scale is not None:
            squared = self.scale * self.scale
            d_mean, d_variance = d_mean * self.scale, d_variance * squared
            d_covariance = d_covariance * squared[..., None]
        if self.m == 1:
            d_mean, d_variance, d_covariance = d_mean[0], d_variance[0], d_covariance[0]
        d_root = -2.0 * d_variance[..., None] * root - d_covariance @ _t(self.baseline_root)
        d_cross = d_mean[..., None] * _t(self.mean_cache)
        d_cross = d_cross + d_root @ _t(self.covar_cache)
        d_prior = np.concatenate([d_cross, d_covariance], axis=-1)
        # exp(-D / 2) of D clamped at 0 (whose gradient passes where D >= 0, as torch's)
        d_distances = np.where(distances >= 0, -0.5 * prior * d_prior, 0.0)
        d_padded = d_distances @ _t(self.rows)
        d = centred.shape[-1]
        d_centred = -2.0 * d_padded[..., :d] + 2.0 * centred * d_padded[..., d : d + 1]
        d_x = d_centred / self.lengthscale
        if self.prior_slopes is not None:
            d_x = d_x + d_mean[..., None] * _t(self.prior_slopes)
        return d_x.sum(axis=0) if self.m > 1 else d_x


class CandidateMoments:
    """The posterior moments of ``model``'s outputs at single candidates, jointly with the
    rows of ``baseline`` (module doc); ``build`` makes one or gives None."""

    def __init__(self, outputs: list[_Output]) -> None:
        self.outputs = outputs

    @classmethod
    def build(cls, model: Model, baseline: Tensor) -> CandidateMoments | None:
        gps = output_gps(model)
        if gps is None or not caches_settings() or baseline.dim() != 2:
            return None
        outputs = []
        for gp in gps:
            output = _output(gp, baseline)
            if output is None:
                return None
            outputs.append(output)
        return cls(outputs)

    def __call__(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """At the ``b x d`` candidates ``x``, for the ``M`` outputs: ``M x b`` means and
        variances and ``M x b x n_b`` covariances with the baseline, in outcome units (with
        their gradient, ``_Moments``)."""
        mean, variance, covariance = _Moments.apply(x, self)
        return mean, variance, covariance

    def forward(
        self, x: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[np.ndarray, ...]]]:
        """``__call__``'s moments in NumPy, and what each output's ``backward`` needs."""
        parts = [output.forward(x) for output in self.outputs]
        saved = [part[3] for part in parts]
        if len(parts) == 1:
            return parts[0][0], parts[0][1], parts[0][2], saved
        mean = np.concatenate([part[0] for part in parts])
        variance = np.concatenate([part[1] for part in parts])
        covariance = np.concatenate([part[2] for part in parts])
        return mean, variance, covariance, saved

    def backward(
        self,
        saved: list[tuple[np.ndarray, ...]],
        d_mean: np.ndarray,
        d_variance: np.ndarray,
        d_covariance: np.ndarray,
    ) -> np.ndarray:
        """The ``b x d`` gradient at the candidates from those of the ``M`` outputs'
        moments: the sum over the outputs of each one's ``backward``."""
        d_x, start = None, 0
        for output, part in zip(self.outputs, saved, strict=True):
            end = start + output.m
            grad = output.backward(
                part, d_mean[start:end], d_variance[start:end], d_covariance[start:end]
            )
            d_x = grad if d_x is None else d_x + grad
            start = end
        assert d_x is not None  # at least one output
        return d_x

    def samples(
        self, x: np.ndarray, factor: np.ndarray, base: np.ndarray
    ) -> tuple[np.ndarray, _SampleState]:
        """``M x b x S`` posterior samples at the ``b x d`` candidates ``x``, jointly with the
        baseline (``fast/candidate_samples.py``): with ``factor`` (``M x n_b x n_b``) the lower
        Cholesky factor of the baseline's posterior covariance per output and ``base``
        (``M x (n_b + 1) x S``) the sampler's base samples, ``mean + [B F^-T, sqrt(C - |B
        F^-T|^2)] base``; NaN where a conditional variance is not positive (the caller then
        takes the general path, which factors it with jitter). And what
        ``samples_backward`` needs."""
        mean, variance, covariance, saved = self.forward(x)
        left = _t(_solve(factor, _t(covariance), lower=True))  # M x b x n_b
        conditional = variance - np.einsum("...i,...i->...", left, left)
        # NaN where not positive, where a Cholesky factorization fails (at 0 the gradient
        # would be infinite)
        positive = conditional > 0
        right = np.where(positive, np.sqrt(np.where(positive, conditional, 1.0)), np.nan)
        root = np.concatenate([left, right[..., None]], axis=-1)
        state = _SampleState(saved, factor, base, left, right)
        return root @ base + mean[..., None], state

    def samples_backward(self, state: _SampleState, d_samples: np.ndarray) -> np.ndarray:
        """The ``b x d`` gradient at the candidates from that of ``samples``' samples: the
        chain rule through the steps above, then ``backward``."""
        nb = state.left.shape[-1]
        d_mean = d_samples.sum(axis=-1)
        d_root = d_samples @ _t(state.base)
        d_conditional = d_root[..., nb] / (2.0 * state.right)
        d_left = d_root[..., :nb] - 2.0 * d_conditional[..., None] * state.left
        d_covariance = _t(_solve(_t(state.factor), _t(d_left), lower=False))
        return self.backward(state.saved, d_mean, d_conditional, d_covariance)


@dataclass(frozen=True)
class _SampleState:
    """What ``CandidateMoments.samples_backward`` needs of a ``samples`` call."""

    saved: list[tuple[np.ndarray, ...]]
    factor: np.ndarray
    base: np.ndarray
    left: np.ndarray
    right: np.ndarray


class _Moments(torch.autograd.Function):
    """``CandidateMoments.__call__``: the moments from NumPy, their gradient by hand."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: Tensor, moments: CandidateMoments
    ) -> tuple[Tensor, Tensor, Tensor]:
        mean, variance, covariance, saved = moments.forward(x.detach().numpy())
        ctx.moments, ctx.saved = moments, saved
        return torch.from_numpy(mean), torch.from_numpy(variance), torch.from_numpy(covariance)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, d_mean: Tensor, d_variance: Tensor, d_covariance: Tensor
    ) -> tuple[Tensor, None]:
        d_x = ctx.moments.backward(
            ctx.saved, d_mean.numpy(), d_variance.numpy(), d_covariance.numpy()
        )
        return torch.from_numpy(d_x), None


def _t(a: np.ndarray) -> np.ndarray:
    """The transpose of the last two axes."""
    return np.swapaxes(a, -1, -2)


def _solve(factor: np.ndarray, rhs: np.ndarray, lower: bool) -> np.ndarray:
    """``factor^-1 rhs`` for ``M`` triangular ``factor``s (``M x k x k``, ``M x k x c``), by
    LAPACK's ``trtrs`` (SciPy's ``solve_triangular`` around it costs ten times as much
    here); NaN where a factor is singular."""
    trtrs = get_lapack_funcs("trtrs", (factor, rhs))
    solved = []
    for f, r in zip(factor, rhs, strict=True):
        x, info = trtrs(f, r, lower=int(lower))
        solved.append(x if info == 0 else np.full_like(r, np.nan))
    return np.stack(solved)


def _output(model: SingleTaskGP, baseline: Tensor) -> _Output | None:
    kernel: Any = model.covar_module
    if type(kernel) is not RBFKernel or kernel.active_dims is not None:
        return None
    mean_module = model.mean_module
    if not isinstance(mean_module, (ConstantMean, ZeroMean, LinearMean)):
        return None
    strategy = prediction_caches(model)
    if strategy is None:
        return None
    transform = getattr(model, "outcome_transform", None)
    m = model.num_outputs
    with torch.no_grad(), gpt_posterior_settings():
        train = model.train_inputs[0]
        base = baseline.expand(m, *baseline.shape) if m > 1 else baseline
        lengthscale = kernel.lengthscale.detach()
        scaled_train, scaled_base = train / lengthscale, base / lengthscale
        centre = scaled_train.mean(dim=-2, keepdim=True)
        rows = torch.cat([scaled_train, scaled_base], dim=-2) - centre
        norms = rows.pow(2).sum(dim=-1, keepdim=True)
        padded = torch.cat([rows, torch.ones_like(norms), norms], dim=-1).transpose(-1, -2)
        covar_cache = strategy.covar_cache
        baseline_cross = kernel(base, train).to_dense()
        slopes = None
        if isinstance(mean_module, LinearMean):
            slopes = mean_module.weights.detach()
            bias = mean_module.bias
            constant = bias.detach() if bias is not None else torch.zeros(1, dtype=train.dtype)
        elif isinstance(mean_module, ConstantMean):
            constant = mean_module.constant.detach().unsqueeze(-1)
        else:
            constant = torch.zeros(1, dtype=train.dtype)
        offset = scale = None
        if transform is not None:
            offset, scale = transform.means.reshape(m, 1), transform.stdvs.reshape(m, 1)
        return _Output(
            model=model,
            m=m,
            n=train.shape[-2],
            lengthscale=_array(lengthscale),
            centre=_array(centre),
            rows=_array(padded),
            mean_cache=_array(strategy.mean_cache.unsqueeze(-1)),
            covar_cache=_array(covar_cache),
            baseline_root=_array((baseline_cross @ covar_cache).transpose(-1, -2)),
            offset=None if offset is None else _array(offset),
            scale=None if scale is None else _array(scale),
            prior_constant=_array(constant),
            prior_slopes=None if slopes is None else _array(slopes),
        )


def _array(tensor: Tensor) -> np.ndarray:
    """A contiguous NumPy copy of ``tensor``, detached from any graph."""
    return np.ascontiguousarray(tensor.detach().numpy())
