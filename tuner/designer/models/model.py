"""Model build and fit: one Gaussian process per outcome on the unit box.

Outcomes are the study's metrics (the objective and every constrained metric) and, once some
configuration has broken the system, a *feasibility* outcome (0 = ran, 1 = INFEASIBLE or
TIMED_OUT) whose GP acts as a soft classifier. Each GP is BoTorch's ``SingleTaskGP`` (with
a product of an RBF and a categorical kernel when the space has categorical knobs) with a
``Standardize`` outcome transform, trained on the trials that reported that outcome.

Inputs are normalized by construction: ``UnitBoxEncoder`` maps every knob's known range onto
``[0, 1]`` (log-scaled where the knob is), which is exactly what BoTorch's ``Normalize``
input transform would do with those bounds. The model therefore takes the encoded points as
they are; an identity ``Normalize`` cost about 15 % of a suggestion in profiles (it runs on
every posterior and likelihood evaluation).

Positive metrics spanning more than an order of magnitude (latencies, throughputs) are
modelled in log space, where they are closer to Gaussian.

A trial measured several times (the session's measurement protocol) trains the GPs with one
row per repeat: ``replicates`` rebuilds ``k`` values with the trial's stored mean and
standard deviation, which gives the GP exactly the posterior and marginal likelihood the raw
repeats would. So the noise is inferred from the repeats' spread where there are repeats
(and from the fit elsewhere), and a trial's mean of ``k`` repeats counts with ``1/k`` of a
single measurement's noise: a lucky single sample no longer outweighs a well-measured
configuration. (A per-trial fixed noise from two or three repeats would be a poor estimate
of the noise; one pooled, inferred noise level is the better-determined model.)

A trial EARLY_STOPPED after ``w`` of the ``W`` windows a full measurement takes (``Trial.windows``;
``W`` the most one run of a COMPLETED trial of the study reported) has the mean of a part of a
measurement: its row gets the noise ``s^2 W / w`` where a full measurement's gets ``s^2``
(``likelihood.ScaledNoiseLikelihood``; the same pooled ``s^2``). That is the variance of a
mean of ``w`` windows where the noise is the windows' own; where the runs also differ by
more than their windows show, it weighs the short measurement a little less than it
deserves, which errs on the side of trusting it less. Without the factor a trial screened
out after 3 of 10 windows would count as much as a full measurement.

With ``impute_failures`` (the designer sets it for candidate-list studies) the objective's
GP of a single-objective study also learns from the configurations that broke the system:
each INFEASIBLE or TIMED_OUT trial without an objective value counts as the worst value
observed so far. The feasibility classifier alone says "this one failed" but leaves the
objective's model free to predict a record there; on the cloud benchmark, the deployments
that run out of memory sit next to the cheapest ones that do not, and the imputed values
keep qLogNEI from spending trial after trial on that edge (SMAC's "crash cost" idea).

With ``trend`` every GP gets a linear prior mean (gpytorch's ``LinearMean``, its slopes fitted
with the other hyperparameters) instead of a constant one: far from the data it carries the
fitted slopes on to the faces of the box instead of reverting to the average.
The BO designer's trend probe uses it (``steps/bo.py``).

Fitting is the main cost of a suggestion. ``FitCache`` keeps each outcome's last fitted
hyperparameters so the next fit starts from them (a few L-BFGS steps instead of a fresh fit).
The cache only saves time: without it the same model is fitted from the priors. The
likelihood L-BFGS-B evaluates is computed in plain torch (``models/likelihood.py``: GPyTorch's
value to rounding, at under half the cost).

Outcomes observed on the same trials (a constrained or multi-objective study) share one
batched GP, whose posterior the acquisition evaluates in one computation; its outputs are
fitted one by one, each as its own single-output GP warm-started from its own cache entry,
and their hyperparameters stacked into it, so it predicts each output exactly as that
output's GP alone. (BoTorch's batched fit solves the same independent problems through
GPyTorch's likelihood, and BoTorch 0.18 reads its L-BFGS-B results under a key they do not
have, so a fit that used up its steps reads as FAILURE: every warm fit of 25 steps "failed"
and was redone from the priors. A constrained study's step at n = 100, d = 16 took a median
7.5 CPU-s that way and 1.3 CPU-s this way, on the loaded VM; ``bench/NOTES.md``.)

A fit is deterministic and touches no process-wide state: L-BFGS-B from the warm start (or
the priors' initial values); when it ends abnormally from a warm start, once more from the
initial values; a fit that still ends abnormally keeps the best hyperparameters L-BFGS-B
reached. (BoTorch's ``fit_gpytorch_mll`` would instead retry from hyperparameters drawn
from the priors with torch's global generator, and decide to retry from the warnings it
records process-wide, so two studies fitted at once could change each other's models.)
Numerical errors (``NotPSDError``, ``NanError``) propagate: the designer falls back.

References:
    Hvarfner, Hellsten, Nardi, "Vanilla Bayesian optimization performs great in high
    dimensions", ICML 2024 (the dimension-scaled priors of BoTorch's default GP).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from botorch.exceptions.errors import ModelFittingError, OptimizationGradientError
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.gpytorch import GPyTorchModel
from botorch.models.model import Model
from botorch.models.transforms.outcome import Standardize
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from botorch.optim.core import OptimizationStatus
from botorch.optim.fit import fit_gpytorch_mll_scipy
from gpytorch.constraints import Interval
from gpytorch.kernels import Kernel
from gpytorch.means import LinearMean, Mean
from gpytorch.mlls import ExactMarginalLogLikelihood
from linear_operator.utils.errors import NanError, NotPSDError
from torch.nn import Parameter

from tuner.designer.models.kernels import OneHotCategoricalKernel
from tuner.designer.models.likelihood import ScaledNoiseLikelihood, fit_plain
from tuner.designer.models.means import Prior, PriorMean
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

#: Numerical trouble in a fit or an acquisition: a model-based step falls back to
#: quasi-random points, a posterior ranking to the measured values.
NUMERICAL_ERRORS: tuple[type[Exception], ...] = (
    NotPSDError,
    NanError,
    ModelFittingError,
    OptimizationGradientError,
    np.linalg.LinAlgError,
    torch.linalg.LinAlgError,
)

FEASIBILITY = "__feasibility__"
LOG_SPAN = 10.0  # model positive metrics in log space when max/min exceeds this
_WARM_KEYS = ("covar_module", "likelihood", "mean_module")
_CAT_LENGTHSCALE = (0.01, 20.0)
_FIT_MAXITER = 200  # L-BFGS-B steps of a fit from the priors
# A warm-started fit continues from the last fit's hyperparameters, which a few new
# observations move only a little; its remaining steps are amortized over the next fits,
# and a fit at a multiple of _FULL_FIT_EVERY observations runs to convergence (from the
# warm start), so the hyperparameters cannot lag behind the data for long.
_WARM_MAXITER = 25
_FULL_FIT_EVERY = 5
# Below _KEEP_FROM observations every suggestion fits the hyperparameters (warm, above);
# from there on the cached ones are used without a fit until the data has grown by
# n // _KEEP_SHARE observations (10 %) since they were fitted: at 1000, every hundredth
# suggestion fits. The GP is always conditioned on all the data; only its lengthscales and
# noise lag. Both for latency: a warm fit from the previous step's hyperparameters costs
# 0.05-0.2 s at n = 100 and d = 16-100 (a full fit's turn up to 0.6 s, 1.2 s with a
# constraint), inside the step goals, but about 0.7 s at n = 1000. From 2026-11-27 to
# 2026-12-04 the share applied from 20 observations on; it lost the smooth high-dimensional
# problems at 50-100 trials (bench/NOTES.md, "A refit every step below 200 observations").
_KEEP_FROM = 200
_KEEP_SHARE = 10


class Encoder(Protocol):
    """What the model needs of an encoder: ``UnitBoxEncoder``, or a candidate study's
    ``FeatureEncoder`` (``sampling/candidates.py``)."""

    @property
    def d(self) -> int: ...

    @property
    def cat_dims(self) -> dict[int, list[float]]: ...

    def encode_many(self, configs: list[Config]) -> torch.Tensor: ...


@dataclass(frozen=True)
class OutcomeData:
    """Training data of one outcome.

    Attributes:
        name: Metric name, or ``FEASIBILITY``.
        X: ``n x d`` unit-box inputs.
        Y: ``n x 1`` targets (log-transformed when ``log``).
        log: Whether ``Y`` holds ``log(metric)``.
        scale: ``n`` noise factors, one per row (``fidelity_scale``), or None where every
            row is a full measurement.
    """

    name: str
    X: torch.Tensor
    Y: torch.Tensor
    log: bool = False
    scale: torch.Tensor | None = None

    def transform(self, value: float) -> float:
        """Map a bound in metric units to the model's units."""
        return math.log(value) if self.log else value


