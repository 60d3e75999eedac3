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

``LogNEI`` computes the same arithmetic without those objects, on one of two paths:

* ``direct_values`` (box spaces: RBF kernels): everything in NumPy, as one autograd node
  whose gradient is written out. The samples from ``rbf_moments`` (which computes the
  baseline's share once per acquisition), the rest from ``sample_terms.LogNEITerms`` (the
  smoothed improvement over the incumbent, the constraint indicators, the mean over the
  samples).
* ``candidate_samples`` (elsewhere, and where the first path does not apply): the means and
  covariances from the GP's ``mean_cache`` and ``covar_cache`` (the same kernel values and
  caches GPyTorch's prediction uses; ``shared_rows.model_moments``, or ``rbf_moments``' with
  their gradient), then the solve, the Cholesky factor (``psd_safe_cholesky`` with BoTorch's
  ``max_tries``) and the product with the sampler's base samples (reshaped by BoTorch's own
  function, once per sampler state) as BoTorch computes them. The rest of the acquisition
  (the incumbent per sample, the smoothed improvement, the constraint indicators) is
  BoTorch's code, unchanged; of its two reductions, ``forward`` writes out the arithmetic
  for one candidate: the fat maximum over one value is that value, and the mean over the
  samples is BoTorch's ``logmeanexp`` without its handling of infinities (values with an
  infinity are reduced by BoTorch's own).

Values and gradients equal BoTorch's to rounding (the tests check 1e-9), so this is not a
change of policy. On the 16-knob box with 100 trials an evaluation with its gradient went
from about 6.9 ms to 2.3 ms, to about 1.4 ms with ``rbf_moments`` in torch, and to about
0.3 ms all in NumPy (``bench/NOTES.md``).

