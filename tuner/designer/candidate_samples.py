"""qLogNEI's posterior samples at the candidates, computed from the GP's prediction caches.

Every evaluation of qLogNEI (BoTorch's ``qLogNoisyExpectedImprovement``, with BoTorch's
cached baseline Cholesky factor) draws its Monte Carlo samples at the candidate from the
joint posterior over ``[X_baseline, x]`` (pending points are part of the baseline: the
acquisition is BoTorch's incremental one). BoTorch builds a GPyTorch posterior over all
``n_b + 1`` rows, reads its bottom row,
solves them against the cached baseline factor ``L_b`` and factors the rest
(``botorch.utils.low_rank.sample_cached_cholesky``):

    B = K(x, baseline),  C = K(x, x)   (posterior covariances)
    L_x = B L_b^-T,   L_xx = chol(C - L_x L_x^T),   samples = mean(x) + [L_x, L_xx] z

with ``z`` the sampler's fixed quasi-random normals. On a 16-knob box with 100 trials one
such evaluation (forward and gradient, four L-BFGS-B restarts as one batch) cost about
6 ms on one core, most of it the construction and indexing of GPyTorch's distribution and
lazy-operator objects and the gradient through them, not arithmetic: about 1,500 torch
operations for some 100 KB of numbers.

``LogNEI`` computes the same arithmetic without those objects: the means and covariances
come from ``shared_rows.model_moments`` (the GP's ``mean_cache`` and ``covar_cache``, the
same kernel values and caches GPyTorch's prediction uses), the blocks above from them, and
the solve, the Cholesky factor (``psd_safe_cholesky`` with BoTorch's ``max_tries``) and the
product with the sampler's base samples (reshaped by BoTorch's own function, once per
sampler state) as BoTorch computes them. The rest of the acquisition (the incumbent per
sample, the smoothed improvement, the constraint indicators, the reductions) is BoTorch's
code, unchanged. Values and gradients equal BoTorch's to rounding (the tests check 1e-9),
so this is not a change of policy.

The path is taken only where that holds, and BoTorch's is taken otherwise: BoTorch's
baseline factor is cached (``cache_root``), no posterior transform, inputs ``b x 1 x d``
(one candidate per batch: L-BFGS-B's restarts, the local search's candidates), the sampler
already set up for ``q = 1`` (BoTorch's first call at a ``q`` does that), a model
``model_moments`` covers, a candidate's conditional covariance that factors (one that does
not, with a candidate on top of a baseline point, is where BoTorch's low-rank update fails
too: its path warns and samples the plain way), and finite samples (BoTorch's path then
raises, warns and falls back as before).
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.acquisition.logei import qLogNoisyExpectedImprovement
from botorch.models import SingleTaskGP
from botorch.utils.low_rank import _reshape_base_samples
from linear_operator.utils.cholesky import psd_safe_cholesky
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor

from tuner.designer.shared_rows import SharedRowsModel, batched_posterior, model_moments

# BoTorch's sample_cached_cholesky default: Cholesky tries with growing jitter
_MAX_TRIES = 6


class LogNEI(qLogNoisyExpectedImprovement):
    """qLogNEI whose samples at the candidates are computed directly (module doc)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # the sampler's base samples, and them reshaped as BoTorch's sampling reshapes them
        self._reshaped: tuple[Tensor, Tensor] | None = None

    def _get_samples_and_objectives(self, X: Tensor) -> tuple[Tensor, Tensor]:
        samples = candidate_samples(self, X)
        if samples is None:
            return super()._get_samples_and_objectives(X)
        return samples, self.objective(samples, X=X)


def candidate_samples(acquisition: LogNEI, X: Tensor) -> Tensor | None:
    """``sample_shape x b x 1 x m`` posterior samples at ``X`` (``b x 1 x d``), as BoTorch's
    cached-Cholesky sampling draws them; None where the direct path does not apply (module
    doc)."""
    if not acquisition._cache_root or not hasattr(acquisition, "_baseline_L"):
        return None
    if acquisition.posterior_transform is not None or X.dim() != 3:
        return None
    b, q, _ = X.shape
    baseline = acquisition.X_baseline
    if baseline.dim() != 2 or q != 1 or acquisition.X_pending is not None:
        return None
    if acquisition.q_in != 1:
        return None
    model = acquisition.model
    if isinstance(model, SharedRowsModel):
        model = model.model
    nb = baseline.shape[-2]
    moments = model_moments(model, torch.cat([baseline, X[:, 0, :]]), nb)
    if moments is None:
        return None
    mean, variances, columns = moments  # u x m, m x b, m x u x nb
    m = mean.shape[-1]
    # the bottom row of the joint covariance over [baseline, candidate], per batch
    bottom = torch.cat([columns[:, nb:, :], variances.unsqueeze(-1)], dim=-1)
    bottom = bottom.unsqueeze(-2).transpose(0, 1)  # b x m x 1 x (nb + 1), BoTorch's layout
    new_mean = mean[nb:].unsqueeze(-2)  # b x 1 x m
    if m == 1 and type(model) is SingleTaskGP:
        bottom = bottom.squeeze(1)  # one output: b x 1 x (nb + 1)
    left, right = bottom.split([nb, 1], dim=-1)
    left_root = torch.linalg.solve_triangular(
        acquisition._baseline_L, left.transpose(-2, -1), upper=False
    ).transpose(-2, -1)
    try:
        right_root = psd_safe_cholesky(
            right - left_root @ left_root.transpose(-2, -1), max_tries=_MAX_TRIES
        )
    except (NanError, NotPSDError):
        return None  # as BoTorch's path: it warns and samples the plain way
    rows_root = torch.cat([left_root, right_root], dim=-1)
    if rows_root.dim() == 3:
        rows_root = rows_root.unsqueeze(-3)  # b x 1 x 1 x (nb + 1)
    base = _base_samples(acquisition, m, type(model) is SingleTaskGP, X.dtype)
    samples = (
        rows_root.matmul(base.expand(b, *base.shape[1:]))
        .add(new_mean.transpose(-1, -2).unsqueeze(-1))
        .permute(-1, 0, -2, -3)
    )
    if not torch.isfinite(samples).all():
        return None  # BoTorch's path raises NanError, warns and samples the plain way
    return samples.contiguous()


def _base_samples(acquisition: LogNEI, m: int, single: bool, dtype: torch.dtype) -> Tensor:
    """The sampler's base samples, ``1 x m x (nb + 1) x samples``, reshaped by BoTorch's
    ``_reshape_base_samples`` for a posterior of the structure BoTorch's path sees (one
    batch: the values do not depend on the batch); computed once per sampler state."""
    sampler = acquisition.sampler
    assert sampler is not None  # BoTorch set it up for q = 1
    base: Tensor = sampler.base_samples  # type: ignore[assignment]  # a registered buffer
    cached = acquisition._reshaped
    if cached is not None and cached[0] is base:
        return cached[1]
    rows = acquisition.X_baseline.shape[-2] + 1
    eye = torch.eye(rows, dtype=dtype)
    if m == 1 and single:
        posterior = batched_posterior(torch.zeros(1, rows, dtype=dtype), eye.unsqueeze(0))
    else:
        mean = torch.zeros(1, rows, m, dtype=dtype)
        posterior = batched_posterior(mean, eye.expand(1, m, rows, rows))
    reshaped = _reshape_base_samples(
        base_samples=base, sample_shape=sampler.sample_shape, posterior=posterior
    )
    acquisition._reshaped = (base, reshaped)
    return reshaped
