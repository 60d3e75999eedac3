"""A tuning session: ask for a configuration, run it on a target, report, repeat.

The loop talks to anything with the service's methods: the in-process ``TuningService`` or a
``TunerClient`` to a remote server. It uses one fixed ``client_id`` per host and study, so a
session that was killed and started again gets its unfinished trial back (the server hands
an ACTIVE trial to the same client) and continues toward the same trial budget instead of
starting over.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from targets.base import Target
from tuner.errors import TargetError
from tuner.study import Goal, StudySpec
from tuner.trial import Trial, TrialStatus, best_trial

_MAX_CONSECUTIVE_FAILURES = 5


class TuningAPI(Protocol):
    """The part of the service a session needs (``TuningService`` and ``TunerClient``)."""

    def create_study(self, spec: StudySpec) -> tuple[object, bool]: ...

    def suggest_trials(self, study: str, count: int, client_id: str = "") -> list[Trial]: ...

    def complete_trial(
        self,
        study: str,
        trial_id: int,
        metrics: Mapping[str, float] | None = None,
        status: TrialStatus = TrialStatus.COMPLETED,
        reason: str = "",
    ) -> Trial: ...

    def list_trials(
        self, study: str, statuses: Collection[TrialStatus] | None = None
    ) -> list[Trial]: ...


@dataclass(frozen=True)
class SessionResult:
    """What a session found.

    Attributes:
        trials: Every trial of the study, in id order.
        default: The trial that measured the knobs' defaults, if any.
        best: The best feasible trial, if any.
        ratio: How many times better the best is than the default (``best / default`` when
            maximizing, ``default / best`` when minimizing); None when not computable.
    """

    spec: StudySpec
    trials: list[Trial]
    default: Trial | None
    best: Trial | None
    ratio: float | None


def client_id_for(spec: StudySpec) -> str:
    return f"session:{socket.gethostname()}:{spec.name}"


def run_session(
    api: TuningAPI,
    target: Target,
    spec: StudySpec,
    trials: int,
    on_trial: Callable[[Trial, int], None] | None = None,
) -> SessionResult:
    """Run trials on ``target`` until the study has ``trials`` finished trials.

    Args:
        on_trial: Called after each reported trial with the trial and the number of
            finished trials so far (for progress display).

    Raises:
        TargetError: ``_MAX_CONSECUTIVE_FAILURES`` trials in a row FAILED (the target is
            broken, not the configurations).
    """
    api.create_study(spec)
    client_id = client_id_for(spec)
    finished = sum(t.status.is_final for t in api.list_trials(spec.name))
    failures = 0
    while finished < trials:
        [trial] = api.suggest_trials(spec.name, 1, client_id)
        outcome = target.run_trial(trial.config)
        reported = api.complete_trial(
            spec.name, trial.id, outcome.metrics, outcome.status, outcome.reason
        )
        finished += 1
        failures = failures + 1 if outcome.status is TrialStatus.FAILED else 0
        if on_trial is not None:
            on_trial(reported, finished)
        if failures >= _MAX_CONSECUTIVE_FAILURES:
            raise TargetError(f"{failures} trials in a row failed; last reason: {outcome.reason}")
    return summarize(spec, api.list_trials(spec.name))


def summarize(spec: StudySpec, trials: list[Trial]) -> SessionResult:
    """The default trial, the best trial and the improvement ratio of a study's trials."""
    trials = sorted(trials, key=lambda t: t.id)
    default = next((t for t in trials if t.source == "default"), None)
    best = best_trial(spec, trials)
    return SessionResult(spec, trials, default, best, improvement(spec, default, best))


def improvement(spec: StudySpec, default: Trial | None, best: Trial | None) -> float | None:
    """``best / default`` (maximize) or ``default / best`` (minimize), when both are positive."""
    name = spec.objective.name
    if default is None or best is None or name not in default.metrics:
        return None
    a, b = default.metrics[name], best.metrics[name]
    if not (math.isfinite(a) and math.isfinite(b)) or a <= 0 or b <= 0:
        return None
    return b / a if spec.objective.goal is Goal.MAXIMIZE else a / b
