"""Learning from earlier studies: a GP per source, weighted by how well it ranks this study's
own trials, as the prior mean of this study's objective GP.

Each source (``tuner.transfer.SourceStudy``: an earlier study's measured configurations in
this study's knob names) gets its own GP over the knobs it shares with this study, fitted
once on its values made comparable: log-scaled where the study's GP would (``spans_decades``),
standardized, and negated when the source's goal is the opposite of this study's (a source
that minimized latency tells a study maximizing throughput where throughput is *high* by
where its latency was low). The GPs are cached by the sources' evidence (``SourceStudy.digest``),
so a study's steps fit each source once.

**Weights: ranking, as RGPE** (Feurer, Letham, Bakshy, "Scalable Meta-Learning for Bayesian
Optimization using Ranking-Weighted Gaussian Process Ensembles", AutoML workshop 2018;
ResTune, SIGMOD 2021, weights its workloads' models the same way). Each model, the target's
own among them, draws ``SAMPLES`` joint samples of its predictions at this study's measured
configurations (the target's own GP leave-one-trial-out, so it is not scored on the points it
was fitted to); a sample's loss is the number of pairs of trials it orders differently from
the measured values. A model's weight is the share of samples in which its loss is the
smallest (ties split at random). A source whose median loss exceeds the 95th percentile of the
target's is dropped (the paper's "weight dilution" guard). So an unrelated source's weight
falls as the study's own data grows, and the target's own GP takes over; the weights are
recomputed at every model-based step from the study's evidence, never from a constant.

**How the weights enter: a prior mean.** The ensemble does not replace the study's GP; it
becomes its prior mean (``PriorMean``: a fitted constant plus ``sum_i w_i mu_i(x)`` in the
standardized units both sides share; the target's own weight adds nothing). Where the study
has measured, its GP follows its own data; elsewhere it expects what the weighted sources
say, with the study's own uncertainty (RGPE's weighted sum of posteriors would instead take
the sources' small variances and stop exploring where they are confident). Every other part
of a step (constraints, the acquisition, the trust region) is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from botorch.models import SingleTaskGP
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from torch import Tensor

from tuner.config_key import unit_value
from tuner.designer.fast.shared_rows import training_precision
from tuner.designer.models.means import Prior, PriorMean
from tuner.designer.models.model import optimize_hyperparameters, spans_decades
from tuner.embedding import HeSBOEmbedding
from tuner.space import Config, SearchSpace
from tuner.study import StudySpec
from tuner.transfer import SourceStudy

#: Joint samples per model for the ranking losses (RGPE's paper: 1000 gave the same
#: weights to two decimals as 256 here; the losses are counted over n^2 pairs each).
SAMPLES = 256
#: Drop a source whose median loss is above this quantile of the target's losses (RGPE).
DILUTION_QUANTILE = 0.95
#: The target's own GP is scored only from this many trials on; before, the sources share
#: the weight equally (nothing to rank them by).
MIN_RANKED = 3
_FIT_MAXITER = 200
TARGET = ""  # the target's own model, in a weights table


@dataclass(frozen=True)
class SourceModel:
    """One source's fitted GP over the dims (knobs) of this study it shares.

    Attributes:
        name: The source study.
        dims: The target's encoded dims (one per knob) the GP reads, in its input order.
        model: Its GP, in standardized, target-oriented units (higher: higher target value).
        alpha: ``K^-1 (y - c)`` of its training data, for its mean at new points.
        best: The source's best feasible configuration (``SourceStudy.best``) on the knobs
            the GP reads, or None.
    """

    name: str
    dims: Tensor
    model: SingleTaskGP
    alpha: Tensor
    best: Config | None

    def mean(self, X: Tensor) -> Tensor:
        """Posterior mean at ``... x d`` target-encoded points (differentiable)."""
        model = self.model
        train = model.train_inputs[0]
        cross = model.covar_module(X.index_select(-1, self.dims), train).to_dense()
        return model.mean_module.constant + (cross @ self.alpha.unsqueeze(-1)).squeeze(-1)

    def samples(self, X: Tensor, count: int, generator: torch.Generator) -> Tensor:
        """``count x n`` joint posterior samples at ``n x d`` target-encoded points."""
        with torch.no_grad():
            mvn = self.model(X.index_select(-1, self.dims))  # the latent posterior (eval mode)
            mean, covariance = mvn.mean, mvn.covariance_matrix
        return _mvn_samples(mean, covariance, count, generator)


class _Bounded:
    """The last ``size`` values made, by key: thread-safe; a missing value is made outside
    the lock (two threads may make the same one; both get an equal value)."""

    def __init__(self, size: int) -> None:
        self._values: OrderedDict[str, Any] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: str, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
        value = make()
        with self._lock:
            self._values[key] = value
            while len(self._values) > self._size:
                self._values.popitem(last=False)
        return value


#: Fitted source models by (source evidence, this study's knobs and goal).
SOURCE_MODELS = _Bounded(64)


def source_models(spec: StudySpec, sources: Sequence[SourceStudy]) -> list[SourceModel]:
    """A fitted model per source with enough evidence (two measured trials on a shared knob)."""
    out = []
    goal = spec.objective.goal.value
    knobs = [k.to_dict() for k in spec.space.knobs]
    for source in sources:
        key = _digest([source.digest, knobs, goal])
        model = SOURCE_MODELS.get(key, partial(fit_source, source, spec.space, goal))
        if model is not None:
            out.append(model)
    return out


def fit_source(source: SourceStudy, space: SearchSpace, goal: str) -> SourceModel | None:
    """A source's GP (module doc), or None with too little evidence to fit one."""
    knobs = {k.name: k for k in space.knobs}
    names = [n for n in source.knobs if n in knobs]
    rows, values = [], []
    for config, value in source.points:
        try:
            row = [min(1.0, max(0.0, unit_value(knobs[n], config[n]))) for n in names]
        except (ValueError, TypeError, KeyError):  # a choice this study does not have
            continue
        rows.append(row)
        values.append(value)
    if not names or len(rows) < 2:
        return None
    y = torch.tensor(values, dtype=torch.float64)
    if spans_decades(y):
        y = y.log()
    if float(y.std()) <= 0:
        return None
    y = (y - y.mean()) / y.std()
    if source.goal.value != goal:
        y = -y
    X = torch.tensor(rows, dtype=torch.float64)
    model = SingleTaskGP(
        X,
        y.unsqueeze(-1),
        covar_module=get_covar_module_with_dim_scaled_prior(ard_num_dims=len(names)),
        mean_module=PriorMean(None),
        outcome_transform=None,
    )
    optimize_hyperparameters(model, _FIT_MAXITER)
    model.eval()
    with torch.no_grad():
        K = model.covar_module(X).to_dense()
        K = K + model.likelihood.noise * torch.eye(len(rows), dtype=X.dtype)
        residual = (y - model.mean_module.constant).unsqueeze(-1)
        alpha = torch.cholesky_solve(residual, torch.linalg.cholesky(K)).squeeze(-1)
    dims = torch.tensor([space.names.index(n) for n in names], dtype=torch.long)
    best = None
    if source.best is not None and all(n in source.best for n in names):
        best = {n: source.best[n] for n in names}
    return SourceModel(source.name, dims, model, alpha, best)