#: ``FitCache.export``'s form: (scope, outcome) -> (dimension, hyperparameters, rows).
CacheEntries = dict[tuple[str, str], tuple[int, dict[str, np.ndarray], int | None]]


class FitCache:
    """Last fitted hyperparameters per (study, outcome), with the number of observations they
    were fitted on; thread-safe, in memory only."""

    def __init__(self) -> None:
        self._states: dict[tuple[str, str], tuple[int, dict[str, torch.Tensor], int | None]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str], d: int) -> dict[str, torch.Tensor] | None:
        with self._lock:
            entry = self._states.get(key)
        return entry[1] if entry is not None and entry[0] == d else None

    def fitted_rows(self, key: tuple[str, str], d: int) -> int | None:
        """The number of observations the cached hyperparameters were fitted on (None: no
        entry, another dimension, or not recorded)."""
        with self._lock:
            entry = self._states.get(key)
        return entry[2] if entry is not None and entry[0] == d else None

    def put(
        self, key: tuple[str, str], d: int, state: dict[str, torch.Tensor], rows: int | None = None
    ) -> None:
        with self._lock:
            self._states[key] = (d, state, rows)

    def forget(self, study: str) -> None:
        with self._lock:
            for key in [k for k in self._states if k[0] == study]:
                del self._states[key]

    def export(self, study: str) -> CacheEntries:
        """The entries of ``study`` (its outcomes, with and without a trend) as plain numpy
        arrays, to carry to another process (``update`` takes them back)."""
        with self._lock:
            found = {k: v for k, v in self._states.items() if k[0].split(":")[0] == study}
        return {
            key: (d, {name: t.detach().cpu().numpy().copy() for name, t in state.items()}, rows)
            for key, (d, state, rows) in found.items()
        }

    def update(self, entries: CacheEntries) -> None:
        """Store entries that ``export`` gave (here or in another process)."""
        with self._lock:
            for key, (d, state, rows) in entries.items():
                self._states[key] = (d, {n: torch.from_numpy(a) for n, a in state.items()}, rows)


