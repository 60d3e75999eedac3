"""The constrained Bayesian-optimization designer: it executes the generation strategy.

``strategy.py`` chooses each suggestion's step (default, Sobol design, random, prior region,
global, local, trend); this module carries the steps out. Space-filling steps come from the
quasi-random designer it builds on (``sampling/quasirandom.py``). A model-based step fits one
GP per outcome (``models/model.py``), builds the acquisition (``acquisition/criteria.py``:
qLogNEI with outcome constraints, qLogNEHVI with several objectives, qLogPoF until a trial is
feasible; pending trials as ``X_pending``) and maximizes it: multi-start L-BFGS-B on
continuous spaces, a batched local search over valid configurations otherwise
(``acquisition/local_search.py``), the exact optimum over a candidate list
(``sampling/candidates.py``), Thompson sampling in the trust region for a LOCAL step. A
call's model-based slots of one kind are chosen jointly (sequential greedy, each pick
pending for the next).

Candidate-list studies differ in three ways, each measured on the cloud benchmark: the
model sees the candidates' features when the study gives them (``FeatureEncoder``), the
objective's GP counts failed trials as the worst value seen (``models/model.py``), and qLogNEI asks
for an improvement of ``GlobalStep.candidate_margin`` standard deviations.

Every suggestion is decoded to a valid configuration, checked against the linear parameter
constraints, and compared with every configuration already taken; a duplicate is replaced
by a random configuration (a FILL_IN). Numerical trouble (``NUMERICAL_ERRORS``: a Cholesky
failure, NaNs, a fit that cannot be done) never reaches the client: the step's
configurations come from a quasi-random sequence instead (FALLBACK) with a warning recorded
on the trial. Any other exception is a bug and propagates. In strict mode
(``tuner.runtime.STRICT``; the test suite runs strict) numerical errors propagate too.

All randomness derives from the study seed and the history size (and the salt of a call
asked again after a lost race, ``History.salt``) and is passed down explicitly (seeds,
``torch.Generator``s): nothing reads or reseeds torch's global generator, and the number
of torch threads is set once at start-up (``tuner.runtime``), so a restarted server makes
the same suggestions. One process computes one model-based step at a time
(``MODEL_LOCK``): measured here, a qLogNEI value and gradient at the same point came out
different in the 14th digit while another thread computed with torch, enough to move
L-BFGS-B's answer, and GPyTorch keeps its settings per process, not per thread. So studies
suggested at the same time get exactly what each gets alone; the server's parallelism
across studies comes from worker processes, not threads.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import replace

import torch
from botorch.acquisition import AcquisitionFunction
from botorch.models import SingleTaskGP

from tuner import runtime
from tuner.designer.acquisition.criteria import (
    OptimizerSettings,
    build_acquisition,
    optimize_continuous,
    thompson_candidates,
)
from tuner.designer.acquisition.local_search import LocalSearch
from tuner.designer.base import History, Suggestion, checked
from tuner.designer.models import forest
from tuner.designer.models.means import Prior
from tuner.designer.models.model import (
    NUMERICAL_ERRORS,
    FitCache,
    distinct_rows,
    fit_models,
    outcome_data,
)
from tuner.designer.models.transfer import Transfer
from tuner.designer.sampling.priors import PriorRegion
from tuner.designer.sampling.quasirandom import QuasiRandomDesigner
from tuner.designer.strategy import (
    GLOBAL,
    DefaultStep,
    ExploreStep,
    ForestStep,
    LocalStep,
    PriorStep,
    RandomStep,
    SobolStep,
    Step,
    TransferStep,
    TrendStep,
    plan,
    read_situation,
    trust_region_length,
)
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, is_feasible, pareto_front, reference_point

log = logging.getLogger(__name__)
_WARNING_CHARS = 300
#: Held while a model-based step computes (module doc).
MODEL_LOCK = threading.Lock()


class BODesigner(QuasiRandomDesigner):
    """Constrained BO with an initial Sobol design (``algorithm = "bo"``)."""

    def __init__(
        self,
        spec: StudySpec,
        cache: FitCache | None = None,
        settings: OptimizerSettings | None = None,
        trust_region: bool = False,
        trend_probe: bool = False,
        transfer: Transfer | None = None,
    ) -> None:
        super().__init__(spec)
        self.cache = cache
        self.settings = settings or OptimizerSettings()
        self.trust_region = trust_region
        self.trend_probe = trend_probe
        self.transfer = transfer

    def suggest(
        self, count: int, completed: Sequence[Trial], pending: Sequence[Trial], salt: int = 0
    ) -> list[Suggestion]:
        retry = self.spec.designer.retry_failed
        history = History.build(self.encoder, completed, pending, retry, salt)
        steps = self.plan(history, count)
        out: list[Suggestion] = []
        for step in steps:  # in order: the default, then the design
            if isinstance(step, DefaultStep):
                out += self.default_suggestion(history)
            elif isinstance(step, TransferStep):
                out += self._seed(history, out)
            elif isinstance(step, SobolStep):
                out += self.space_filling(history, out, 1, StepKind.SOBOL)
        model_steps = [s for s in steps if s.kind.model_based]
        out += self._model_based(history, out, model_steps)
        n_random = sum(isinstance(s, RandomStep) for s in steps)
        out += self.space_filling(history, out, n_random, StepKind.RANDOM)
        n_explore = sum(isinstance(s, ExploreStep) for s in steps)
        out += self.space_filling(history, out, n_explore, StepKind.EXPLORE)
        return checked(out, count, self.spec)

    def plan(self, history: History, count: int) -> list[Step]:
        """The steps of this call (``strategy.plan``)."""
        first = read_situation(
            self.spec,
            history,
            prior_region=self.region is not None,
            trust_region=self.trust_region,
            trend_probe=self.trend_probe,
        )
        first = replace(
            first, default_due=self.default_due(history), seeds=len(self._seeds(history, []))
        )
        return plan(self.spec, history, first, count)

    def _seeds(self, history: History, chosen: list[Suggestion]) -> list[Config]:
        """The transfer seeds (``TransferStep``) not taken yet, each made valid."""
        if self.transfer is None:
            return []
        taken = set(history.taken) | {self.encoder.key(s.config) for s in chosen}
        out = []
        for seed in self.transfer.seeds:
            config = self.sampler.feasible(seed)
            if config is not None and self.encoder.key(config) not in taken:
                taken.add(self.encoder.key(config))
                out.append(config)
        return out

    def _seed(self, history: History, chosen: list[Suggestion]) -> list[Suggestion]:
        """The next transfer seed, or a Sobol point when another suggestion took it."""
        seeds = self._seeds(history, chosen)
        if not seeds:
            return self.space_filling(history, chosen, 1, StepKind.SOBOL)
        return [Suggestion(seeds[0], StepKind.TRANSFER)]

    def _model_based(
        self, history: History, chosen: list[Suggestion], steps: list[Step]
    ) -> list[Suggestion]:
        """The model-based slots, grouped by step (each group one joint batch)."""
        out: list[Suggestion] = []
        for step, q in _grouped(steps):
            made = chosen + out
            seed = history.seed(self.spec.designer.seed, "bo", history.size, len(made))
            try:
                with MODEL_LOCK:
                    configs, weights = self._propose(step, q, history, made, seed)
            except NUMERICAL_ERRORS as err:  # numerical trouble is never the client's problem
                if runtime.STRICT:
                    raise
                log.warning(
                    "study %s: model-based suggestion failed, using quasi-random",
                    self.spec.name,
                    exc_info=True,
                )
                message = (
                    f"model failed ({type(err).__name__}: {err}); used a quasi-random configuration"
                )
                out += self.space_filling(
                    history, made, q, StepKind.FALLBACK, message[:_WARNING_CHARS]
                )
                continue
            fresh = self._deduplicated(history, made, configs, step.kind)
            if weights:
                fresh = [replace(s, transfer=tuple(sorted(weights.items()))) for s in fresh]
            out += fresh
            out += self.space_filling(history, made + fresh, q - len(fresh), StepKind.FILL_IN)
        return out

    def _propose(
        self, step: Step, q: int, history: History, chosen: list[Suggestion], seed: int
    ) -> tuple[list[Config], dict[str, float]]:
        """``q`` configurations of a model-based ``step`` (not yet de-duplicated), and the
        transfer weights of the model that chose them (empty without sources)."""
        if isinstance(step, ForestStep):  # no GP: the forest alone (``models/forest.py``)
            rows = forest.propose(self.spec, self.encoder, history.observed, q, seed)
            return [self.encoder.decode(row) for row in rows], {}
        pool = self.sampler.pool
        # a candidate list: what the model sees of each (``sampling/candidates.py``), failures
        # imputed
        encoder = pool.model_encoder if pool is not None else self.encoder
        data = outcome_data(self.spec, encoder, history.observed, impute_failures=pool is not None)
        pending = [t.config for t in history.pending] + [s.config for s in chosen]
        X_pending = encoder.encode_many(pending) if pending else None
        any_feasible = any(is_feasible(self.spec, t) for t in history.observed)
        trend = isinstance(step, TrendStep) or (isinstance(step, LocalStep) and step.trend_mean)
        leaders = _leaders(self.spec, history.observed, 1)
        prior: Prior | None = None
        weights: dict[str, float] = {}
        objective = self.spec.objective.name
        if self.transfer is not None and pool is None and data and data[0].name == objective:
            # the study's own GP first (cached as always): its ranking is the sources' yardstick
            plain = fit_models(data[:1], encoder, self.cache, self.spec.name)
            assert isinstance(plain, SingleTaskGP)  # one outcome: one GP
            prior, weights = self.transfer.step(objective, plain, seed)
        model = fit_models(data, encoder, self.cache, self.spec.name, trend=trend, prior=prior)
        if isinstance(step, LocalStep) and leaders:
            center = self.encoder.encode(leaders[0])
            initial = self.spec.designer.initial_size(len(self.spec.space))
            length = trust_region_length(self.spec, history.observed, initial, step)
            box = _box_region(center, length, _objective_lengthscales(model))
            candidates = thompson_candidates(
                self.spec, model, data, center, box.lows, box.highs, q, seed
            )
            return [self.encoder.decode(row.tolist()) for row in candidates], weights
        reference = reference_point(self.spec, history.observed)
        y = data[0].Y
        margin = 0.0
        if pool is not None and not self.spec.multi_objective and y.numel() > 1:
            margin = GLOBAL.candidate_margin * float(y.std())
        acquisition = build_acquisition(
            self.spec, model, data, distinct_rows(data[0].X), X_pending, any_feasible, seed,
            reference,
            margin,
        )  # fmt: skip
        region = self.region if isinstance(step, PriorStep) else None
        candidates = self._maximize(acquisition, history, chosen, q, seed, region)
        return [self.encoder.decode(row.tolist()) for row in candidates], weights

    def _maximize(
        self,
        acquisition: AcquisitionFunction,
        history: History,
        chosen: list[Suggestion],
        q: int,
        seed: int,
        region: PriorRegion | None,
    ) -> torch.Tensor:
        """``q x d`` maximizers: L-BFGS-B on continuous spaces, local search otherwise.

        ``region``: only inside it (the prior region in the coarse phase of expert priors).
        Trust-region steps do not come here: they use ``thompson_candidates``.
        With a candidate list: the best untaken candidates (``sampling/candidates.py``).
        """
        taken = set(history.taken) | {self.encoder.key(s.config) for s in chosen}
        if self.sampler.pool is not None:
            pool = self.sampler.pool
            best = pool.best(acquisition, q, pool.untaken(taken, region))
            return self.encoder.encode_many(best)
        if not (self.encoder.discrete_dims or self.encoder.cat_dims):
            bounds = region.bounds() if region is not None else None
            return optimize_continuous(
                acquisition, self.encoder.d, q, self.sampler.inequalities, self.settings, seed,
                bounds,
            )  # fmt: skip
        constrained = bool(self.spec.parameter_constraints)
        is_valid = self.spec.satisfies_parameter_constraints if constrained else None
        search = LocalSearch(self.encoder, is_valid, taken, region)
        return search.optimize(
            acquisition,
            q,
            anchors=self.encoder.encode_many(_leaders(self.spec, history.observed)),
            raw_samples=self.settings.raw_samples,
            num_restarts=self.settings.num_restarts,
            seed=seed,
        )

    def _deduplicated(
        self, history: History, chosen: list[Suggestion], configs: list[Config], kind: StepKind
    ) -> list[Suggestion]:
        taken = set(history.taken) | {self.encoder.key(s.config) for s in chosen}
        out: list[Suggestion] = []
        for config in configs:
            repaired = self.sampler.feasible(config)
            if repaired is None or self.encoder.key(repaired) in taken:
                continue
            taken.add(self.encoder.key(repaired))
            out.append(Suggestion(repaired, kind))
        return out


def _objective_lengthscales(model: object) -> list[float] | None:
    """ARD lengthscales of the objective's GP (the first output), or None."""
    if hasattr(model, "models"):
        model = model.models[0]  # type: ignore[attr-defined]
    kernel = getattr(model, "covar_module", None)
    lengthscale = getattr(kernel, "lengthscale", None)
    if lengthscale is None:
        return None
    values = lengthscale.detach().reshape(-1, lengthscale.shape[-1])[0]
    return [float(v) for v in values]


