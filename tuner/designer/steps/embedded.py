"""The LlamaTune designer: any designer, run in a low-dimensional embedding of the knobs.

A study with ``embedding = {kind = "llamatune"}`` is searched in ``[-1, 1]^d`` (``d = 16`` by
default) and each point is projected onto the knobs by ``tuner.embedding.HeSBOEmbedding``.
The policy, over the stored history:

1. the knobs' default configuration first, outside the embedding (the projection cannot
   generally express it), as LlamaTune evaluates it as iteration 0;
2. every other suggestion comes from an inner designer (constrained BO, Sobol or random, as
   the study's designer settings say) working on a *low-dimensional study*: ``d`` knobs
   ``z0 .. z{d-1}``, each the bucket index ``0 .. buckets - 1`` of one coordinate (integer
   knobs, so the inner designer rounds to the bucket grid and recognizes its own points),
   the same objective and outcome constraints. It learns from the trials'
   stored low-dimensional points, sees pending trials' points as pending, and knows nothing
   of the original knobs;
3. each low-dimensional suggestion is bucketized, projected, and checked against the linear
   parameter constraints on the original knobs (a violating projection is repaired to the
   nearest feasible integer configuration where the constraint allows, otherwise rejected)
   and against every configuration already taken. A rejected or duplicate projection (two
   low-dimensional points can project onto one configuration when a coordinate only drives
   choice knobs) is replaced by the projection of a random low-dimensional point.
4. the embedding grows when the search stalls: after ``grow_after`` observed trials in a row
   (10 by default, counted after the initial design) without a significant improvement of the
   best feasible objective, the next suggestions come from the next *level*, which splits
   coordinates in two (``HeSBOEmbedding`` levels: 16, 32, 64, ... up to the number of
   knobs). Every stored point is lifted exactly into the larger embedding, so the model
   keeps all it learned (nested embeddings, as in BAxUS: Papenmeier et al., NeurIPS 2022).
   This is the remedy for HeSBO's blind spot: with probability about ``1/d`` two knobs that
   matter share a coordinate, and the embedding then only holds configurations where they
   move together. The level is a function of the stored trials (the growth rule replayed in
   trial order, and the longest stored point), so a restarted server resumes at the same
   level.

The inner BO designer searches half of its suggestions in a trust region around the best
trial (``BODesigner(trust_region=True)``): in 16 or more dimensions global BO keeps sampling
the faces of the box after it has found the right basin.

Where the embedding holds at most ``TrendStep.narrow`` (2) knobs per coordinate at level 0
(20 MySQL knobs in 16 dimensions, 5 in 4), each coordinate stands for one knob or two, and the
inner designer also runs the *trend probe* (``BODesigner(trend_probe=True)``): its first
model-based steps are global steps on GPs with a linear prior mean, which carry the fitted
slopes out to the faces of the box, and they go on only while the trials they produce beat,
on average, at least 40 % of the earlier ones (``steps/bo.py``). On wider embeddings (Branin and
Hartmann6 in D = 100 or 1000, 111 PostgreSQL knobs in 16) a coordinate is the signed sum of
many knobs, its slope is no knob's trend, and a linear mean imposed there lost on Branin
D = 100 (1.59 at 50 evaluations against 0.46): they keep the constant mean.

With ``designer.expert_priors`` the initial design is drawn from the knobs' recommended
region (``sampling/priors.py``) and mapped into the embedding.

Trials without a stored point (the default configuration, imported trials) count for the
best trial and for duplicates but are not shown to the model, as in LlamaTune: the point the
model would see for them is only an approximation (``HeSBOEmbedding.inverse``).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tuner.designer.acquisition.criteria import OptimizerSettings
from tuner.designer.base import Designer, History, Suggestion, checked, derive_seed
from tuner.designer.models.model import FitCache
from tuner.designer.models.transfer import Transfer, inner_transfer
from tuner.designer.sampling.quasirandom import QuasiRandomDesigner
from tuner.designer.steps.bo import BODesigner
from tuner.designer.strategy import TREND
from tuner.embedding import HeSBOEmbedding, low_point_is_valid
from tuner.encoding import ConfigKey
from tuner.space import Config, IntKnob, SearchSpace
from tuner.study import StudySpec
from tuner.trial import OBSERVED, StepKind, Trial, TrialStatus, dominates, is_feasible

_RANDOM_TRIES = 200
_ASK_ROUNDS = 6
# The growth rule's significant improvement, relative to the median feasible value's distance
# from the best (scale-free, and robust to the huge values of a bad initial design).
GROW_IMPROVEMENT = 0.01


def low_dimensional_spec(spec: StudySpec, embedding: HeSBOEmbedding) -> StudySpec:
    """The study the inner designer works on: the bucket index of each coordinate."""
    top = embedding.settings.buckets - 1
    knobs = tuple(IntKnob(name, low=0, high=top) for name in embedding.low_names)
    return StudySpec(
        name=spec.name,
        space=SearchSpace(knobs),
        objectives=spec.objectives,
        # a relative constraint still waiting for the default's value cannot be judged
        outcome_constraints=tuple(c for c in spec.outcome_constraints if not c.relative),
        designer=replace(spec.designer, start_with_default=False),
        allow_unsafe=True,
    )


@dataclass(frozen=True)
class Stage:
    """One level of the embedding, with the inner designer working on it."""

    embedding: HeSBOEmbedding
    low_spec: StudySpec
    inner: Designer

    def low_config(self, point: tuple[float, ...]) -> Config:
        return _low_config(self.embedding)(point)


def _low_config(embedding: HeSBOEmbedding) -> Callable[[tuple[float, ...]], Config]:
    """Low-dimensional point -> the inner designer's configuration (bucket indices)."""
    return lambda point: dict(zip(embedding.low_names, embedding.levels(point), strict=True))