def ranking_weights(
    sources: Sequence[SourceModel],
    X: Tensor,
    y: Tensor,
    loo_mean: Tensor,
    loo_std: Tensor,
    seed: int,
    lift: Callable[[Tensor], Tensor] | None = None,
) -> dict[str, float]:
    """RGPE's weights (module doc): source name -> weight, and ``TARGET`` -> the target's.

    Args:
        X: ``n x d`` the study's measured points, one per trial (its encoding, or the inner
            encoding of an embedding with ``lift`` mapping it to the knobs' encoding).
        y: ``n`` their measured values (any monotone transform of them).
        loo_mean, loo_std: The target GP's leave-one-trial-out predictions at ``X``.
    """
    if not sources:
        return {TARGET: 1.0}
    n = y.shape[0]
    if n < MIN_RANKED:
        return {**{s.name: 1.0 / len(sources) for s in sources}, TARGET: 0.0}
    generator = torch.Generator().manual_seed(seed)
    points = lift(X) if lift is not None else X
    losses = [ranking_loss(s.samples(points, SAMPLES, generator), y) for s in sources]
    noise = torch.randn(SAMPLES, n, generator=generator, dtype=torch.float64)
    target = ranking_loss(loo_mean + loo_std * noise, y)
    threshold = torch.quantile(target, DILUTION_QUANTILE)
    kept = [bool(torch.median(loss) <= threshold) for loss in losses]
    table = torch.stack([*losses, target])  # (k + 1) x S
    jitter = torch.rand(table.shape, generator=generator, dtype=torch.float64) * 0.5
    ranked = table + jitter  # losses are whole numbers: the jitter only breaks ties
    ranked[:-1][~torch.tensor(kept)] = float("inf")
    winners = ranked.argmin(dim=0)
    counts = torch.bincount(winners, minlength=len(sources) + 1).to(torch.float64) / SAMPLES
    out = {s.name: float(c) for s, c in zip(sources, counts[:-1], strict=True)}
    out[TARGET] = float(counts[-1])
    return out


