"""A tuning session: ask for a configuration, run it on a target, report, repeat.

The loop talks to anything with the service's methods: the in-process ``TuningService`` or a
``TunerClient`` to a remote server. It uses one fixed ``client_id`` per host and study, so a
session that was killed and started again gets its unfinished trial back (the server hands
an ACTIVE trial to the same client) and continues toward the same trial budget instead of
starting over.

``confirm`` re-measures what a session found: a single measurement of a noisy system (a
30-second benchmark window on a shared machine) can be off by more than the knobs change,
so the default and the best few configurations are run again, ``repeats`` times each and
interleaved (so that drift of the machine touches every configuration alike), and compared
by their means.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import statistics
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from targets.base import Target
from tuner.errors import StateError, TargetError, ValidationError
from tuner.space import Config, Knob, Scalar
from tuner.study import Goal, StudySpec
from tuner.trial import (
    StepKind,
    Trial,
    TrialStatus,
    best_trial,
    is_feasible,
    pareto_front,
    with_resolved_constraints,
)

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 5


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

    def heartbeat(self, study: str, trial_id: int) -> Trial: ...


@dataclass(frozen=True)
class SessionResult:
    """What a session found.

    Attributes:
        trials: Every trial of the study, in id order.
        default: The trial that measured the knobs' defaults, if any.
        best: The best feasible trial, if any (None with several objectives: see ``front``).
        ratio: How many times better the best is than the default (``best / default`` when
            maximizing, ``default / best`` when minimizing); None when not computable.
        front: The Pareto front (``tuner.trial.pareto_front``); with one objective, the best.
    """

    spec: StudySpec
    trials: list[Trial]
    default: Trial | None
    best: Trial | None
    ratio: float | None
    front: tuple[Trial, ...] = ()


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
        TargetError: ``MAX_CONSECUTIVE_FAILURES`` trials in a row FAILED (the target is
            broken, not the configurations).
    """
    api.create_study(spec)
    client_id = client_id_for(spec)
    finished = sum(t.status.is_final for t in api.list_trials(spec.name))
    failures = 0
    while finished < trials:
        [trial] = api.suggest_trials(spec.name, 1, client_id)
        with keep_alive(api, spec.name, trial):
            outcome = target.run_trial(trial.config)
        reported = api.complete_trial(
            spec.name, trial.id, outcome.metrics, outcome.status, outcome.reason
        )
        finished += 1
        failures = failures + 1 if outcome.status is TrialStatus.FAILED else 0
        if on_trial is not None:
            on_trial(reported, finished)
        if failures >= MAX_CONSECUTIVE_FAILURES:
            raise TargetError(f"{failures} trials in a row failed; last reason: {outcome.reason}")
    return summarize(spec, api.list_trials(spec.name))


@contextlib.contextmanager
def keep_alive(api: TuningAPI, study: str, trial: Trial) -> Iterator[None]:
    """Send heartbeats for ``trial`` while the block runs, a third of a lease apart.

    Nothing happens for a trial without a lease. A heartbeat that fails (the server is
    restarting, the network dropped) is logged and retried at the next tick; one refused
    because the lease already expired stops the heartbeats: the result is still reported
    at the end and the server stores it as a late result.
    """
    if trial.lease_expires_at is None:
        yield
        return
    stop = threading.Event()
    interval = max(0.05, (trial.lease_expires_at - time.time()) / 3)

    def beat() -> None:
        while not stop.wait(interval):
            try:
                api.heartbeat(study, trial.id)
            except StateError as exc:
                log.warning("trial %d: heartbeat refused (%s)", trial.id, exc)
                return
            except Exception as exc:  # keep measuring; the next tick tries again
                log.warning("trial %d: heartbeat failed (%s); retrying", trial.id, exc)

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@dataclass(frozen=True)
class Phase:
    """One phase of a phased session: the knobs it tunes and its trial budget."""

    knobs: tuple[str, ...]
    trials: int