def _box_region(
    center: list[float], length: float, lengthscales: list[float] | None
) -> PriorRegion:
    """The trust region: a box of side ``length`` around ``center``, each side stretched in
    proportion to the knob's lengthscale (geometric mean 1, TuRBO), clipped to the unit box."""
    d = len(center)
    weights = [1.0] * d
    if lengthscales is not None and len(lengthscales) == d and all(v > 0 for v in lengthscales):
        mean = sum(lengthscales) / d
        scaled = [v / mean for v in lengthscales]
        geometric = math.exp(sum(math.log(v) for v in scaled) / d)
        weights = [v / geometric for v in scaled]
    lows = tuple(max(0.0, c - w * length / 2) for c, w in zip(center, weights, strict=True))
    highs = tuple(min(1.0, c + w * length / 2) for c, w in zip(center, weights, strict=True))
    return PriorRegion(lows, highs, {})


def _leaders(spec: StudySpec, observed: tuple[Trial, ...], k: int = 5) -> list[Config]:
    """Configurations of the ``k`` best trials: feasible ones by objective, then the rest
    (with several objectives: the Pareto front first, then by the first objective)."""
    name = spec.objective.name
    sign = -1.0 if spec.objective.goal.value == "maximize" else 1.0
    front = pareto_front(spec, observed) if spec.multi_objective else []
    ids = {t.id for t in front}
    measured = [t for t in observed if name in t.metrics and t.id not in ids]
    ranked = sorted(measured, key=lambda t: (not is_feasible(spec, t), sign * t.metrics[name]))
    return [t.config for t in [*front, *ranked][:k]]


def _grouped(steps: list[Step]) -> list[tuple[Step, int]]:
    """Each distinct step with the number of slots it takes, in order of first appearance."""
    counts: dict[Step, int] = {}
    for step in steps:
        counts[step] = counts.get(step, 0) + 1
    return list(counts.items())
