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

With ``designer.expert_priors`` the initial design is drawn from the knobs' recommended
region (``priors.py``) and mapped into the embedding.

Trials without a stored point (the default configuration, imported trials) count for the
best trial and for duplicates but are not shown to the model, as in LlamaTune: the point the
model would see for them is only an approximation (``HeSBOEmbedding.inverse``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from tuner.designer.acquisition import OptimizerSettings
from tuner.designer.base import Designer, History, Suggestion, derive_seed
from tuner.designer.bo import BODesigner, QuasiRandomDesigner, checked
from tuner.designer.model import FitCache
from tuner.embedding import HeSBOEmbedding, low_point_is_valid
from tuner.encoding import ConfigKey
from tuner.space import Config, IntKnob, SearchSpace
from tuner.study import StudySpec
from tuner.trial import OBSERVED, Trial, TrialStatus

_RANDOM_TRIES = 200
_ASK_ROUNDS = 4


def low_dimensional_spec(spec: StudySpec, embedding: HeSBOEmbedding) -> StudySpec:
    """The study the inner designer works on: the bucket index of each coordinate."""
    top = embedding.settings.buckets - 1
    knobs = tuple(IntKnob(name, low=0, high=top) for name in embedding.low_names)
    return StudySpec(
        name=spec.name,
        space=SearchSpace(knobs),
        objectives=spec.objectives,
        outcome_constraints=spec.outcome_constraints,
        designer=replace(spec.designer, start_with_default=False),
        allow_unsafe=True,
    )


class EmbeddedDesigner(Designer):
    """LlamaTune: default first, then an inner designer in the HeSBO embedding."""

    def __init__(
        self,
        spec: StudySpec,
        cache: FitCache | None = None,
        settings: OptimizerSettings | None = None,
    ) -> None:
        if spec.embedding is None:
            raise ValueError(f"study {spec.name} has no embedding")
        super().__init__(spec)
        self.embedding = HeSBOEmbedding(spec.space, spec.embedding)
        self.low_spec = low_dimensional_spec(spec, self.embedding)
        self.outer = QuasiRandomDesigner(spec)  # the default configuration and repairs
        self.inner: Designer = (
            BODesigner(self.low_spec, cache, settings)
            if spec.designer.algorithm == "bo"
            else QuasiRandomDesigner(self.low_spec)
        )

    def suggest(
        self, count: int, completed: Sequence[Trial], pending: Sequence[Trial]
    ) -> list[Suggestion]:
        history = History.build(self.encoder, completed, pending)
        out = self.outer.default_suggestion(history, count)
        low_completed, low_pending = self._low_trials(completed), self._low_trials(pending)
        out += self._prior_seeds(history, out, count - len(out), low_completed, low_pending)
        if len(out) < count:
            out += self._model_based(
                history, out, count - len(out), completed, low_completed, low_pending
            )
        return checked(out, count, self.spec)

    def _model_based(
        self,
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
        known = {self.encoder.key(t.config): t for t in completed if t.status in OBSERVED}
        low_completed = list(low_completed)  # grows with known repeats, for this call only
        low_pending = low_pending + [
            self._as_pending(s, -i) for i, s in enumerate(chosen, 1) if s.embedded
        ]
        taken = set(history.taken) | {self.encoder.key(s.config) for s in chosen}
        out: list[Suggestion] = []
        for _ in range(_ASK_ROUNDS):
            want = count - len(out)
            if want <= 0:
                break
            pending_now = low_pending + [self._as_pending(s, -1000 - i) for i, s in enumerate(out)]
            repeats = 0
            for suggestion in self.inner.suggest(want, low_completed, pending_now):
                point = self.embedding.point(
                    [int(suggestion.config[name]) for name in self.embedding.low_names]
                )
                config = self._feasible_projection(point)
                if config is None:
                    continue
                key = self.encoder.key(config)
                if key not in taken:
                    taken.add(key)
                    out.append(Suggestion(config, suggestion.source, suggestion.warning, point))
                    continue
                repeats += 1
                id_ = -2000 - len(low_completed) - len(low_pending)
                low = Trial(id_, self._low_config(point), TrialStatus.ACTIVE, embedded=point)
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
        seed = derive_seed(self.spec.designer.seed, "embedded", history.size, len(chosen))
        for i in range(missing):
            replacement = self._random(taken, derive_seed(seed, i))
            if replacement is None:
                break
            taken.add(self.encoder.key(replacement.config))
            out.append(replacement)
        return out

    def _as_pending(self, suggestion: Suggestion, id_: int) -> Trial:
        return Trial(
            id_, self._low_config(suggestion.embedded), TrialStatus.ACTIVE,
            embedded=suggestion.embedded,
        )  # fmt: skip

    def _prior_seeds(
        self,
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
        done = History.build(self.inner.encoder, low_completed, low_pending).designed
        initial = self.low_spec.designer.initial_size(self.embedding.d)
        n = min(count, initial - done)
        if n <= 0:
            return []
        seed = derive_seed(self.spec.designer.seed, "prior")
        samples = self.outer.sampler.sobol(seed, done + n, frozenset(), region)[done:]
        taken: set[ConfigKey] = set(history.taken) | {self.encoder.key(s.config) for s in chosen}
        out: list[Suggestion] = []
        for point in (self.embedding.inverse(config) for config in samples):
            config = self._feasible_projection(point)
            if config is not None and self.encoder.key(config) not in taken:
                made: Suggestion | None = Suggestion(config, "sobol", "", point)
            else:
                seed = derive_seed(self.spec.designer.seed, "embedded", history.size, len(out))
                made = self._random(taken, seed)
            if made is not None:
                taken.add(self.encoder.key(made.config))
                out.append(made)
        return out

    def _low_config(self, point: tuple[float, ...]) -> Config:
        return dict(zip(self.embedding.low_names, self.embedding.levels(point), strict=True))

    def low_trial(self, trial: Trial) -> Trial | None:
        """``trial`` as the inner designer sees it, or None when it has no valid point."""
        if not low_point_is_valid(trial.embedded, self.embedding.d):
            return None
        return replace(trial, config=self._low_config(trial.embedded))

    def _low_trials(self, trials: Sequence[Trial]) -> list[Trial]:
        return [low for t in trials if (low := self.low_trial(t)) is not None]

    def _feasible_projection(self, point: tuple[float, ...]) -> Config | None:
        """The configuration of ``point``, moved inside the linear constraints (or None)."""
        return self.outer.sampler.nearest_feasible(self.embedding.project(point))

    def _random(self, taken: set[ConfigKey], seed: int) -> Suggestion | None:
        """The projection of a random low-dimensional point that is feasible and new."""
        rng = random.Random(seed)
        for _ in range(_RANDOM_TRIES):
            point = self.embedding.bucketize(
                [rng.uniform(-1.0, 1.0) for _ in range(self.embedding.d)]
            )
            config = self._feasible_projection(point)
            if config is not None and self.encoder.key(config) not in taken:
                return Suggestion(config, "random", "", point)
        return None
