"""Trials, their life cycle, and feasibility-aware ranking.

A trial is one configuration of a study and what happened to it. Its status owns the
allowed transitions::

    PENDING ──> ACTIVE ──> COMPLETED     measured; metrics recorded
       │           ├─────> INFEASIBLE    the configuration broke the system (reason recorded)
       │           ├─────> FAILED        infrastructure failure, not the config's fault
       │           ├─────> TIMED_OUT     the measurement ran past its time limit
       │           └─────> ABANDONED     given up by the client (never re-suggested)
       └─────────────────> any of the five (a queued trial measured elsewhere)

``COMPLETED`` trials whose metrics violate an outcome constraint are *infeasible by
measurement*; ``best_trial`` ranks only trials that satisfy every constraint.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from tuner.errors import StateError
from tuner.space import Config
from tuner.study import StudySpec


class TrialStatus(StrEnum):
    PENDING = "PENDING"
    ACTIVE = "ACTIVE"
    COMPLETED = "COMPLETED"
    INFEASIBLE = "INFEASIBLE"
    FAILED = "FAILED"
    ABANDONED = "ABANDONED"
    TIMED_OUT = "TIMED_OUT"

    @property
    def is_final(self) -> bool:
        return self not in (TrialStatus.PENDING, TrialStatus.ACTIVE)

    @property
    def is_pending(self) -> bool:
        """Handed out or queued but not finished: the optimizer treats it as pending."""
        return not self.is_final

    def can_become(self, other: TrialStatus) -> bool:
        return other in _TRANSITIONS[self]

    def check_transition(self, other: TrialStatus, trial_id: int | str = "") -> None:
        if not self.can_become(other):
            allowed = sorted(s.value for s in _TRANSITIONS[self]) or ["none: the trial is finished"]
            raise StateError(
                f"trial {trial_id} is {self.value} and cannot become {other.value} "
                f"(allowed from {self.value}: {', '.join(allowed)})"
            )


_FINAL = {
    TrialStatus.COMPLETED,
    TrialStatus.INFEASIBLE,
    TrialStatus.FAILED,
    TrialStatus.TIMED_OUT,
    TrialStatus.ABANDONED,
}
_TRANSITIONS: dict[TrialStatus, set[TrialStatus]] = {
    TrialStatus.PENDING: {TrialStatus.ACTIVE, *_FINAL},
    TrialStatus.ACTIVE: set(_FINAL),
    **{s: set() for s in _FINAL},
}

# Outcomes the model learns from: measured ones and those the configuration caused.
OBSERVED = (TrialStatus.COMPLETED, TrialStatus.INFEASIBLE, TrialStatus.TIMED_OUT)


@dataclass(frozen=True)
class Trial:
    """One configuration of a study and its outcome.

    Attributes:
        id: Number of the trial within its study, from 1.
        config: Knob name -> value.
        status: Where the trial is in its life cycle.
        metrics: Reported metrics (COMPLETED trials have all the study's metrics).
        reason: Why a trial is INFEASIBLE, FAILED, TIMED_OUT or ABANDONED.
        client_id: The worker the trial was handed to.
        source: What produced the configuration: default, sobol, bo, random, fallback, user.
        warning: Numerical trouble met while suggesting it (e.g. a fallback to Sobol).
        embedded: For a study searched in an embedding, the low-dimensional point the
            configuration was projected from (empty otherwise, and for the default
            configuration, which is evaluated outside the embedding).
    """

    id: int
    config: Config
    status: TrialStatus = TrialStatus.ACTIVE
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    client_id: str = ""
    source: str = ""
    warning: str = ""
    embedded: tuple[float, ...] = ()
    created_at: float = 0.0
    updated_at: float = 0.0


def is_feasible(spec: StudySpec, trial: Trial) -> bool:
    """COMPLETED with every study metric present, finite, and inside every outcome constraint."""
    if trial.status is not TrialStatus.COMPLETED:
        return False
    for name in spec.metric_names:
        value = trial.metrics.get(name)
        if value is None or not math.isfinite(value):
            return False
    return all(c.satisfied(trial.metrics[c.metric]) for c in spec.outcome_constraints)


def best_trial(spec: StudySpec, trials: Iterable[Trial]) -> Trial | None:
    """The feasible trial with the best objective value (earliest wins ties); None if none."""
    objective = spec.objective
    best: Trial | None = None
    for trial in sorted(trials, key=lambda t: t.id):
        if not is_feasible(spec, trial):
            continue
        if best is None or objective.better(
            trial.metrics[objective.name], best.metrics[objective.name]
        ):
            best = trial
    return best


def best_so_far(spec: StudySpec, trials: Iterable[Trial]) -> list[float | None]:
    """Best feasible objective value after each trial, in id order (None before the first)."""
    objective = spec.objective
    out: list[float | None] = []
    current: float | None = None
    for trial in sorted(trials, key=lambda t: t.id):
        if is_feasible(spec, trial):
            value = trial.metrics[objective.name]
            if current is None or objective.better(value, current):
                current = value
        out.append(current)
    return out