The path is taken only where that holds, and BoTorch's is taken otherwise: BoTorch's
baseline factor is cached (``cache_root``), no posterior transform, inputs ``b x 1 x d``
(one candidate per batch: L-BFGS-B's restarts, the local search's candidates), the sampler
already set up for ``q = 1`` (BoTorch's first call at a ``q`` does that), a model
``model_moments`` covers, BoTorch's default reductions, a candidate's conditional
covariance that factors (one that does not, with a candidate on top of a baseline point,
is where BoTorch's low-rank update fails too: its path warns and samples the plain way),
and finite samples (BoTorch's path then raises, warns and falls back as before).
``direct_values`` also needs ``rbf_moments`` and ``sample_terms`` to cover the model and
the objective and constraints, positive conditional variances and finite values; where one
fails, ``candidate_samples`` answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from botorch.acquisition.logei import qLogNoisyExpectedImprovement
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.utils.low_rank import _reshape_base_samples
from botorch.utils.safe_math import fatmax, logmeanexp
from linear_operator.utils.cholesky import psd_safe_cholesky
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor

from tuner.designer.fast.rbf_moments import CandidateMoments
from tuner.designer.fast.sample_terms import LogNEITerms
from tuner.designer.fast.shared_rows import SharedRowsModel, batched_posterior, model_moments

# BoTorch's sample_cached_cholesky default: Cholesky tries with growing jitter
_MAX_TRIES = 6


class LogNEI(qLogNoisyExpectedImprovement):
    """qLogNEI whose samples at the candidates are computed directly (module doc)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # the sampler's base samples, and them reshaped as BoTorch's sampling reshapes them
        self._reshaped: tuple[Tensor, Tensor] | None = None
        # the baseline and model CandidateMoments was built for, and it (None: not covered)
        self._candidate_moments: tuple[Tensor, Model, Any, CandidateMoments | None] | None = None
        # the objective and constraints LogNEITerms was built for, and it (None: not covered)
        self._terms: tuple[Any, Any, LogNEITerms | None] | None = None

    def forward(self, X: Tensor) -> Tensor:
        """BoTorch's ``forward`` (``SampleReducingMCAcquisitionFunction``) where the samples
        come directly, with its two reductions written out for one candidate (module doc)."""
        if not _reductions_covered(self):
            return super().forward(X)
        direct = direct_values(self, X)
        if direct is not None:
            return direct
        samples = candidate_samples(self, X)
        if samples is None:
            return super().forward(X)
        obj = self.objective(samples, X=X)
        values = self._apply_constraints(acqval=self._sample_forward(obj), samples=samples)
        if not _finite(values):
            return self._sample_reduction(self._q_reduction(values))  # BoTorch's, with infs
        values = values[..., 0]  # fatmax over one value is that value
        top = values.amax(dim=0, keepdim=True)  # logmeanexp over the samples, as BoTorch's
        return (top + torch.logsumexp(values - top, dim=0, keepdim=True)).squeeze(0) - math.log(
            values.shape[0]
        )


def _reductions_covered(acquisition: LogNEI) -> bool:
    """Whether the acquisition reduces as ``LogNEI.forward`` writes it out: a fat maximum
    over ``q`` and ``logmeanexp`` over one sample dimension (BoTorch's defaults)."""
    q_reduction, sample_reduction = acquisition._q_reduction, acquisition._sample_reduction
    return (
        isinstance(q_reduction, partial)
        and q_reduction.func is fatmax
        and isinstance(sample_reduction, partial)
        and sample_reduction.func is logmeanexp
        and sample_reduction.keywords.get("dim") == (0,)
    )


def direct_values(acquisition: LogNEI, X: Tensor) -> Tensor | None:
    """The ``b`` values at ``X`` (``b x 1 x d``) computed in NumPy, samples
    (``rbf_moments``) and the rest (``sample_terms``), as one autograd node whose gradient
    is written out; None where either does not cover the acquisition or some number is not
    finite (the samples path then answers, as BoTorch's would)."""
    found = _direct_inputs(acquisition, X)
    if found is None:
        return None
    _, factor, base, rbf = found
    if rbf is None:
        return None
    terms = _sample_terms(acquisition)
    if terms is None:
        return None
    samples_shape = (int(base.shape[-1]), 1, 1)  # compute_best_f's view: S x 1
    best = acquisition.compute_best_f(torch.zeros(samples_shape, dtype=X.dtype)).detach()
    if best.numel() != samples_shape[0]:
        return None
    x = X.detach()[:, 0, :].numpy()
    samples, sample_state = rbf.samples(x, factor.detach().numpy(), base.detach().numpy())
    if not math.isfinite(float(samples.sum())):
        return None
    values, term_state = terms.forward(samples, best.reshape(-1).numpy())
    if not math.isfinite(float(values.sum())):
        return None

    def gradient(d_values: np.ndarray) -> np.ndarray:
        d_samples = terms.backward(term_state, d_values)
        return rbf.samples_backward(sample_state, d_samples)[:, None, :]

    return _Computed.apply(X, values, gradient)


class _Computed(torch.autograd.Function):
    """Values computed outside autograd as one node of its graph, with the function that
    gives the gradient of the input from theirs."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, X: Tensor, values: np.ndarray, gradient: Callable[[np.ndarray], np.ndarray]
    ) -> Tensor:
        ctx.gradient = gradient
        return torch.from_numpy(values)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        return torch.from_numpy(ctx.gradient(grad.detach().numpy())), None, None


def _sample_terms(acquisition: LogNEI) -> LogNEITerms | None:
    """``sample_terms``' ``LogNEITerms`` for the acquisition's objective and constraints
    (built once for them), or None where it does not cover them."""
    objective, constraints = acquisition.objective, acquisition._constraints
    cached = acquisition._terms
    if cached is None or cached[0] is not objective or cached[1] is not constraints:
        cached = (objective, constraints, LogNEITerms.build(acquisition))
        acquisition._terms = cached
    return cached[2]


def _direct_inputs(
    acquisition: LogNEI, X: Tensor
) -> tuple[Model, Tensor, Tensor, CandidateMoments | None] | None:
    """Where the direct paths apply (module doc): the model, BoTorch's baseline factor
    (``m x nb x nb``), the base samples (``m x (nb + 1) x S``) and ``rbf_moments``'
    ``CandidateMoments`` (None where it does not cover the model); else None."""
    if not acquisition._cache_root or not hasattr(acquisition, "_baseline_L"):
        return None
    if acquisition.posterior_transform is not None or X.dim() != 3:
        return None
    baseline = acquisition.X_baseline
    if baseline.dim() != 2 or X.shape[1] != 1 or acquisition.X_pending is not None:
        return None
    if acquisition.q_in != 1:
        return None
    model = acquisition.model
    if isinstance(model, SharedRowsModel):
        model = model.model
    factor = acquisition._baseline_L
    factor = factor if factor.dim() == 3 else factor.unsqueeze(0)  # m x nb x nb
    base = _base_samples(acquisition, model.num_outputs, type(model) is SingleTaskGP, X.dtype)[0]
    return model, factor, base, _candidate_moments(acquisition, model)


def candidate_samples(acquisition: LogNEI, X: Tensor) -> Tensor | None:
    """``sample_shape x b x 1 x m`` posterior samples at ``X`` (``b x 1 x d``), as BoTorch's
    cached-Cholesky sampling draws them; None where the direct path does not apply (module
    doc)."""
    found = _direct_inputs(acquisition, X)
    if found is None:
        return None
    model, factor, base, rbf = found
    # the candidate's row of the root of the joint covariance over [baseline, candidate]:
    # [B L_b^-T, chol(C - B L_b^-T (B L_b^-T)^T)] per output, times the base samples
    samples = _samples(acquisition, model, rbf, X[:, 0, :], factor, base)
    if samples is None:
        return None
    return samples.permute(2, 1, 0).unsqueeze(-2)


def _samples(
    acquisition: LogNEI,
    model: Model,
    rbf: CandidateMoments | None,
    x: Tensor,
    factor: Tensor,
    base: Tensor,
) -> Tensor | None:
    """``candidate_samples``' ``m x b x S`` samples the general way: from ``rbf``'s moments
    or ``shared_rows.model_moments``, a conditional variance that is not positive factored
    with BoTorch's jitter; None where the model is not covered or that fails."""
    if rbf is not None:
        moments: tuple[Tensor, Tensor, Tensor] | None = rbf(x)
    else:
        nb = acquisition.X_baseline.shape[-2]
        found = model_moments(model, torch.cat([acquisition.X_baseline, x]), nb)
        # u x m, m x b, m x u x nb
        moments = None if found is None else (found[0][nb:].mT, found[1], found[2][:, nb:, :])
    if moments is None:
        return None
    mean, variances, covariances = moments  # m x b, m x b, m x b x nb
    left = torch.linalg.solve_triangular(factor, covariances.mT, upper=False).mT
    conditional = variances - left.pow(2).sum(dim=-1)
    try:
        right = psd_safe_cholesky(conditional[..., None, None], max_tries=_MAX_TRIES)
    except (NanError, NotPSDError):
        return None  # as BoTorch's path: it warns and samples the plain way
    root = torch.cat([left, right[..., 0]], dim=-1)  # m x b x (nb + 1)
    samples = root @ base + mean.unsqueeze(-1)
    if not _finite(samples):
        return None  # BoTorch's path raises NanError, warns and samples the plain way
    return samples


def _candidate_moments(acquisition: LogNEI, model: Model) -> CandidateMoments | None:
    """``rbf_moments``' ``CandidateMoments`` for the acquisition's baseline and model (built
    once for them), or None where it does not cover the model."""
    baseline = acquisition.X_baseline
    strategy = getattr(model, "prediction_strategy", None)
    cached = acquisition._candidate_moments
    if (
        cached is None
        or cached[0] is not baseline
        or cached[1] is not model
        or (cached[2] is not strategy)
    ):
        cached = (baseline, model, strategy, CandidateMoments.build(model, baseline))
        acquisition._candidate_moments = cached
    return cached[3]


def _finite(values: Tensor) -> bool:
    """Whether every entry is finite: one reduction (a NaN or an infinity makes the sum
    non-finite), where ``isfinite(...).all()`` costs three operations."""
    return math.isfinite(float(values.detach().sum()))


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