def outcome_data(
    spec: StudySpec,
    encoder: Encoder,
    observed: tuple[Trial, ...],
    impute_failures: bool = False,
) -> list[OutcomeData]:
    """Training sets for every outcome with at least one observation (objective first).

    The objectives of a multi-objective study stay in metric units: the hypervolume is a
    volume in those units, and a log scale would stretch the values near zero without bound.
    ``impute_failures``: see the module doc (single-objective studies only).
    """
    linear = {o.name for o in spec.objectives} if spec.multi_objective else set()
    scales = fidelity_scale(observed)
    out: list[OutcomeData] = []
    for name in spec.metric_names:
        found = [(t, replicates(t, name)) for t in observed if finite(t.metrics.get(name))]
        if not found:
            continue
        rows = [t for t, values in found for _ in values]
        values = torch.tensor([[v] for _, vs in found for v in vs], dtype=torch.float64)
        factors = [scales.get(t.id, 1.0) for t in rows]
        use_log = spans_decades(values) and name not in linear
        Y = values.log() if use_log else values
        X = encoder.encode_many([t.config for t in rows])
        if impute_failures and name == spec.objective.name and not spec.multi_objective:
            broken = [
                t for t in observed if not t.status.measured and not finite(t.metrics.get(name))
            ]
            if broken:
                worst = Y.max() if spec.objective.goal.value == "minimize" else Y.min()
                X = torch.cat([X, encoder.encode_many([t.config for t in broken])])
                Y = torch.cat([Y, worst.reshape(1, 1).expand(len(broken), 1)])
                factors += [1.0] * len(broken)
        scale = torch.tensor(factors, dtype=torch.float64) if max(factors) > 1.0 else None
        out.append(OutcomeData(name, X, Y, use_log, scale))
    if any(not t.status.measured for t in observed):
        labels = [[0.0 if t.status.measured else 1.0] for t in observed]
        out.append(
            OutcomeData(
                FEASIBILITY,
                encoder.encode_many([t.config for t in observed]),
                torch.tensor(labels, dtype=torch.float64),
            )
        )
    return out


