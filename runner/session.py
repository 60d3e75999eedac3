"""A tuning session: ask for a configuration, run it on a target, report, repeat.

A session is the one trial loop (``runner.loop.run_loop``) with the session's measurement
protocol, over anything with the service's methods: the in-process ``TuningService`` or a
``TunerClient`` to a remote server. Each session process has its own ``client_id``
(``session:<host>:<pid>:<study>``), so several sessions on one study work together as
workers do: none is handed another's trial, and each stops asking once the trials finished
and those the others are measuring reach the study's budget. A session that was killed and
started again on the same host first finishes the trial its dead predecessor left ACTIVE
(its process is gone), then continues toward the same budget instead of starting over.

Every trial is measured through the session's ``MeasurementProtocol``
(``runner/measurement.py``): repeats (fixed, or more for promising trials), the default
re-measured as a control between trials, and a closing confirmation that the CLI prints as
the headline. ``summarize`` reads the stored measurements back: the control series says
whether the machine drifted, and a trial whose repeats disagree beyond the study's noise is
flagged unstable and never reported as the best.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from runner.loop import TuningAPI, reporter, run_loop
from runner.measurement import Measured, MeasurementProtocol, control, could_win, measure
from targets.base import Target
from tuner.confirmation import (
    improvement,
    model_ranking,
    pooled_noise,
    ranked,
    unstable_trial,
)
from tuner.confirmation import noiseless as measured_noiseless
from tuner.errors import TargetError, ValidationError
from tuner.measurement_stats import Drift, drift
from tuner.space import Config, Knob, Scalar
from tuner.study import StudySpec
from tuner.trial import (
    Measurement,
    MeasurementKind,
    StepKind,
    Trial,
    TrialStatus,
    best_trial,
    is_feasible,
    pareto_front,
    with_resolved_constraints,
)

log = logging.getLogger(__name__)


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
        measurements: Every stored measurement (repeats, controls, confirmation rounds).
        unstable: Ids of trials whose repeats disagree beyond the study's measured noise
            (``tuner.measurement_stats.unstable``); none of them is ``best``.
        drift: The default's measurements (its repeats and the controls) over time, by the
            objective; None without any.
        relative: With a drift series, each measured trial's objective over the default's
            value at the trial's time (interpolated between the nearest controls): the
            trial's ratio to the default on the machine as it was then. The raw values stay
            in ``trials``.
        ranking: The feasible trials but the default and the unstable ones, best first by
            posterior mean, or by measured value without noise (``ranked``): the
            confirmation's candidates.
    """

    spec: StudySpec
    trials: list[Trial]
    default: Trial | None
    best: Trial | None
    ratio: float | None
    front: tuple[Trial, ...] = ()
    measurements: tuple[Measurement, ...] = ()
    unstable: tuple[int, ...] = ()
    drift: Drift | None = None
    relative: dict[int, float] = field(default_factory=dict)
    ranking: tuple[Trial, ...] = ()


def client_id_for(spec: StudySpec) -> str:
    return f"session:{socket.gethostname()}:{os.getpid()}:{spec.name}"


def orphaned(spec: StudySpec, trials: Sequence[Trial]) -> list[Trial]:
    """ACTIVE trials left by sessions of this host whose process has ended (killed), oldest
    first: the next session on this host finishes them before asking for new ones."""
    host = socket.gethostname()
    out = []
    for t in trials:
        if t.status is not TrialStatus.ACTIVE:
            continue
        parts = t.client_id.split(":", 3)
        if len(parts) == 4 and parts[:2] == ["session", host] and parts[2].isdigit():
            if int(parts[2]) != os.getpid() and not _alive(int(parts[2])):
                out.append(t)
        elif t.client_id == f"session:{host}:{spec.name}":  # a session of an earlier tuner
            out.append(t)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def run_session(
    api: TuningAPI,
    target: Target,
    spec: StudySpec,
    trials: int,
    on_trial: Callable[[Trial, int], None] | None = None,
    protocol: MeasurementProtocol | None = None,
    stop: Callable[[], bool] | None = None,
) -> SessionResult:
    """Run trials on ``target`` until the study has ``trials`` finished trials, measuring
    each by ``protocol`` (default: once, no controls), through the one trial loop
    (``runner.loop.run_loop``).

    Args:
        on_trial: Called after each reported trial with the trial and the number of
            finished trials so far (for progress display).
        stop: Asked before each new trial; True ends the session early (a budget of
            measurements rather than trials).

    Raises:
        TargetError: ``MAX_CONSECUTIVE_FAILURES`` trials in a row FAILED (the target is
            broken, not the configurations).
    """
    protocol = protocol or MeasurementProtocol()
    api.create_study(spec)
    since_control = 0

    def measure_one(trial: Trial) -> Measured:
        return _measure_trial(api, target, spec, trial, protocol)

    def after(reported: Trial, measured: Measured, finished: int) -> None:
        nonlocal since_control
        if on_trial is not None:
            on_trial(reported, finished)
        since_control += reported.step is not StepKind.DEFAULT
        if protocol.control_every and since_control >= protocol.control_every:
            since_control = 0
            control(api, target, spec)

    run_loop(
        api, spec, trials, measure_one, client_id=client_id_for(spec),
        leftover=orphaned(spec, api.list_trials(spec.name)), after=after, stop=stop,
    )  # fmt: skip
    return summarize(
        spec, api.list_trials(spec.name), api.list_measurements(spec.name), target.noiseless
    )


