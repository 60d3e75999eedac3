"""The constrained Bayesian-optimization designer, and the quasi-random designers.

One ``suggest`` call runs the whole policy over the stored history:

1. the knobs' default configuration first (when the study asks for it and it is feasible);
2. scrambled Sobol points until the initial design is complete;
3. then model-based suggestions: fit (``model.py``) -> acquisition (``acquisition.py``) ->
   acquisition optimization, with pending trials as ``X_pending``; a share
   ``random_fraction`` of them is replaced by random points.

With ``expert_priors`` the initial design and the first as many model-based suggestions stay
inside the knobs' recommended region, then the search widens (``priors.py``).

With a candidate list (``StudySpec.candidates``) every step picks among the untaken
candidates: Sobol points snap to the nearest, the acquisition is maximized exactly over the
list, random fill-ins are drawn from it (``candidates.py``). Three things differ for such
studies, each measured on the cloud benchmark (``bench/README.md``, cost after 10 trials):
the model sees the candidates' features when the study gives them (``FeatureEncoder``),
the objective's GP counts failed trials as the worst value seen (``model.py``), and
qLogNEI asks for an improvement of ``CANDIDATE_MARGIN`` standard deviations of the
observed objective (``acquisition.py``). A list of a few dozen deployments is searched in
ten trials, where a step toward a near neighbour of the best costs as much as one to a
far, uncertain one.

With ``trust_region`` (the LlamaTune designer turns it on for its inner designer) every
second model-based suggestion is local, TuRBO-style (Eriksson et al., NeurIPS 2019): Thompson
sampling (``acquisition.thompson_candidates``) among perturbations of the best trial inside a
box of side ``0.8`` of the unit box, stretched per knob by the GP's lengthscales, halved
after every ``3`` trials in a row without an improvement and back to ``0.8`` once it falls
below ``0.8 / 2^5``. The state is recomputed from the history on every call. Global BO in 16
or more dimensions keeps sampling the box's faces long after it has found the right basin;
the local half refines it, and a posterior sample (unlike the expected improvement) also
tries the side of the best point that the model is unsure about.

With ``trend_probe`` as well (the LlamaTune designer turns it on for embeddings of at most two
knobs per coordinate), a single-objective study's model-based steps start as *trend steps*:
global qLogNEI on GPs with a linear prior mean (``model.py``, ``trend``), which carry the
fitted slopes out to the faces of the box, where a constant-mean GP falls back to the
average. The measurements then decide: each trend step scores the share of earlier trials it
beat (0 for a trial that broke the system or failed); after ``TREND_PROBE`` (6) of them the
trend steps go on only while their mean score stays at or above ``TREND_KEEP`` (0.4). Once it
falls below, every later step is the step above, with the constant mean. Which trials were
trend steps is replayed from the history (the model-based trials in id order), so a
restarted server continues the same way. Trend steps are global only until the history holds
a random fill-in (a suggestion that kept projecting onto taken configurations, ``embedded.py``):
on plateaus of choice knobs and special values (MySQL JOB) global steps keep landing on
measured configurations, and from then on every second trend step is a trust-region step
again.

The two constants come from the first BO steps of runs with a trend on every step
(``bench/README.md``): on the MySQL SYSBENCH surrogate, whose good configurations lie on the
faces, the running mean score from the sixth step until the target was reached stayed at
or above 0.40 in 29 seeds of 30 (0.399 in the last); on Hartmann6 on 6 of 20 knobs, whose
optimum is inside, the mean of the first six steps was below 0.40 in 10 seeds of 10 (0.15 to
0.399: the faces score about 0.3 there). The threshold sits at the edge of both samples. A
trend on every step found SYSBENCH's faces fast but lost the interior optimum; a leave-one-out
comparison of the two means chose the trend on both problems' first steps.

Every suggestion is decoded to a valid configuration, checked against the linear parameter
constraints, and compared with every configuration already taken; a duplicate is replaced by
a random configuration. Numerical trouble (a Cholesky failure, NaNs, a fit that does not
converge) never reaches the client: the designer falls back to quasi-random points and records
a warning on the suggestion. All randomness derives from the study seed and the history size,
so a restarted server makes the same suggestions.
"""

from __future__ import annotations

import logging
import math
import random
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from botorch.acquisition import AcquisitionFunction

from tuner.designer.acquisition import (
    OptimizerSettings,
    build_acquisition,
    optimize_continuous,
    thompson_candidates,
)
from tuner.designer.base import Designer, History, Suggestion, derive_seed
from tuner.designer.local_search import LocalSearch
from tuner.designer.model import FitCache, fit_models, outcome_data
from tuner.designer.priors import PriorRegion
from tuner.designer.quasirandom import FeasibleSampler
from tuner.errors import StateError
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus, is_feasible, pareto_front, reference_point