def spans_decades(values: torch.Tensor | np.ndarray) -> bool:
    """Whether positive metric values span more than ``LOG_SPAN`` (max over min): such a
    metric is modelled in log space (module doc)."""
    return bool((values > 0).all()) and float(values.max() / values.min()) > LOG_SPAN


def fidelity_scale(observed: tuple[Trial, ...]) -> dict[int, float]:
    """Per EARLY_STOPPED trial measured in one part-run, its noise factor ``W / w`` (module
    doc): ``w`` its windows, ``W`` the most windows one run of a COMPLETED trial reported
    (its windows over its repeats). Empty while no completed trial was measured in windows.

    A trial with several repeats already weighs by their number (``replicates``): the
    daemon's windows are its repeats, so a trial it stopped after ``w`` windows trains
    ``w`` rows where a full one trains ``W``, and gets no factor on top."""
    full = max(
        (t.windows / t.repeats for t in observed if t.status is TrialStatus.COMPLETED),
        default=0.0,
    )
    return {
        t.id: full / t.windows
        for t in observed
        if t.status is TrialStatus.EARLY_STOPPED and t.repeats == 1 and 0 < t.windows < full
    }


def replicates(trial: Trial, name: str) -> list[float]:
    """Training values of one trial's metric: its mean, or, for a trial measured ``k > 1``
    times, ``k`` values with the repeats' mean and standard deviation (module doc).

    The values are ``mean + spread * c * (j - (k - 1) / 2)`` for ``j = 0..k-1`` with
    ``c = sqrt(12 / (k (k + 1)))``: their mean is the trial's and their sample variance its
    ``spread ** 2``, so a GP's posterior and marginal likelihood are exactly those it gets
    from the raw repeats. A positive metric whose reconstruction would not stay positive
    keeps ``k`` copies of the mean (the same posterior; only the noise estimate loses the
    spread).
    """
    mean = trial.metrics[name]
    k = trial.repeats
    spread = trial.spread.get(name)
    if k < 2 or spread is None or not math.isfinite(spread):
        return [mean]
    c = math.sqrt(12.0 / (k * (k + 1)))
    values = [mean + spread * c * (j - (k - 1) / 2) for j in range(k)]
    if mean > 0 and min(values) <= 0:
        return [mean] * k
    return values


def distinct_rows(X: torch.Tensor) -> torch.Tensor:
    """``n x d`` ``X`` without repeated rows (the first of each kept, in order): a trial
    measured ``k`` times trains ``k`` equal rows, but the acquisition's baseline needs each
    point once (the joint posterior over two equal points is singular)."""
    first: dict[tuple[float, ...], int] = {}
    for i, row in enumerate(X.tolist()):
        first.setdefault(tuple(row), i)
    if len(first) == X.shape[0]:
        return X
    return X[list(first.values())]


def fit_models(
    data: list[OutcomeData],
    encoder: Encoder,
    cache: FitCache | None = None,
    cache_scope: str = "",
    trend: bool = False,
    prior: Prior | None = None,
) -> Model:
    """Fit the outcomes' GPs, warm-started from the cache; outputs keep ``data``'s order.

    When every outcome was observed on the same trials (the usual case: all metrics of every
    COMPLETED trial) they share one batched multi-output GP, which makes each posterior
    evaluation of the acquisition one batched computation (its outputs fitted one by one:
    module doc). Otherwise (a feasibility outcome
    also covers INFEASIBLE trials) each outcome gets its own GP in a ``ModelListGP``.
    A batched multi-output GP is never put inside a ``ModelListGP``: BoTorch 0.18 then lays
    out the joint posterior's covariance wrongly (the variances of the second output show up
    in the first output's slots for half the points), which silently breaks the acquisition.

    ``prior``: one outcome's prior mean (``models/transfer.py``: what earlier studies say);
    it replaces the trend's linear mean where both are asked for.
    """
    groups = _groups(data)
    scope = cache_scope + ":trend" if trend else cache_scope
    if prior is not None:
        scope, trend = cache_scope + ":transfer", False
    if len(groups) == 1:
        return _fit(groups[0], encoder, cache, scope, trend, prior)
    return ModelListGP(*[_fit([o], encoder, cache, scope, trend, prior) for o in data])


