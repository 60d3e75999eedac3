"""Posterior moments at single candidates of RBF GPs, from arrays computed once per acquisition.

L-BFGS-B maximizes qLogNEI on a box space by evaluating it (and its gradient) at a few
candidates at a time, some 30-40 times a suggestion. Each evaluation needs, per output, the
posterior mean and variance at each candidate ``x`` and its posterior covariances with the
acquisition's baseline ``B`` (``candidate_samples.py``). As GPyTorch's exact prediction
computes them (``shared_rows.model_moments``), with the training inputs ``T``, the prior
mean ``m``, the GP's ``mean_cache`` ``a`` and ``covar_cache`` ``S`` (``S S^T = (K_TT +
s^2 I)^-1``):

    mean(x) = m(x) + k(x, T) a
    var(x)  = k(x, x) - |k(x, T) S|^2
    cov(x, B) = k(x, B) - (k(x, T) S) (k(B, T) S)^T

then un-standardized. Everything that does not depend on ``x`` is computed here once: the
scaled training and baseline rows in the padded layout of GPyTorch's squared distances
(``sq_dist``) and the baseline's ``k(B, T) S``. An evaluation is then some 20 tensor
operations on ``b x (n + n_b)`` numbers, where the general path rebuilds the baseline's rows
and GPyTorch's kernel objects every time (its operations, not its arithmetic, were the cost:
about 1,000 of them forward and backward for some 100 KB of numbers).

``CandidateMoments.samples`` goes on to the candidates' posterior samples (the solve
against the baseline's factor and the product with the base samples that
``candidate_samples.py`` describes) and writes out their gradient: the chain rule through
the steps above, in one autograd node instead of about 40 (on the 16-knob box with 100
trials, 1.6 ms an evaluation forward and backward, of which 0.5 ms arithmetic). The
acquisition's tail (improvement, constraints, reductions) stays autograd's.

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

import torch
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.models.utils.assorted import gpt_posterior_settings
from gpytorch.kernels import RBFKernel
from gpytorch.means import ConstantMean, LinearMean, ZeroMean
from torch import Tensor

from tuner.designer.shared_rows import caches_settings, output_gps, prediction_caches


@dataclass(frozen=True)
class _Output:
    """The fixed arrays of one ``SingleTaskGP`` with ``m`` outputs (its batch when ``m > 1``).

    Shapes below without the leading ``m`` where ``m == 1``."""

    model: SingleTaskGP
    m: int
    n: int  # training rows
    lengthscale: Tensor  # (m x) 1 x d
    centre: Tensor  # (m x) 1 x d: the mean of the scaled training rows
    rows: Tensor  # (m x) (d + 2) x (n + n_b): scaled, centred, padded training and baseline rows
    mean_cache: Tensor  # (m x) n x 1
    covar_cache: Tensor  # (m x) n x r
    baseline_root: Tensor  # (m x) r x n_b: (k(B, T) S)^T
    offset: Tensor | None  # m x 1: Standardize's means
    scale: Tensor | None  # m x 1: Standardize's standard deviations
    prior_constant: Tensor  # (m x) 1: the prior mean's constant (a linear mean's bias)
    prior_slopes: Tensor | None  # (m x) d x 1: a linear prior mean's weights, or None

    def __call__(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``m x b`` means and variances and ``m x b x n_b`` covariances with the baseline."""
        mean, variance, covariance, _ = self.forward(x)
        return mean, variance, covariance

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, ...]]:
        """``__call__``'s moments, and what ``backward`` needs of the computation."""
        rows = x.expand(self.m, *x.shape) if self.m > 1 else x
        centred = rows / self.lengthscale - self.centre
        norms = centred.pow(2).sum(dim=-1, keepdim=True)
        padded = torch.cat([-2.0 * centred, norms, torch.ones_like(norms)], dim=-1)
        # GPyTorch's RBF: exp(-|x - y|^2 / 2) on the scaled rows, distances clamped at 0
        distances = padded @ self.rows
        prior = distances.clamp_min(0).div(-2).exp()
        cross, with_baseline = prior[..., : self.n], prior[..., self.n :]
        prior_mean = self.prior_constant
        if self.prior_slopes is not None:  # GPyTorch's LinearMean: x @ w + c
            prior_mean = (rows @ self.prior_slopes).squeeze(-1) + prior_mean
        mean = prior_mean + (cross @ self.mean_cache).squeeze(-1)
        root = cross @ self.covar_cache
        variance = 1.0 - root.pow(2).sum(dim=-1)  # k(x, x) = 1
        covariance = with_baseline - root @ self.baseline_root
        if self.m == 1:
            mean, variance, covariance = mean[None], variance[None], covariance[None]
        if self.offset is not None and self.scale is not None:
            mean = self.offset + self.scale * mean
            squared = self.scale.square()
            variance = variance * squared
            covariance = covariance * squared.unsqueeze(-1)
        return mean, variance, covariance, (centred, distances, prior, root)

    def backward(
        self, saved: tuple[Tensor, ...], d_mean: Tensor, d_variance: Tensor, d_covariance: Tensor
    ) -> Tensor:
        """The gradient at the ``b x d`` candidates from those of ``forward``'s moments
        (``m x b``, ``m x b``, ``m x b x n_b``): the chain rule through each step above."""
        centred, distances, prior, root = saved
        if self.offset is not None and self.scale is not None:
            squared = self.scale.square()
            d_mean, d_variance = d_mean * self.scale, d_variance * squared
            d_covariance = d_covariance * squared.unsqueeze(-1)
        if self.m == 1:
            d_mean, d_variance, d_covariance = d_mean[0], d_variance[0], d_covariance[0]
        d_root = -2.0 * d_variance.unsqueeze(-1) * root - d_covariance @ self.baseline_root.mT
        d_cross = d_mean.unsqueeze(-1) * self.mean_cache.mT + d_root @ self.covar_cache.mT
        d_prior = torch.cat([d_cross, d_covariance], dim=-1)
        # exp(-D / 2) of D clamped at 0 (whose gradient passes where D >= 0, as torch's)
        d_distances = torch.where(distances >= 0, -0.5 * prior * d_prior, 0.0)
        d_padded = d_distances @ self.rows.mT
        d = centred.shape[-1]
        d_centred = -2.0 * d_padded[..., :d] + 2.0 * centred * d_padded[..., d : d + 1]
        d_x = d_centred / self.lengthscale
        if self.prior_slopes is not None:
            d_x = d_x + d_mean.unsqueeze(-1) * self.prior_slopes.mT
        return d_x.sum(dim=0) if self.m > 1 else d_x


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
        variances and ``M x b x n_b`` covariances with the baseline, in outcome units."""
        mean, variance, covariance, _ = self.forward(x)
        return mean, variance, covariance

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, list[tuple[Tensor, ...]]]:
        """``__call__``'s moments, and what each output's ``backward`` needs."""
        parts = [output.forward(x) for output in self.outputs]
        saved = [part[3] for part in parts]
        if len(parts) == 1:
            return parts[0][0], parts[0][1], parts[0][2], saved
        mean = torch.cat([part[0] for part in parts])
        variance = torch.cat([part[1] for part in parts])
        covariance = torch.cat([part[2] for part in parts])
        return mean, variance, covariance, saved

    def samples(self, x: Tensor, factor: Tensor, base: Tensor) -> Tensor:
        """``M x b x S`` posterior samples at the ``b x d`` candidates ``x``, jointly with the
        baseline (``candidate_samples.py``): with ``factor`` (``M x n_b x n_b``) the lower
        Cholesky factor of the baseline's posterior covariance per output and ``base``
        (``M x (n_b + 1) x S``) the sampler's base samples, ``mean + [B F^-T, sqrt(C - |B
        F^-T|^2)] base``. The gradient is computed by hand (``_Samples``); NaN where a
        conditional variance is not positive (the caller then takes the general path)."""
        return _Samples.apply(x, self, factor, base)


class _Samples(torch.autograd.Function):
    """``CandidateMoments.samples`` with its gradient written out: autograd through the
    same steps records some 40 nodes, and on small inputs each costs more than its
    arithmetic (1.6 ms forward and backward against 0.5 ms without a graph, measured on
    the 16-knob box with 100 trials)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: Tensor, moments: CandidateMoments, factor: Tensor, base: Tensor
    ) -> Tensor:
        mean, variance, covariance, saved = moments.forward(x)
        left = torch.linalg.solve_triangular(factor, covariance.mT, upper=False).mT
        conditional = variance - left.pow(2).sum(dim=-1)
        # NaN where not positive, where a Cholesky factorization fails (at 0 the gradient
        # would be infinite)
        right = conditional.sqrt().masked_fill(conditional <= 0, torch.nan)
        root = torch.cat([left, right.unsqueeze(-1)], dim=-1)
        ctx.moments, ctx.factor, ctx.base = moments, factor, base
        ctx.saved = saved
        ctx.left, ctx.right = left, right
        return root @ base + mean.unsqueeze(-1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        nb = ctx.left.shape[-1]
        d_mean = grad.sum(dim=-1)
        d_root = grad @ ctx.base.mT
        d_conditional = d_root[..., nb] / (2.0 * ctx.right)
        d_left = d_root[..., :nb] - 2.0 * d_conditional.unsqueeze(-1) * ctx.left
        d_covariance = torch.linalg.solve_triangular(ctx.factor.mT, d_left.mT, upper=True).mT
        grads, start = [], 0
        for output, saved in zip(ctx.moments.outputs, ctx.saved, strict=True):
            end = start + output.m
            grads.append(
                output.backward(
                    saved, d_mean[start:end], d_conditional[start:end], d_covariance[start:end]
                )
            )
            start = end
        d_x = grads[0]
        for more in grads[1:]:
            d_x = d_x + more
        return d_x, None, None, None


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
            lengthscale=lengthscale,
            centre=centre,
            rows=padded,
            mean_cache=strategy.mean_cache.unsqueeze(-1),
            covar_cache=covar_cache,
            baseline_root=(baseline_cross @ covar_cache).transpose(-1, -2),
            offset=offset,
            scale=scale,
            prior_constant=constant,
            prior_slopes=slopes,
        )