log = logging.getLogger(__name__)
_WARNING_CHARS = 300
# Below this many observations a GP's linear algebra is small and intra-op threads only add
# overhead (and oversubscribe a shared CPU): measured 11 ms vs 38-120 ms per likelihood
# evaluation at n=17 on 2 busy cores.
_SINGLE_THREAD_BELOW = 400
# Trust region (see module doc): initial side, halvings before it starts again, and how many
# trials in a row without an improvement (by more than TR_IMPROVEMENT x |best|) halve it.
TR_LENGTH = 0.8
TR_HALVINGS = 5
TR_PATIENCE = 3
TR_IMPROVEMENT = 1e-3
# Candidate lists: qLogNEI counts only improvements beyond this many standard deviations of
# the objective's observations (``acquisition.build_acquisition``'s margin).
CANDIDATE_MARGIN = 0.5
# Trend probe (see module doc): trend steps before they are judged, and the mean share of
# earlier trials they must beat to go on.
TREND_PROBE = 6
TREND_KEEP = 0.4


class QuasiRandomDesigner(Designer):
    """Default config, then Sobol (``algorithm = "sobol"``) or uniform random points."""

    def __init__(self, spec: StudySpec) -> None:
        super().__init__(spec)
        self.sampler = FeasibleSampler(spec, self.encoder)
        self.region = PriorRegion.of(self.encoder) if spec.designer.expert_priors else None

    def suggest(
        self, count: int, completed: Sequence[Trial], pending: Sequence[Trial]
    ) -> list[Suggestion]:
        history = History.build(self.encoder, completed, pending)
        out = self.default_suggestion(history, count)
        out += self._space_filling(history, out, count - len(out), self.spec.designer.algorithm)
        return checked(out, count, self.spec)

    # -- shared policy steps -----------------------------------------------------------
    def default_suggestion(self, history: History, count: int) -> list[Suggestion]:
        """The default configuration, unless it was measured, is pending, or was abandoned.

        Like any configuration, a default whose trial FAILED (infrastructure) is tried again.
        """
        config = self.spec.space.default_config()
        if not self.spec.designer.start_with_default or config is None or count < 1:
            return []
        if self.encoder.key(config) in history.taken:
            return []
        if not self.spec.satisfies_parameter_constraints(config):
            log.warning(
                "study %s: default configuration breaks a parameter constraint", self.spec.name
            )
            return []
        return [Suggestion(config, "default")]

    def _space_filling(
        self, history: History, chosen: list[Suggestion], count: int, kind: str, warning: str = ""
    ) -> list[Suggestion]:
        if count <= 0:
            return []
        taken = history.taken | {self.encoder.key(s.config) for s in chosen}
        seed = derive_seed(self.spec.designer.seed, kind)
        if kind == "sobol":
            configs = self.sampler.sobol(seed, count, taken, self.region)
        elif kind == "fallback":  # a fresh scrambled sequence per history size
            configs = self.sampler.sobol(derive_seed(seed, history.size), count, taken)
        else:
            seed = derive_seed(self.spec.designer.seed, kind, history.size, len(chosen))
            configs = self.sampler.random(seed, count, taken)
        return [Suggestion(c, kind, warning) for c in configs]