class EmbeddedDesigner(Designer):
    """LlamaTune: default first, then an inner designer in the HeSBO embedding."""

    def __init__(
        self,
        spec: StudySpec,
        cache: FitCache | None = None,
        settings: OptimizerSettings | None = None,
        transfer: Transfer | None = None,
    ) -> None:
        if spec.embedding is None:
            raise ValueError(f"study {spec.name} has no embedding")
        super().__init__(spec)
        self.settings = spec.embedding
        self._cache, self._optimizer = cache, settings
        self._transfer = transfer
        self._stages: dict[int, Stage] = {}
        base = self.stage(0)
        self.embedding, self.low_spec = base.embedding, base.low_spec  # level 0
        self.outer = QuasiRandomDesigner(spec)  # the default configuration and repairs

    def stage(self, level: int) -> Stage:
        """The embedding at ``level`` (0: as configured; each level splits coordinates)."""
        if level not in self._stages:
            embedding = HeSBOEmbedding(self.spec.space, self.settings, level)
            low_spec = low_dimensional_spec(self.spec, embedding)
            narrow = len(self.spec.space) <= TREND.narrow * embedding.sizes[0]
            transfer = None
            if self._transfer is not None:  # the sources, reached through this embedding
                transfer = inner_transfer(self._transfer, embedding, _low_config(embedding))
            inner: Designer = (
                BODesigner(
                    low_spec,
                    self._cache,
                    self._optimizer,
                    True,
                    trend_probe=narrow,
                    transfer=transfer,
                )
                if self.spec.designer.algorithm == "bo"
                else QuasiRandomDesigner(low_spec)
            )
            self._stages[level] = Stage(embedding, low_spec, inner)
        return self._stages[level]

    def level(self, completed: Sequence[Trial], pending: Sequence[Trial]) -> int:
        """The level to suggest at: the highest of any stored point's level and of the level
        the growth rule reaches over the completed trials (module doc, step 4)."""
        sizes = self.embedding.sizes
        stored = max(
            (sizes.index(len(t.embedded)) for t in (*completed, *pending)
             if low_point_is_valid(t.embedded, sizes)),
            default=0,
        )  # fmt: skip
        return max(stored, grown_level(self.spec, completed, len(sizes) - 1))

    def suggest(
        self, count: int, completed: Sequence[Trial], pending: Sequence[Trial], salt: int = 0
    ) -> list[Suggestion]:
        retry = self.spec.designer.retry_failed
        history = History.build(self.encoder, completed, pending, retry, salt)
        out = self.outer.default_suggestion(history) if count > 0 else []
        stage = self.stage(self.level(completed, pending))
        low_completed = self._low_trials(stage, completed)
        low_pending = self._low_trials(stage, pending)
        out += self._prior_seeds(stage, history, out, count - len(out), low_completed, low_pending)
        if len(out) < count:
            out += self._model_based(
                stage, history, out, count - len(out), completed, low_completed, low_pending
            )
        return checked(out, count, self.spec)

    def _model_based(
        self,
        stage: Stage,
        history: History,
        chosen: list[Suggestion],
        count: int,
        completed: Sequence[Trial],
        low_completed: list[Trial],
        low_pending: list[Trial],
    ) -> list[Suggestion]:
        """Ask the inner designer; a point that projects onto a configuration already taken
        is *known*: it joins the inner history with that trial's outcome (or as pending), and
        the inner designer is asked again, up to ``_ASK_ROUNDS`` times.

        Many low-dimensional points share one projection (a coordinate driving only integer
        or choice knobs changes nothing over whole runs of buckets), so without this the model
        keeps proposing points of plateaus it has in fact measured.
        """
        known = {self.encoder.key(t.config): t for t in history.observed}
        low_completed = list(low_completed)  # grows with known repeats, for this call only
        low_pending = low_pending + [
            self._as_pending(stage, s, -i) for i, s in enumerate(chosen, 1) if s.embedded
        ]
        taken = set(history.taken) | {self.encoder.key(s.config) for s in chosen}
        out: list[Suggestion] = []
        for _ in range(_ASK_ROUNDS):
            want = count - len(out)
            if want <= 0:
                break
            pending_now = low_pending + [
                self._as_pending(stage, s, -1000 - i) for i, s in enumerate(out)
            ]
            repeats = 0
            for suggestion in stage.inner.suggest(want, low_completed, pending_now, history.salt):
                point = stage.embedding.point(
                    [int(suggestion.config[name]) for name in stage.embedding.low_names]
                )
                config = self._feasible_projection(stage, point)
                if config is None:
                    continue
                key = self.encoder.key(config)
                if key not in taken:
                    taken.add(key)
                    out.append(replace(suggestion, config=config, embedded=point))
                    continue
                repeats += 1
                id_ = -2000 - len(low_completed) - len(low_pending)
                low = Trial(id_, stage.low_config(point), TrialStatus.ACTIVE, embedded=point)
                if key in known:  # measured: the model learns this point's value
                    twin = known[key]
                    low_completed.append(
                        replace(low, status=twin.status, metrics=dict(twin.metrics), reason="")
                    )
                else:  # pending or chosen in this call: the model treats it as pending
                    low_pending.append(low)
            if repeats == 0:
                break
        missing = count - len(out)
        seed = history.seed(self.spec.designer.seed, "embedded", history.size, len(chosen))
        for i in range(missing):
            replacement = self._random(stage, taken, derive_seed(seed, i))
            if replacement is None:
                break
            taken.add(self.encoder.key(replacement.config))
            out.append(replacement)
        return out

    @staticmethod
    def _as_pending(stage: Stage, suggestion: Suggestion, id_: int) -> Trial:
        return Trial(
            id_, stage.low_config(suggestion.embedded), TrialStatus.ACTIVE,
            embedded=suggestion.embedded,
        )  # fmt: skip

    def _prior_seeds(
        self,
        stage: Stage,
        history: History,
        chosen: list[Suggestion],
        count: int,
        low_completed: list[Trial],
        low_pending: list[Trial],
    ) -> list[Suggestion]:
        """With expert priors, the initial design: Sobol points of the recommended region
        mapped into the embedding (``inverse``) and projected back.

        In an embedding the prior seeds the initial design only: the region of the original
        knobs is not a box of the low-dimensional space, so the model-based search that
        follows is not confined to it.
        """
        region = self.outer.region
        if region is None or count <= 0:
            return []
        retry = self.spec.designer.retry_failed
        done = History.build(stage.inner.encoder, low_completed, low_pending, retry).designed
        initial = stage.low_spec.designer.initial_size(stage.embedding.d)
        n = min(count, initial - done)
        if n <= 0:
            return []
        seed = derive_seed(self.spec.designer.seed, "prior")
        samples = self.outer.sampler.sobol(seed, done + n, frozenset(), region)[done:]
        taken: set[ConfigKey] = set(history.taken) | {self.encoder.key(s.config) for s in chosen}
        out: list[Suggestion] = []
        for point in (stage.embedding.inverse(config) for config in samples):
            config = self._feasible_projection(stage, point)
            if config is not None and self.encoder.key(config) not in taken:
                made: Suggestion | None = Suggestion(config, StepKind.SOBOL, "", point)
            else:
                seed = history.seed(self.spec.designer.seed, "embedded", history.size, len(out))
                made = self._random(stage, taken, seed)
            if made is not None:
                taken.add(self.encoder.key(made.config))
                out.append(made)
        return out

    def low_trial(self, trial: Trial, stage: Stage | None = None) -> Trial | None:
        """``trial`` as the inner designer of ``stage`` (default: level 0) sees it, or None
        when it has no valid point of that level or an earlier one."""
        stage = stage or self.stage(0)
        sizes = stage.embedding.sizes[: stage.embedding.level + 1]
        if not low_point_is_valid(trial.embedded, sizes):
            return None
        point = stage.embedding.lift(trial.embedded)
        return replace(trial, config=stage.low_config(point), embedded=point)

    def _low_trials(self, stage: Stage, trials: Sequence[Trial]) -> list[Trial]:
        return [low for t in trials if (low := self.low_trial(t, stage)) is not None]

    def _feasible_projection(self, stage: Stage, point: tuple[float, ...]) -> Config | None:
        """The configuration of ``point``, moved inside the linear constraints (or None)."""
        return self.outer.sampler.nearest_feasible(stage.embedding.project(point))

    def _random(self, stage: Stage, taken: set[ConfigKey], seed: int) -> Suggestion | None:
        """The projection of a random low-dimensional point that is feasible and new."""
        rng = random.Random(seed)
        for _ in range(_RANDOM_TRIES):
            point = stage.embedding.bucketize(
                [rng.uniform(-1.0, 1.0) for _ in range(stage.embedding.d)]
            )
            config = self._feasible_projection(stage, point)
            if config is not None and self.encoder.key(config) not in taken:
                return Suggestion(config, StepKind.FILL_IN, "", point)
        return None