def _fit(
    group: list[OutcomeData],
    encoder: Encoder,
    cache: FitCache | None,
    scope: str,
    trend: bool = False,
    prior: Prior | None = None,
) -> GPyTorchModel:
    """One outcome's GP, or a batched GP over outcomes sharing inputs whose hyperparameters
    are each outcome's own GP's (module doc: the outputs are fitted one by one)."""
    if len(group) == 1:
        return _fit_one(group[0], encoder, cache, scope, trend, prior)
    singles = [_fit_one(o, encoder, cache, scope, trend, prior) for o in group]
    model = build_model(group, encoder, trend, prior)
    fitted = [dict(s.named_parameters()) for s in singles]
    for name, parameter in model.named_parameters():
        own = torch.stack([f[name].detach() for f in fitted])
        if own.numel() != parameter.numel():  # a layout this code does not know
            raise RuntimeError(
                f"cannot batch {name}: {tuple(own.shape)} -> {tuple(parameter.shape)}"
            )
        with torch.no_grad():
            parameter.copy_(own.reshape(parameter.shape))
    model.eval()
    return model


def _fit_one(
    outcome: OutcomeData,
    encoder: Encoder,
    cache: FitCache | None,
    scope: str,
    trend: bool = False,
    prior: Prior | None = None,
) -> GPyTorchModel:
    key = (scope, outcome.name)
    state = cache.get(key, encoder.d) if cache is not None else None
    rows = outcome.X.shape[0]
    model = build_model([outcome], encoder, trend, prior)
    if state is not None:
        model.load_state_dict(state, strict=False)
        fitted = cache.fitted_rows(key, encoder.d) if cache is not None else None
        if fitted is not None and _keeps(fitted, rows):
            model.eval()
            return model  # the cached hyperparameters still describe the data
        full = rows % _FULL_FIT_EVERY == 0
        if not _optimize(model, _FIT_MAXITER if full else _WARM_MAXITER):
            model = build_model([outcome], encoder, trend, prior)  # the warm start misled it
            _optimize(model, _FIT_MAXITER)
    else:
        _optimize(model, _FIT_MAXITER)
    model.eval()
    if cache is not None:
        cache.put(key, encoder.d, _hyperparameters(model), rows)
    return model


def refit_interval(rows: int) -> int:
    """New observations after which a study of ``rows`` observations fits its GP again (1:
    every suggestion fits)."""
    return 1 if rows < _KEEP_FROM else rows // _KEEP_SHARE  # >= 20 from 200 on


def _keeps(fitted: int, rows: int) -> bool:
    """Whether hyperparameters fitted on ``fitted`` observations serve ``rows`` unfitted."""
    return 0 <= rows - fitted < refit_interval(rows)


def optimize_hyperparameters(model: GPyTorchModel, maxiter: int = _FIT_MAXITER) -> bool:
    """Fit a single-output GP's hyperparameters from where they are (``_optimize``)."""
    return _optimize(model, maxiter)


def _optimize(model: GPyTorchModel, maxiter: int) -> bool:
    """Maximize a single-output GP's marginal likelihood with L-BFGS-B; whether it ended
    normally (converged or ran its ``maxiter`` steps)."""
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    mll.train()
    result = fit_plain(mll, maxiter)  # the same fit with a plain-torch objective
    if result is None:  # a structure the plain objective does not cover
        result = fit_gpytorch_mll_scipy(mll, options={"maxiter": maxiter})
    return result.status in (OptimizationStatus.SUCCESS, OptimizationStatus.STOPPED)