@dataclass(frozen=True)
class PhaseResult:
    """A finished phase: its study's result and the values it held the other knobs at."""

    result: SessionResult
    held: dict[str, Scalar]

    @property
    def best_config(self) -> dict[str, Scalar] | None:
        best = self.result.best
        return None if best is None else {**self.held, **best.config}


class HeldKnobs(Target):
    """``inner`` with some knobs held at fixed values: a phase tunes only the others.

    Set-up and close stay with ``inner`` (the caller's ``with`` block); every trial applies
    the held values together with the phase's configuration.
    """

    def __init__(self, inner: Target, held: Mapping[str, Scalar]) -> None:
        self.inner = inner
        self.held = dict(held)

    def describe_knobs(self) -> tuple[Knob, ...]:
        return self.inner.describe_knobs()

    def describe_metrics(self) -> dict[str, str]:
        return self.inner.describe_metrics()

    def apply(self, config: Config) -> None:
        self.inner.apply({**self.held, **config})

    def measure(self) -> dict[str, float]:
        return self.inner.measure()

    def restore(self) -> None:
        self.inner.restore()


def phase_spec(spec: StudySpec, index: int, phase: Phase) -> StudySpec:
    """The study of phase ``index`` (0-based): ``spec`` over the phase's knobs only."""
    data = spec.to_dict()
    data["name"] = f"{spec.name}-phase{index + 1}"
    data.pop("knobs", None)
    knobs = tuple(spec.space[name] for name in phase.knobs)
    return StudySpec.from_dict(data, knobs=knobs)


def run_phases(
    api: TuningAPI,
    target: Target,
    spec: StudySpec,
    phases: Sequence[Phase],
    on_trial: Callable[[Trial, int], None] | None = None,
    on_phase: Callable[[int, StudySpec, dict[str, Scalar]], None] | None = None,
) -> list[PhaseResult]:
    """Tune the knobs phase by phase (PolyThrottle's two-phase mode, say).

    Phase ``i`` is its own study, ``<name>-phase<i>``, over its knobs; every other knob is
    held: at the best value an earlier phase found for it, else at its default. A rerun
    resumes each phase's study where it stopped.

    Raises:
        TargetError: As ``run_session``; or an earlier phase found no feasible
            configuration, so there is nothing to hold its knobs at.
    """
    found: dict[str, Scalar] = {}
    results: list[PhaseResult] = []
    for index, phase in enumerate(phases):
        sub = phase_spec(spec, index, phase)
        held: dict[str, Scalar] = {}
        for knob in spec.space.knobs:
            value = found.get(knob.name, knob.default)
            if knob.name in phase.knobs:
                continue
            if value is None:
                raise ValidationError(
                    f"knobs.{knob.name}.default", "a knob held during a phase needs a default"
                )
            held[knob.name] = value
        if on_phase is not None:
            on_phase(index, sub, held)
        result = run_session(api, HeldKnobs(target, held), sub, phase.trials, on_trial)
        done = PhaseResult(result, held)
        results.append(done)
        if result.best is None:
            raise TargetError(
                f"phase {index + 1} ({', '.join(phase.knobs)}) found no feasible configuration; "
                "later phases have nothing to hold its knobs at"
            )
        found.update(result.best.config)
    return results


def summarize(spec: StudySpec, trials: list[Trial]) -> SessionResult:
    """The default trial, the best trial and the improvement ratio of a study's trials.

    The result's spec has its relative outcome constraints resolved against the default."""
    trials = sorted(trials, key=lambda t: t.id)
    spec = with_resolved_constraints(spec, trials)
    default = next((t for t in trials if t.step is StepKind.DEFAULT), None)
    front = tuple(pareto_front(spec, trials))
    if spec.multi_objective:
        return SessionResult(spec, trials, default, None, None, front)
    best = best_trial(spec, trials)
    return SessionResult(spec, trials, default, best, improvement(spec, default, best), front)


def improvement(spec: StudySpec, default: Trial | None, best: Trial | None) -> float | None:
    """``best / default`` (maximize) or ``default / best`` (minimize), when both are positive.

    None when the default has no value or breaks an outcome constraint: there is nothing
    feasible to compare with.
    """
    name = spec.objective.name
    if default is None or best is None or name not in default.metrics:
        return None
    if not is_feasible(spec, default):
        return None
    return _ratio(spec, default.metrics[name], best.metrics[name])