def grown_level(spec: StudySpec, completed: Sequence[Trial], top: int) -> int:
    """The level the growth rule reaches over ``completed`` (module doc, step 4), at most
    ``top``: one level up each time ``grow_after`` observed trials in a row (in id order,
    after the initial design and the default configuration) fail to improve the best
    feasible objective by more than ``GROW_IMPROVEMENT`` of the distance from the median
    feasible value to the best. With several objectives a trial improves when no earlier
    feasible trial dominates or equals it."""
    patience = spec.embedding.grow_after if spec.embedding is not None else 0
    if patience <= 0 or top <= 0 or spec.embedding is None or spec.embedding.dims is None:
        return 0
    skip = spec.designer.initial_size(spec.embedding.dims) + 1  # the design and the default
    name = spec.objective.name
    sign = -1.0 if spec.objective.goal.value == "maximize" else 1.0
    values: list[float] = []  # feasible objective values so far, sorted (signed: lower wins)
    level = stalled = 0
    ordered = sorted((t for t in completed if t.status in OBSERVED and t.id >= 0),
                     key=lambda t: t.id)  # fmt: skip
    front: list[Trial] = []  # several objectives: a trial improves when it joins the front
    seen = False  # some trial so far was feasible
    for index, trial in enumerate(ordered):
        value = trial.metrics.get(name)
        improved = False
        if spec.multi_objective:
            if is_feasible(spec, trial):
                improved, seen = _joins_front(spec, front, trial), True
        elif value is not None and math.isfinite(value) and is_feasible(spec, trial):
            y = sign * value
            if values:
                margin = GROW_IMPROVEMENT * (values[len(values) // 2] - values[0])
                improved = y < values[0] - margin
            else:
                improved = True
            bisect.insort(values, y)
            seen = True
        if improved:
            stalled = 0
            continue
        if seen and index >= skip:
            stalled += 1
            if stalled >= patience:
                level, stalled = level + 1, 0
                if level == top:
                    return level
    return level


def _joins_front(spec: StudySpec, front: list[Trial], trial: Trial) -> bool:
    """Add ``trial`` to ``front`` (in place) unless a member dominates or equals it."""
    names = [o.name for o in spec.objectives]
    for member in front:
        if dominates(spec, member.metrics, trial.metrics) or all(
            member.metrics[n] == trial.metrics[n] for n in names
        ):
            return False
    front[:] = [m for m in front if not dominates(spec, trial.metrics, m.metrics)]
    front.append(trial)
    return True