def ranking_loss(samples: Tensor, y: Tensor) -> Tensor:
    """Per sample (``S x n``), the number of pairs of points it orders differently from
    ``y`` (pairs with equal ``y`` do not count)."""
    observed = y.unsqueeze(-1) < y.unsqueeze(-2)  # n x n: y_j < y_k
    predicted = samples.unsqueeze(-1) < samples.unsqueeze(-2)  # S x n x n
    return (predicted ^ observed).logical_and(y.unsqueeze(-1) != y.unsqueeze(-2)).sum(
        dim=(-1, -2)
    ).to(torch.float64) / 2


def prior_function(
    sources: Sequence[SourceModel],
    weights: dict[str, float],
    lift: Callable[[Tensor], Tensor] | None = None,
) -> Callable[[Tensor], Tensor] | None:
    """``x -> sum_i w_i mu_i(x)`` over the sources with weight, or None when none has any."""
    used = [(s, weights.get(s.name, 0.0)) for s in sources if weights.get(s.name, 0.0) > 0.0]
    if not used:
        return None

    def prior(X: Tensor) -> Tensor:
        points = lift(X) if lift is not None else X
        total = None
        for source, weight in used:
            term = weight * source.mean(points)
            total = term if total is None else total + term
        assert total is not None
        return total

    return prior