def _measure_trial(
    api: TuningAPI, target: Target, spec: StudySpec, trial: Trial, protocol: MeasurementProtocol
) -> Measured:
    """``trial`` measured by ``protocol``: the default as often as any trial may be, the
    others ``repeats`` times and, while they could still win, up to ``max_repeats``. Each
    window of a run goes to the study (``report_progress``), whose answer may stop the
    trial early (``tuner.stopping``; never the default's)."""

    progress = reporter(api, spec.name, trial)
    if trial.step is StepKind.DEFAULT:
        return measure(target, trial.config, protocol.most, progress=progress)
    if protocol.most == protocol.repeats:
        return measure(target, trial.config, protocol.repeats, progress=progress)
    history = api.list_trials(spec.name)
    resolved = with_resolved_constraints(spec, history)
    noise = pooled_noise(resolved, api.list_measurements(spec.name))
    incumbent = best_trial(resolved, history)
    metrics = None if incumbent is None else incumbent.metrics

    def more(values: list[Mapping[str, float]]) -> bool:
        return could_win(resolved, values, metrics, noise)

    return measure(target, trial.config, protocol.repeats, more, protocol.most, progress)


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
    def carried(self) -> Trial | None:
        """The trial whose values the phase hands on: its best, unless the default was
        feasible and no other trial beat it by trial means (then the default, whatever the
        best of the others was: a phase never carries a change measured to be worse)."""
        result = self.result
        default, best = result.default, result.best
        if default is None or not is_feasible(result.spec, default):  # (feasible: completed)
            return best
        if best is None:
            return default
        objective = result.spec.objective  # phases have one objective (runner.config)
        value = best.metrics.get(objective.name)
        beat = value is not None and objective.better(value, default.metrics[objective.name])
        return best if beat else default

    @property
    def best_config(self) -> dict[str, Scalar] | None:
        carried = self.carried
        return None if carried is None else {**self.held, **carried.config}


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

    @property
    def noiseless(self) -> bool:
        return self.inner.noiseless

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
    protocol: MeasurementProtocol | None = None,
) -> list[PhaseResult]:
    """Tune the knobs phase by phase (PolyThrottle's two-phase mode, say).

    Phase ``i`` is its own study, ``<name>-phase<i>``, over its knobs; every other knob is
    held: at the value an earlier phase carried for it (``PhaseResult.carried``: its best,
    or its default when nothing beat that), else at its default. A rerun resumes each
    phase's study where it stopped.

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
        result = run_session(api, HeldKnobs(target, held), sub, phase.trials, on_trial, protocol)
        done = PhaseResult(result, held)
        results.append(done)
        carried = done.carried
        if carried is None:
            raise TargetError(
                f"phase {index + 1} ({', '.join(phase.knobs)}) found no feasible configuration; "
                "later phases have nothing to hold its knobs at"
            )
        found.update(carried.config)
    return results


def summarize(
    spec: StudySpec,
    trials: list[Trial],
    measurements: Sequence[Measurement] = (),
    noiseless: bool = False,
) -> SessionResult:
    """The default trial, the best trial and the improvement ratio of a study's trials.

    The best is the one ``tuner best`` names for the study before a confirmation
    (``tuner.confirmation.best_of``): the best measured of the ranking's trials, those the
    objective GP calls outliers set aside, not the luckiest measurement. The ranking (the
    confirmation's candidates) is by the GP's posterior mean (``ranked``). With the
    stored ``measurements``: trials whose repeats disagree beyond the machine's noise are
    flagged and left out of the best, and the default's series (repeats and controls) gives
    the drift. The result's spec has its relative outcome constraints
    resolved against the default. ``noiseless``: the target declares that a configuration
    always measures the same (``Target.noiseless``); the ranking, the confirmation's
    candidates, is then by measured values (``ranked``)."""
    trials = sorted(trials, key=lambda t: t.id)
    spec = with_resolved_constraints(spec, trials)
    default = next((t for t in trials if t.step is StepKind.DEFAULT), None)
    front = tuple(pareto_front(spec, trials))
    measurements = tuple(measurements)
    if spec.multi_objective:
        return SessionResult(spec, trials, default, None, None, front, measurements)
    name = spec.objective.name
    flagged = tuple(
        t.id for t in trials
        if t.repeats > 1 and t is not default and unstable_trial(spec, t, default, measurements)
    )  # fmt: skip
    series = [
        m for m in measurements
        if default is not None and m.trial_id == default.id and name in m.metrics
        and m.kind in (MeasurementKind.REPEAT, MeasurementKind.CONTROL) and m.metrics[name] > 0
    ]  # fmt: skip
    found = drift([m.at for m in series], [m.metrics[name] for m in series]) if series else None
    ranking = tuple(ranked(spec, trials, flagged, measurements, noiseless))
    noisy = not noiseless and not measured_noiseless(spec, measurements)
    screened = model_ranking(spec, trials, ranking) if ranking and noisy else None
    best = screened[0] if screened else ranking[0] if ranking else None
    ratio = improvement(spec, default, best)
    relative = {}
    if found is not None and found.values:
        relative = {
            t.id: t.metrics[name] / (found.reference * found.factor_at(t.updated_at))
            for t in trials
            if t.status is TrialStatus.COMPLETED and t.metrics.get(name, 0) > 0
        }
    return SessionResult(
        spec, trials, default, best, ratio, front, measurements, flagged, found, relative,
        ranking,
    )  # fmt: skip