@dataclass(frozen=True)
class Remeasured:
    """One configuration measured again.

    Attributes:
        trial: The study's trial whose configuration was re-run.
        values: The objective of each repeat that was COMPLETED and met the outcome
            constraints, in order.
        repeats: How many repeats ran.
        reasons: Why the other repeats do not count (status and reason).
    """

    trial: Trial
    values: tuple[float, ...]
    repeats: int
    reasons: tuple[str, ...] = ()

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) > 1 else None


@dataclass(frozen=True)
class Confirmation:
    """The outcome of ``confirm``.

    Attributes:
        measured: The default first (when there is one), then the candidates best first.
        best: The candidate with the best mean among those feasible in every repeat.
        ratio: ``best`` against the default, by means (as ``SessionResult.ratio``).
        significant: Whether the two means differ by more than twice the standard error of
            their difference (Welch); False when either has fewer than two values.
    """

    measured: tuple[Remeasured, ...]
    best: Remeasured | None
    ratio: float | None
    significant: bool


def confirm(
    target: Target,
    result: SessionResult,
    repeats: int,
    top: int = 3,
    on_measure: Callable[[int, int], None] | None = None,
) -> Confirmation:
    """Run the default and the ``top`` best feasible configurations ``repeats`` times each,
    round-robin; nothing is written to the study (its trials stay as measured).

    Args:
        on_measure: Called with (measurements done, measurements in all), for progress.
    """
    spec = result.spec
    name = spec.objective.name
    sign = 1.0 if spec.objective.goal is Goal.MAXIMIZE else -1.0
    feasible = [t for t in result.trials if is_feasible(spec, t) and name in t.metrics]
    ranked = sorted(
        (t for t in feasible if result.default is None or t.id != result.default.id),
        key=lambda t: -sign * t.metrics[name],
    )[:top]
    trials = ([result.default] if result.default is not None else []) + ranked
    values: dict[int, list[float]] = {t.id: [] for t in trials}
    reasons: dict[int, list[str]] = {t.id: [] for t in trials}
    total, done = repeats * len(trials), 0
    for _ in range(repeats):
        for trial in trials:
            outcome = target.run_trial(trial.config)
            again = Trial(trial.id, trial.config, outcome.status, dict(outcome.metrics))
            if is_feasible(spec, again) and name in again.metrics:
                values[trial.id].append(again.metrics[name])
            else:
                reasons[trial.id].append(f"{outcome.status.value}: {outcome.reason}"[:200])
            done += 1
            if on_measure is not None:
                on_measure(done, total)
    measured = tuple(
        Remeasured(t, tuple(values[t.id]), repeats, tuple(reasons[t.id])) for t in trials
    )
    candidates = [m for m in measured[len(trials) - len(ranked) :] if len(m.values) == repeats]
    best = max(candidates, key=lambda m: sign * (m.mean or 0.0), default=None)
    default = measured[0] if result.default is not None else None
    ratio = significant = None
    if best is not None and default is not None and default.mean is not None:
        ratio = _ratio(spec, default.mean, best.mean or 0.0)
        significant = _differ(default, best)
    return Confirmation(measured, best, ratio, bool(significant))


def _ratio(spec: StudySpec, default: float, best: float) -> float | None:
    if not (math.isfinite(default) and math.isfinite(best)) or default <= 0 or best <= 0:
        return None
    return best / default if spec.objective.goal is Goal.MAXIMIZE else default / best


def _differ(a: Remeasured, b: Remeasured) -> bool:
    """Means more than two standard errors of their difference apart (Welch)."""
    if a.mean is None or b.mean is None or len(a.values) < 2 or len(b.values) < 2:
        return False
    se = math.sqrt((a.std or 0.0) ** 2 / len(a.values) + (b.std or 0.0) ** 2 / len(b.values))
    return abs(a.mean - b.mean) > 2 * se