def leave_one_out(model: SingleTaskGP) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The distinct rows of a fitted single-output GP's training inputs (``n x d``), their
    mean training values, and the GP's predictions at each from the other rows' data, leaving
    out every row of that point together (a trial measured ``k`` times trains ``k`` equal
    rows): mean and standard deviation (each ``n``, in the model's training units)."""
    train = model.train_inputs[0]
    targets = model.train_targets
    inverse, weighted = training_precision(model)
    groups: dict[tuple[float, ...], list[int]] = {}
    for i, row in enumerate(train.tolist()):
        groups.setdefault(tuple(row), []).append(i)
    points, means, stds, values = [], [], [], []
    for key, rows in groups.items():
        index = torch.tensor(rows)
        block = torch.linalg.inv(inverse[index][:, index])  # predictive covariance of the rows
        predicted = targets[index] - block @ weighted[index]
        k = len(rows)
        means.append(float(predicted.mean()))
        stds.append(float(block.sum() / (k * k)) ** 0.5)
        values.append(float(targets[index].mean()))
        points.append(key)
    as_tensor = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    return as_tensor(points), as_tensor(values), as_tensor(means), as_tensor(stds)


def _digest(value: Any) -> str:
    """A cache key for JSON-able ``value``."""
    blob = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _mvn_samples(
    mean: Tensor, covariance: Tensor, count: int, generator: torch.Generator
) -> Tensor:
    """``count`` samples of N(mean, covariance), with jitter where the factor needs it."""
    n = mean.shape[-1]
    eye = torch.eye(n, dtype=covariance.dtype)
    for jitter in (0.0, 1e-8, 1e-6, 1e-4):
        factor, info = torch.linalg.cholesky_ex(covariance + jitter * eye)
        if int(info) == 0:
            break
    else:  # indefinite beyond repair: the diagonal alone
        factor = torch.diag(covariance.diagonal().clamp_min(0).sqrt())
    noise = torch.randn(count, n, generator=generator, dtype=covariance.dtype)
    return mean + noise @ factor.transpose(-1, -2)


@dataclass(frozen=True)
class Transfer:
    """The sources as one designer reads them.

    Attributes:
        sources: The sources' fitted models (over the study's knob encoding).
        seeds: Configurations of the designer's own space for its TRANSFER steps (the
            agreeing sources' best, ``transfer_seeds``).
        lift: Maps the designer's encoded points to the knobs' encoding (an embedding's inner
            designer); None where they are the same.
    """

    sources: tuple[SourceModel, ...]
    seeds: tuple[Config, ...] = ()
    lift: Callable[[Tensor], Tensor] | None = None

    def step(
        self, outcome: str, plain: SingleTaskGP, seed: int
    ) -> tuple[Prior | None, dict[str, float]]:
        """This step's weights, from the study's own GP ``plain`` of ``outcome`` (fitted
        without the sources), and the prior mean they give (None: the target alone)."""
        points, values, mean, std = leave_one_out(plain)
        weights = ranking_weights(self.sources, points, values, mean, std, seed, self.lift)
        function = prior_function(self.sources, weights, self.lift)
        return (Prior(outcome, function) if function is not None else None), weights


def make_transfer(spec: StudySpec, sources: Sequence[SourceStudy]) -> Transfer | None:
    """The sources of ``spec`` as its designer uses them on its knobs; None without any
    source that has evidence to fit."""
    models = tuple(source_models(spec, sources))
    if not models:
        return None
    return Transfer(models, transfer_seeds(spec, models))


def transfer_seeds(spec: StudySpec, models: Sequence[SourceModel]) -> tuple[Config, ...]:
    """The best configuration of each source that another source expects to be better than
    its own average (all of one source's), completed with the study's defaults (or the middle
    of a knob's range) for the knobs the source lacks; in the sources' order."""
    from tuner.encoding import UnitBoxEncoder

    encoder = UnitBoxEncoder(spec.space)
    middle = encoder.decode([0.5] * encoder.d)
    default = spec.space.default_config() or {}
    fill = {k.name: default.get(k.name, middle[k.name]) for k in spec.space.knobs}
    seeds = []
    for model in models:
        if model.best is None:
            continue
        config = {**fill, **model.best}
        point = encoder.encode_many([config])
        others = [o for o in models if o is not model]
        with torch.no_grad():
            agreed = not others or any(float(o.mean(point)[0]) > 0.0 for o in others)
        if agreed:
            seeds.append(config)
    return tuple(seeds)


#: Points per knob axis of ``embedding_lift``'s tables (a bucket of 10,000 is finer than
#: any source GP's lengthscale; the nearest grid point stands for it).
LIFT_GRID = 2049


def embedding_lift(embedding: HeSBOEmbedding) -> Callable[[Tensor], Tensor]:
    """The knobs' encoding of an embedding's inner points, vectorized: ``... x d`` points of
    the inner designer's unit box (bucket indices ``v / (buckets - 1)``) -> ``... x D``
    (``HeSBOEmbedding.project`` then the unit-box encoding, to a grid point of each axis).
    Piecewise constant: no gradient flows through it (the inner designer's knobs are
    integers, searched without gradients). Its tables are built once per process and
    embedding (a designer is built for every suggestion; the tables took a second at 100
    knobs)."""
    key = _digest(
        [[k.to_dict() for k in embedding.space.knobs], embedding.settings.to_dict(),
         embedding.level]
    )  # fmt: skip

    def make() -> tuple[Tensor, Tensor, Tensor]:
        table = embedding.axis_table(LIFT_GRID)
        return (
            torch.tensor([t[0] for t in table], dtype=torch.long),
            torch.tensor([t[1] for t in table], dtype=torch.float64),
            torch.tensor([t[2] for t in table], dtype=torch.float64),  # D x grid
        )

    dims, signs, values = LIFT_TABLES.get(key, make)
    columns = torch.arange(values.shape[0])

    def lift(X: Tensor) -> Tensor:
        z = 2.0 * X.detach().index_select(-1, dims) - 1.0
        u = ((signs * z + 1.0) / 2.0).clamp(0.0, 1.0)
        index = (u * (LIFT_GRID - 1)).round().long()
        return values[columns, index]

    return lift


#: An embedding's lift tables (a 100-knob embedding's: 1.6 MB).
LIFT_TABLES = _Bounded(8)


def inner_transfer(
    transfer: Transfer, embedding: HeSBOEmbedding, low_config: Callable[[tuple[float, ...]], Config]
) -> Transfer:
    """``transfer`` for an embedding's inner designer: its seeds as inner configurations
    (``HeSBOEmbedding.inverse``), its points lifted to the knobs."""
    seeds = tuple(low_config(embedding.inverse(seed)) for seed in transfer.seeds)
    return Transfer(transfer.sources, seeds, embedding_lift(embedding))