def build_model(
    group: list[OutcomeData], encoder: Encoder, trend: bool = False, prior: Prior | None = None
) -> GPyTorchModel:
    """An unfitted GP for outcomes sharing inputs; categorical knobs get a categorical kernel.

    ``trend``: a linear prior mean over all inputs (module doc) instead of a constant.
    ``prior``: ``prior.function`` plus a constant as the prior mean of outcome
    ``prior.outcome``, a constant for the others (``models/transfer.py``).
    """
    d = encoder.d
    X = group[0].X
    Y = torch.cat([o.Y for o in group], dim=-1)
    cat_dims = sorted(encoder.cat_dims)
    other = [i for i in range(d) if i not in encoder.cat_dims]
    batch = torch.Size([len(group)]) if len(group) > 1 else None
    scale = group[0].scale  # the outcomes of a group share their rows, so their factors
    mean = ZeroLinearMean(d, batch or torch.Size([])) if trend else None
    if prior is not None:
        active = [o.name == prior.outcome for o in group]
        mean = PriorMean(prior.function, active, batch or torch.Size([]))
    return SingleTaskGP(
        X,  # already normalized: the unit-box encoding of the knobs' ranges
        Y,
        likelihood=None if scale is None else ScaledNoiseLikelihood(scale, batch or torch.Size()),
        covar_module=_kernel(other, cat_dims, [encoder.cat_dims[i] for i in cat_dims], batch),
        mean_module=mean,
        outcome_transform=Standardize(m=len(group)),
    )


class ZeroLinearMean(LinearMean):
    """GPyTorch's ``LinearMean`` with its slopes and intercept starting at zero (where a
    constant mean starts). ``LinearMean`` draws them with ``torch.randn`` from torch's global
    generator: a trend fit from the priors then depended on whatever else had drawn from
    it, in this thread or another study's, and moved it for them (``steps/bo.py``: a suggestion
    touches no process-wide state)."""

    def __init__(self, input_size: int, batch_shape: torch.Size) -> None:
        Mean.__init__(self)  # LinearMean's own __init__ would draw the random values
        self.register_parameter("weights", Parameter(torch.zeros(*batch_shape, input_size, 1)))
        self.register_parameter("bias", Parameter(torch.zeros(*batch_shape, 1)))


def _kernel(
    other: list[int],
    cat_dims: list[int],
    levels: list[list[float]],
    batch_shape: torch.Size | None,
) -> Kernel:
    """RBF (ARD, dimension-scaled prior) on ordered dims times a categorical kernel.

    A single product kernel: configurations are similar when their ordered knobs are close
    *and* they share categorical choices. Cheaper to fit than BoTorch's
    ``MixedSingleTaskGP`` (sum plus product of four scaled kernels), which matters because
    fitting is most of a suggestion's cost.
    """
    shape = batch_shape or torch.Size([])
    if not cat_dims:
        return get_covar_module_with_dim_scaled_prior(ard_num_dims=len(other), batch_shape=shape)
    categorical = (
        OneHotCategoricalKernel(  # BoTorch's CategoricalKernel, faster (models/kernels.py)
            levels,
            batch_shape=shape,
            ard_num_dims=len(cat_dims),
            active_dims=cat_dims,
            # bounded: without a bound an irrelevant category drives its lengthscale to infinity
            # and the fit wanders for hundreds of L-BFGS steps on a flat likelihood
            lengthscale_constraint=Interval(*_CAT_LENGTHSCALE),
        )
    )
    if not other:
        return categorical
    ordered = get_covar_module_with_dim_scaled_prior(
        ard_num_dims=len(other), active_dims=other, batch_shape=shape
    )
    return ordered * categorical


def _groups(data: list[OutcomeData]) -> list[list[OutcomeData]]:
    """Consecutive outcomes with identical inputs, in order."""
    groups: list[list[OutcomeData]] = []
    for outcome in data:
        last = groups[-1][0] if groups else None
        if last is not None and _same(last.X, outcome.X) and _same(last.scale, outcome.scale):
            groups[-1].append(outcome)
        else:
            groups.append([outcome])
    return groups


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and torch.equal(a, b)


def _hyperparameters(model: GPyTorchModel) -> dict[str, torch.Tensor]:
    return {
        k: v.detach().clone() for k, v in model.state_dict().items() if k.startswith(_WARM_KEYS)
    }


def finite(value: float | None) -> bool:
    """Whether a metric value is present and finite (a training row)."""
    return value is not None and math.isfinite(value)