class BODesigner(QuasiRandomDesigner):
    """Constrained BO with an initial Sobol design (``algorithm = "bo"``)."""

    def __init__(
        self,
        spec: StudySpec,
        cache: FitCache | None = None,
        settings: OptimizerSettings | None = None,
        trust_region: bool = False,
        trend_probe: bool = False,
    ) -> None:
        super().__init__(spec)
        self.cache = cache
        self.settings = settings or OptimizerSettings()
        self.trust_region = trust_region
        self.trend_probe = trend_probe

    def suggest(
        self, count: int, completed: Sequence[Trial], pending: Sequence[Trial]
    ) -> list[Suggestion]:
        history = History.build(self.encoder, completed, pending)
        out = self.default_suggestion(history, count)
        initial = self.spec.designer.initial_size(len(self.spec.space))
        n_sobol = max(0, min(count - len(out), initial - history.designed))
        if not any(t.status is TrialStatus.COMPLETED for t in history.observed):
            n_sobol = count - len(out)  # nothing to learn from yet
        out += self._space_filling(history, out, n_sobol, "sobol")
        if len(out) < count:
            # coarse-to-fine: as many model-based trials inside the prior region as the design
            designed = history.designed + sum(s.source != "default" for s in out)
            coarse = self.region is not None and designed < 2 * initial
            out += self._model_based(history, out, count - len(out), coarse)
        return checked(out, count, self.spec)

    def _model_based(
        self, history: History, chosen: list[Suggestion], count: int, coarse: bool = False
    ) -> list[Suggestion]:
        seed = derive_seed(self.spec.designer.seed, "bo", history.size, len(chosen))
        rng = random.Random(seed)
        n_random = sum(rng.random() < self.spec.designer.random_fraction for _ in range(count))
        local = None if coarse else self._local_box(history, chosen)
        try:
            points = self._optimize(history, chosen, count - n_random, seed, coarse, local)
        except Exception as err:  # numerical trouble is never the client's problem
            log.warning(
                "study %s: model-based suggestion failed, using quasi-random",
                self.spec.name,
                exc_info=True,
            )
            message = (
                f"model failed ({type(err).__name__}: {err}); used a quasi-random configuration"
            )
            return self._space_filling(history, chosen, count, "fallback", message[:_WARNING_CHARS])
        out = self._deduplicated(history, chosen, points)
        return out + self._space_filling(history, chosen + out, count - len(out), "random")

    def _local_box(
        self, history: History, chosen: list[Suggestion]
    ) -> tuple[list[float], float] | None:
        """Center and side of the trust region for this call, or None for a global step."""
        if not self.trust_region or self.spec.multi_objective or self.sampler.pool is not None:
            # a trust region follows one best trial (a Pareto front has many) in the unit box
            return None
        initial = self.spec.designer.initial_size(len(self.spec.space))
        step = history.designed + len(chosen) - initial  # model-based suggestions so far
        leaders = _leaders(self.spec, history.observed, 1)
        if step % 2 == 0 or not leaders:
            return None
        length = trust_region_length(self.spec, history.observed, initial)
        return self.encoder.encode(leaders[0]), length

    def _optimize(
        self,
        history: History,
        chosen: list[Suggestion],
        q: int,
        seed: int,
        coarse: bool,
        local: tuple[list[float], float] | None = None,
    ) -> list[Config]:
        if q <= 0:
            return []
        pool = self.sampler.pool
        # a candidate list: what the model sees of each (``candidates.py``), failures imputed
        encoder = pool.model_encoder if pool is not None else self.encoder
        data = outcome_data(self.spec, encoder, history.observed, impute_failures=pool is not None)
        pending = [t.config for t in history.pending] + [s.config for s in chosen]
        X_pending = encoder.encode_many(pending) if pending else None
        any_feasible = any(is_feasible(self.spec, t) for t in history.observed)
        with (
            warnings.catch_warnings(record=True) as caught,
            torch.random.fork_rng(),
            _threads(1 if len(history.observed) < _SINGLE_THREAD_BELOW else None),
        ):
            warnings.simplefilter("always")
            torch.manual_seed(seed)
            trend = self._trend_step(history, coarse)
            if trend and not _met_plateau(history):
                local = None  # a trend step is global: the slopes point to the faces
            model = fit_models(data, encoder, self.cache, self.spec.name, trend=trend)
            if local is not None:
                box = _box_region(local[0], local[1], _objective_lengthscales(model))
                candidates = thompson_candidates(
                    self.spec, model, data, local[0], box.lows, box.highs, q, seed
                )
            else:
                reference = reference_point(self.spec, history.observed)
                y = data[0].Y
                margin = 0.0
                if pool is not None and not self.spec.multi_objective and y.numel() > 1:
                    margin = CANDIDATE_MARGIN * float(y.std())
                acquisition = build_acquisition(
                    self.spec, model, data, data[0].X, X_pending, any_feasible, seed, reference,
                    margin,
                )  # fmt: skip
                region = self.region if coarse else None
                candidates = self._maximize(acquisition, history, chosen, q, seed, region)
        for w in caught:  # jitter and optimizer notes: logged, not recorded on the trial
            log.debug("study %s: %s: %s", self.spec.name, w.category.__name__, w.message)
        configs = [self.encoder.decode(row.tolist()) for row in candidates]
        return configs

    def _trend_step(self, history: History, coarse: bool) -> bool:
        """Whether this step is a trend step (module doc)."""
        if not self.trend_probe or coarse or self.spec.multi_objective:
            return False
        return self.sampler.pool is None and trend_probe_open(self.spec, history.observed)

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
        With a candidate list: the best untaken candidates (``candidates.py``).
        """
        taken = set(history.taken) | {self.encoder.key(s.config) for s in chosen}
        if self.sampler.pool is not None:
            pool = self.sampler.pool
            best = pool.best(acquisition, q, pool.untaken(taken, region))
            return self.encoder.encode_many(best)
        if not (self.encoder.discrete_dims or self.encoder.cat_dims):
            bounds = region.bounds() if region is not None else None
            return optimize_continuous(
                acquisition, self.encoder.d, q, self.sampler.inequalities, self.settings, bounds
            )
        search = LocalSearch(self.encoder, self.spec.satisfies_parameter_constraints, taken, region)
        return search.optimize(
            acquisition,
            q,
            anchors=self.encoder.encode_many(_leaders(self.spec, history.observed)),
            raw_samples=self.settings.raw_samples,
            num_restarts=self.settings.num_restarts,
            seed=seed,
        )

    def _deduplicated(
        self, history: History, chosen: list[Suggestion], configs: list[Config]
    ) -> list[Suggestion]:
        taken = set(history.taken) | {self.encoder.key(s.config) for s in chosen}
        out: list[Suggestion] = []
        for config in configs:
            repaired = self.sampler.feasible(config)
            if repaired is None or self.encoder.key(repaired) in taken:
                continue
            taken.add(self.encoder.key(repaired))
            out.append(Suggestion(repaired, "bo"))
        return out


def make_designer(spec: StudySpec, cache: FitCache | None = None) -> Designer:
    """The designer the study's settings ask for."""
    if spec.embedding is not None:
        from tuner.designer.embedded import EmbeddedDesigner  # it builds on this module

        return EmbeddedDesigner(spec, cache)
    if spec.designer.algorithm == "bo":
        return BODesigner(spec, cache)
    return QuasiRandomDesigner(spec)


@contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """Run torch with ``count`` intra-op threads (None: leave as is), then restore."""
    if count is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def trust_region_length(spec: StudySpec, observed: Sequence[Trial], skip: int = 0) -> float:
    """The trust region's side after ``observed`` (in trial id order; see module doc).

    The first ``skip`` trials (the initial design) set the best but count no failures.
    Trials with negative ids (a caller's pseudo-observations) are ignored.
    """
    name = spec.objective.name
    sign = -1.0 if spec.objective.goal.value == "maximize" else 1.0
    best: float | None = None
    failures = 0
    ordered = sorted((t for t in observed if t.id >= 0), key=lambda t: t.id)
    for index, trial in enumerate(ordered):
        value = trial.metrics.get(name)
        if value is not None and is_feasible(spec, trial):
            y = sign * value
            if best is None or y < best - TR_IMPROVEMENT * abs(best):
                best, failures = y, 0
                continue
        if best is not None and index >= skip:
            failures += 1
    return TR_LENGTH * 0.5 ** ((failures // TR_PATIENCE) % (TR_HALVINGS + 1))


def _met_plateau(history: History) -> bool:
    """Whether some trial is a random fill-in: a suggestion that kept projecting onto taken
    configurations (``embedded.py``), the mark of plateaus of choice knobs."""
    return any(t.source == "random" for t in (*history.observed, *history.pending))


def trend_probe_open(spec: StudySpec, observed: Sequence[Trial]) -> bool:
    """Whether the trend probe (module doc) still goes on after ``observed``.

    Replayed in trial id order: every model-based trial (source ``bo``) is a trend step while
    the probe is open; its score is the share of the earlier feasible trials it beat (0 when
    it has no feasible objective value); the probe stays open for ``TREND_PROBE`` scored steps
    and then while their mean score is at least ``TREND_KEEP``.
    """
    name = spec.objective.name
    sign = -1.0 if spec.objective.goal.value == "maximize" else 1.0
    earlier: list[float] = []  # signed feasible values so far (lower wins)
    scores: list[float] = []
    for trial in sorted((t for t in observed if t.id >= 0), key=lambda t: t.id):
        value = trial.metrics.get(name)
        ok = value is not None and math.isfinite(value) and is_feasible(spec, trial)
        y = sign * value if ok and value is not None else math.inf
        if trial.source == "bo" and earlier:
            scores.append(sum(e > y for e in earlier) / len(earlier))
            if len(scores) >= TREND_PROBE and sum(scores) / len(scores) < TREND_KEEP:
                return False
        if ok:
            earlier.append(y)
    return True


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


def checked(out: list[Suggestion], count: int, spec: StudySpec) -> list[Suggestion]:
    if not out and count > 0:
        raise StateError(
            f"study {spec.name}: the search space is exhausted; every valid configuration "
            "has been tried or is pending"
        )
    return out[:count]
