"""The unattended tuner on a device: ``tuner daemon CONFIG``.

The daemon cycles through two phases and keeps its place in a state file:

1. **Tuning** round ``k``: a study ``<name>.r<k>`` (the default configuration first, then
   the designer) with ``[session] trials`` trials. Each trial measures up to
   ``windows_per_trial`` windows (one ``Target.measure()`` each) and its metrics are the
   mean over them; a window that breaks the SLO ends the trial at once (it is stored with
   that window's metrics, infeasible by measurement, so the model learns from it) and the
   daemon *rolls back*: the last good configuration is applied again before anything else
   runs, within the measurement window that saw the breach. A configuration the system
   rejects, or a workload that fails or times out, ends the trial the same way. With
   ``[study.stopping] early_stop = true`` (and ``windows_per_trial`` at least its
   ``min_windows``) each window also reaches the study as progress
   (``runner.loop.reporter``), and a trial whose windows show it cannot beat the round's
   best ends EARLY_STOPPED (no rollback: it is slower, not broken), so a losing setting
   leaves the device sooner.
2. **Watching**: the best feasible configuration of the round is applied and stays applied
   (when no trial met the SLO: the last good configuration, else the knobs' defaults, which
   a workload with knob placeholders needs to run at all);
   the daemon measures window after window (``interval_s`` apart). The first
   ``baseline_windows`` windows set a baseline of the ``watch`` metrics (the objective and
   the workload's rate, say). When ``drift_windows`` windows in a row move some watched
   metric more than ``drift`` (relative) away from its baseline, the workload has changed
   and round ``k + 1`` starts from the configuration now applied. A window that breaks the
   SLO puts the system's default configuration back at once and starts the next round too.

With ``control_every = N`` the daemon also re-measures the default configuration every
``N`` watch windows, as a control (the measurement protocol of sessions,
``runner/measurement.py``): the control is stored with the round's default trial, and the
ratio of its objective to that trial's says how the machine moved. When the objective
drifts, a control measured at that moment decides: if the default moved by the same factor
since the baseline, every configuration slowed alike (the machine, or a load on all of
them) and re-tuning would not help: the daemon logs ``machine_drift`` and learns a new
baseline; otherwise it re-tunes. After an SLO breach a control says whether the default
meets the SLO at that moment. Each window of a trial is stored as a
repeat of that trial.

With ``confirm = N`` each tuning round ends with a confirmation (``runner.confirm``, the
session's protocol and the study's rule, ``[study.stopping] confirm``): the daemon applies
what it keeps (the confirmed best, else the default) and logs a ``confirm`` event.

The SLO is the study's outcome constraints (bounds relative to the default resolve against
each round's default trial). Every transition is an event: one JSON object per line on
stdout and in ``log`` (``start``, ``resume``, ``trial``, ``slo_breach``, ``rollback``,
``confirm``, ``applied``, ``baseline``, ``window``, ``control``, ``machine_drift``, ``drift``,
``round``, ``stop``), with a UTC timestamp.

The state file (JSON, replaced atomically after every transition and every window) holds
the round, the phase, the applied and last good configurations and the baseline. After a
restart the daemon resumes: while watching, it applies the stored configuration again and
keeps the baseline; while tuning, it continues the round's study, whose trials are in the
database (an unfinished trial of its own is handed back to it and measured again). A state
file written for a different study spec is set aside and the daemon starts over. Every exit
path (``max_windows`` or ``max_rounds`` reached, SIGTERM, Ctrl-C, an error) restores the
target and writes a ``stop`` event whose ``reason`` says which (``limit reached``,
``exit 143 (signal)``, ``interrupted``, ``error: ...``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from runner.confirm import confirm_session
from runner.loop import TuningAPI, reporter, run_loop
from runner.measurement import DEFAULT_PROTOCOL, Measured, control, measure_windows
from runner.session import summarize
from targets.base import Target
from tuner.confirmation import best_of
from tuner.errors import ValidationError
from tuner.study import MAX_TRANSFER_SOURCES, StudySpec, TransferSource
from tuner.trial import (
    Measurement,
    Trial,
    best_trial,
    with_resolved_constraints,
)

DAEMON_KEYS = (
    "state",
    "log",
    "windows_per_trial",
    "watch",
    "drift",
    "drift_windows",
    "baseline_windows",
    "interval_s",
    "max_windows",
    "max_rounds",
    "control_every",
    "transfer",
    "confirm",
)
TUNING, WATCHING = "tuning", "watching"


@dataclass(frozen=True)
class DaemonSettings:
    """The ``[daemon]`` table (see the module doc).

    Attributes:
        state: The state file the daemon resumes from (default ``<db folder>/<study>.daemon.json``).
        log: A file the events are appended to, one JSON object per line, besides stdout.
        windows_per_trial: Measurement windows per trial; its metrics are their mean.
        watch: The metrics whose drift starts a new round (default: the objective).
        drift: How far (relative to the baseline) a watched metric must move to count.
        drift_windows: Windows in a row that must drift before the daemon re-tunes.
        baseline_windows: Windows after applying a configuration that set the baseline.
        interval_s: Seconds between watch windows.
        max_windows: Stop after this many watch windows in all (0: never).
        max_rounds: Stop after this many tuning rounds, once watching (0: never).
        control_every: Re-measure the default every this many watch windows (0: never).
        transfer: A round learns from the earlier rounds (``DaemonRunner.round_spec``).
        confirm: Rounds of a confirmation after each tuning round (0: none): the default
            and the round's best few in interleaved rounds (``runner.confirm``, by the
            study's rule, ``[study.stopping] confirm``); the daemon applies what the
            confirmation keeps (the confirmed best, else the default), not the luckiest
            window.
    """

    state: Path
    log: Path | None = None
    windows_per_trial: int = 3
    watch: tuple[str, ...] = ()
    drift: float = 0.25
    drift_windows: int = 3
    baseline_windows: int = 3
    interval_s: float = 0.0
    max_windows: int = 0  # stop after this many watch windows in all (0: never)
    max_rounds: int = 0  # stop after this many tuning rounds, once watching (0: never)
    control_every: int = 0  # re-measure the default every this many watch windows (0: never)
    transfer: bool = True  # a round learns from the earlier rounds
    confirm: int = 0  # rounds of a confirmation after each tuning round (0: none)


def parse_daemon(table: Mapping[str, Any], spec: StudySpec, db: Path) -> DaemonSettings:
    """Validate the ``[daemon]`` table; errors name ``daemon.<key>``."""
    unknown = sorted(set(table) - set(DAEMON_KEYS))
    if unknown:
        raise ValidationError(f"daemon.{unknown[0]}", "unknown setting", DAEMON_KEYS)
    if spec.multi_objective:
        raise ValidationError(
            "study.objectives",
            "the daemon applies one best configuration; a study with several objectives has "
            "a Pareto front instead",
            "one objective",
        )
    state = Path(table.get("state", db.parent / f"{spec.name}.daemon.json"))
    log = table.get("log")
    watch = table.get("watch", [spec.objective.name])
    if not isinstance(watch, list) or not watch or not all(isinstance(w, str) for w in watch):
        raise ValidationError("daemon.watch", f"got {watch!r}", "a list of metric names")
    return DaemonSettings(
        state=state,
        log=None if log is None else Path(log),
        windows_per_trial=_int(table, "windows_per_trial", 3, 1, 1000),
        watch=tuple(watch),
        drift=_number(table, "drift", 0.25, 0.0, 100.0),
        drift_windows=_int(table, "drift_windows", 3, 1, 10_000),
        baseline_windows=_int(table, "baseline_windows", 3, 1, 10_000),
        interval_s=_number(table, "interval_s", 0.0, 0.0, 86_400.0),
        max_windows=_int(table, "max_windows", 0, 0, 10**9),
        max_rounds=_int(table, "max_rounds", 0, 0, 10**6),
        control_every=_int(table, "control_every", 0, 0, 10**6),
        transfer=_flag(table, "transfer", True),
        confirm=_int(table, "confirm", 0, 0, 100),
    )


@dataclass
class DaemonState:
    """What the daemon must remember across restarts."""

    fingerprint: str
    round: int = 1
    phase: str = TUNING
    applied: dict[str, Any] | None = None  # in effect while watching
    last_good: dict[str, Any] | None = None  # what a rollback puts back (None: the default)
    baseline: dict[str, float] | None = None
    samples: list[dict[str, float]] = field(default_factory=list)  # windows toward a baseline
    windows: int = 0  # watch windows measured, all rounds
    drifting: int = 0  # windows in a row past the drift threshold
    machine: float = 1.0  # the last control's objective over the round's default trial's
    machine_base: float = 1.0  # ``machine`` when the baseline was set

    @classmethod
    def load(cls, path: Path, fingerprint: str) -> tuple[DaemonState, str]:
        """The stored state, or a fresh one; the second value says which and why."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(fingerprint), "new"
        except (OSError, ValueError) as exc:
            _set_aside(path)
            return cls(fingerprint), f"unreadable state file set aside ({exc})"
        if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
            _set_aside(path)
            return cls(fingerprint), "the study spec changed; old state set aside"
        try:
            return cls(**data), "resumed"
        except TypeError as exc:
            _set_aside(path)
            return cls(fingerprint), f"state file of another version set aside ({exc})"

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".tmp")
        with open(partial, "w", encoding="utf-8") as out:
            json.dump(asdict(self), out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)


class EventLog:
    """Structured events: one JSON object per line, to a stream and/or a file."""

    def __init__(self, path: Path | None, stream: TextIO | None = sys.stdout) -> None:
        self.stream = stream
        self._file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"ts": datetime.now(UTC).isoformat(timespec="milliseconds"), "event": event}
        record.update(fields)
        line = json.dumps(record, default=str)
        for out in (self.stream, self._file):
            if out is not None:
                out.write(line + "\n")
                out.flush()
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Daemon:
    """Tune, apply, watch, re-tune (module doc). Use ``run()`` inside the target's ``with``."""

    def __init__(
        self,
        api: TuningAPI,
        target: Target,
        spec: StudySpec,
        trials: int,
        settings: DaemonSettings,
        events: EventLog,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api, self.target, self.spec = api, target, spec
        self.trials, self.settings, self.events = trials, settings, events
        self.sleep = sleep
        self.state, self._how = DaemonState.load(settings.state, spec.fingerprint())
        self.client_id = f"daemon:{socket.gethostname()}:{spec.name}"

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> int:
        """Run until ``max_windows``/``max_rounds`` says stop; the target is restored on
        every way out. Returns the number of watch windows measured in this run."""
        start = self.state.windows
        reason = "error"
        try:
            self._begin()
            while True:
                if self.state.phase == TUNING:
                    self._tune_round()
                    continue
                if self._done():
                    reason = "limit reached"
                    break
                self._watch_window()
        except KeyboardInterrupt:  # Ctrl-C, SIGINT
            reason = "interrupted"
            raise
        except SystemExit as exc:
            reason = f"exit {exc.code} (signal)"
            raise
        except Exception as exc:
            reason = f"error: {type(exc).__name__}: {exc}"
            raise
        finally:
            try:
                self.target.restore()
            finally:
                self.state.save(self.settings.state)
                self.events.emit(
                    "stop", reason=reason, round=self.state.round, phase=self.state.phase
                )
        return self.state.windows - start

    def _begin(self) -> None:
        state = self.state
        fields = {"study": self.spec.name, "round": state.round, "phase": state.phase}
        if self._how == "resumed":
            self.events.emit("resume", **fields, windows=state.windows)
            if state.phase == WATCHING and state.applied is not None:
                self.target.apply(state.applied)
                self.events.emit("applied", round=state.round, config=state.applied)
        else:
            self.events.emit("start", **fields, note=self._how)
        state.save(self.settings.state)

    def _done(self) -> bool:
        s = self.settings
        rounds_done = self.state.round if self.state.phase == WATCHING else self.state.round - 1
        return bool(
            (s.max_windows and self.state.windows >= s.max_windows)
            or (s.max_rounds and rounds_done >= s.max_rounds)
        )

    # -- tuning -------------------------------------------------------------------------
    def round_spec(self) -> StudySpec:
        """Round ``k``'s study: ``<name>.r<k>``, learning from the earlier rounds (the most
        recent first, as many as fit beside the config's own sources) when its designer fits
        models (``tuner.transfer``): their best configurations, the one applied among them,
        seed its design, and their models weigh by how well they rank its trials."""
        spec = self.spec.with_name(f"{self.spec.name}.r{self.state.round}")
        if not (self.settings.transfer and spec.learns_from_sources):
            return spec
        room = MAX_TRANSFER_SOURCES - len(spec.transfer_from)
        earlier = [
            TransferSource(f"{self.spec.name}.r{k}") for k in range(self.state.round - 1, 0, -1)
        ]
        return replace(spec, transfer_from=(*spec.transfer_from, *earlier[: max(room, 0)]))

    def _tune_round(self) -> None:
        spec = self.round_spec()

        def measure_one(trial: Trial) -> Measured:
            return self._measure_trial(spec, trial)

        def after(reported: Trial, measured: Measured, finished: int) -> None:
            self.events.emit(
                "trial", round=self.state.round, trial=reported.id, status=measured.status.value,
                config=reported.config, metrics=_reported_metrics(measured),
                reason=measured.reason,
            )  # fmt: skip

        started = time.monotonic()
        run_loop(self.api, spec, self.trials, measure_one, client_id=self.client_id, after=after)
        best = best_trial(spec, self.api.list_trials(spec.name))
        if self.settings.confirm and best is not None:
            best = self._confirm_round(spec, time.monotonic() - started)
        state = self.state
        if best is not None:
            state.applied = dict(best.config)
            self.target.apply(state.applied)
            state.last_good = dict(best.config)
            value = best.metrics[spec.objective.name]
            self.events.emit(
                "applied", round=state.round, trial=best.id, config=state.applied,
                **{spec.objective.name: value},
            )  # fmt: skip
        else:  # nothing met the SLO: keep what was good before, else the knobs' defaults
            state.applied = state.last_good or self.spec.space.default_config()
            self.target.restore()
            if state.applied is not None:
                self.target.apply(state.applied)
            kept = "the last good configuration" if state.last_good else "the default configuration"
            self.events.emit(
                "applied", round=state.round, trial=None, config=state.applied,
                note=f"no feasible trial this round; kept {kept}",
            )  # fmt: skip
        state.phase, state.baseline, state.samples, state.drifting = WATCHING, None, [], 0
        state.save(self.settings.state)

    def _confirm_round(self, spec: StudySpec, tuned_s: float) -> Trial | None:
        """The round's confirmation (``[daemon] confirm``): the session's protocol (two
        rounds choose among the three best, ``confirm`` rounds estimate, growing by the
        study's rule within the session's share of the round's time), its rounds stored
        with the study; returns what it keeps (``best_of``: the confirmed best, else the
        default), and logs a ``confirm`` event."""
        trials = self.api.list_trials(spec.name)
        measurements = self.api.list_measurements(spec.name)
        result = summarize(spec, trials, measurements, self.target.noiseless)
        if not result.ranking:
            return best_trial(spec, trials)
        protocol = replace(DEFAULT_PROTOCOL, confirm=self.settings.confirm)

        def store(trial_id: int, measurement: Measurement) -> None:
            self.api.add_measurements(spec.name, trial_id, [measurement])

        found = confirm_session(self.target, result, protocol, store, tuned_s=tuned_s)
        kept = best_of(spec, self.api.list_trials(spec.name), self.api.list_measurements(spec.name))
        interval = found.interval
        self.events.emit(
            "confirm", round=self.state.round,
            trial=None if found.best is None else found.best.trial.id,
            ratio=None if interval is None else round(interval.ratio, 4),
            low=None if interval is None else round(interval.low, 4),
            high=None if interval is None or not math.isfinite(interval.high)
            else round(interval.high, 4),
            significant=found.significant, rounds=found.rounds, stopped=found.stopped or None,
            kept=None if kept.trial is None else kept.trial.id,
        )  # fmt: skip
        return kept.trial

    def _measure_trial(self, spec: StudySpec, trial: Trial) -> Measured:
        """The trial measured window by window (``runner.measurement.measure_windows``):
        each window is one repeat; a window that breaks the SLO ends the trial with that
        window alone, and a trial that broke something is rolled back to the last good
        configuration before anything else runs. With ``[study.stopping] early_stop`` each
        window also goes to the study as progress, and a trial whose windows show it cannot
        win ends EARLY_STOPPED (the default never does). Without it nothing is reported: a
        daemon's windows are its repeats, stored once."""
        slo = self._slo(spec)

        def breach(metrics: Mapping[str, float]) -> str:
            return _breach(slo, metrics)

        def on_breach(window: int, constraint: str, metrics: Mapping[str, float]) -> None:
            self.events.emit(
                "slo_breach", round=self.state.round, trial=trial.id, window=window,
                constraint=constraint, metrics=metrics,
            )  # fmt: skip

        def rollback(broke: bool, restore_s: float) -> None:
            if not broke:
                return
            started = time.monotonic() - restore_s
            last_good = self.state.last_good
            if last_good is not None:
                self.target.apply(last_good)
            self.events.emit(
                "rollback", round=self.state.round,
                to="last good configuration" if last_good else "default configuration",
                config=last_good, seconds=round(time.monotonic() - started, 3),
            )  # fmt: skip

        return measure_windows(
            self.target, trial.config, self.settings.windows_per_trial, breach, rollback,
            on_breach, reporter(self.api, spec.name, trial) if spec.stopping.stops else None,
        )  # fmt: skip

    def _slo(self, spec: StudySpec) -> StudySpec:
        return with_resolved_constraints(spec, self.api.list_trials(spec.name))

    # -- watching -----------------------------------------------------------------------
    def _watch_window(self) -> None:
        state, settings = self.state, self.settings
        if state.windows and settings.interval_s:
            self.sleep(settings.interval_s)
        metrics = self.target.measure()
        state.windows += 1
        breach = _breach(self._slo(self.round_spec()), metrics)
        watched = {k: metrics[k] for k in settings.watch if k in metrics}
        self.events.emit("window", round=state.round, n=state.windows, metrics=watched)
        if breach:
            self.events.emit(
                "slo_breach", round=state.round, window=state.windows, constraint=breach,
                metrics=metrics, config=state.applied,
            )  # fmt: skip
            started = time.monotonic()
            self.target.restore()  # the system's own configuration, until the next round
            self.events.emit(
                "rollback", round=state.round, to="default configuration", config=None,
                seconds=round(time.monotonic() - started, 3),
            )  # fmt: skip
            state.applied = state.last_good = None
            if settings.control_every:  # does the default meet the SLO now?
                self._control(reapply=False)
            self._next_round("slo breach")
            return
        if settings.control_every and state.windows % settings.control_every == 0:
            self._control()
        if state.baseline is None:
            state.samples.append(watched)
            if len(state.samples) >= settings.baseline_windows:
                state.baseline = _mean(state.samples)
                state.samples = []
                state.machine_base = state.machine
                self.events.emit("baseline", round=state.round, baseline=state.baseline)
        else:
            moved = _relative_change(state.baseline, watched)
            far = {k: v for k, v in moved.items() if v > settings.drift}
            state.drifting = state.drifting + 1 if far else 0
            if state.drifting >= settings.drift_windows:
                if settings.control_every and self._the_machine_moved(watched, far):
                    state.baseline, state.samples, state.drifting = None, [], 0
                    state.save(settings.state)
                    return
                self.events.emit(
                    "drift", round=state.round, windows=state.drifting, baseline=state.baseline,
                    metrics=watched, change={k: round(v, 4) for k, v in far.items()},
                )  # fmt: skip
                self._next_round("drift")
                return
        state.save(settings.state)

    def _control(self, reapply: bool = True) -> float | None:
        """Measure the default configuration once as a control (``runner.measurement.
        control``: the round's default trial's configuration, stored with it; the knobs'
        defaults when the round has none), then apply the configuration in effect again.
        Returns the machine's factor, the control's objective over the round's default
        trial's (1: as when the round tuned; also kept in ``state.machine``), or None when
        it cannot be told."""
        state, spec = self.state, self.round_spec()
        try:
            found = control(self.api, self.target, spec, self.spec.space.default_config())
        finally:
            if reapply and state.applied is not None:
                self.target.apply(state.applied)
        if found.metrics is None:
            self.events.emit("control", round=state.round, error=found.reason)
            return None
        metrics = found.metrics
        name = spec.objective.name
        fields: dict[str, Any] = {"round": state.round, "metrics": metrics}
        factor = None
        if found.default is not None:
            base = found.default.metrics.get(name)
            if base and base > 0 and metrics.get(name, 0) > 0:
                factor = state.machine = metrics[name] / base
                fields["machine"] = round(factor, 4)
        fields["slo_breach"] = _breach(self._slo(spec), metrics) or None
        self.events.emit("control", **fields)
        return factor

    def _the_machine_moved(self, watched: Mapping[str, float], far: Mapping[str, float]) -> bool:
        """A drift was seen: is it the machine's? A control measured now says: when only the
        objective moved, and the default moved by the same factor since the baseline (within
        ``drift``), every configuration slowed alike and re-tuning would not help; the
        daemon logs ``machine_drift`` and learns a new baseline instead."""
        name = self.spec.objective.name
        if set(far) != {name} or self.state.baseline is None:
            return False
        factor = self._control()
        if factor is None or factor <= 0 or self.state.machine_base <= 0:
            return False
        applied = watched[name] / self.state.baseline[name]
        machine = factor / self.state.machine_base
        if abs(math.log(applied / machine)) > math.log1p(self.settings.drift):
            return False
        self.events.emit(
            "machine_drift", round=self.state.round, objective_change=round(applied, 4),
            default_change=round(machine, 4),
            note="the default moved as much: the machine (or the load on every "
            "configuration) changed; keeping the configuration, learning a new baseline",
        )  # fmt: skip
        return True

    def _next_round(self, why: str) -> None:
        state = self.state
        state.round += 1
        state.phase, state.baseline, state.samples, state.drifting = TUNING, None, [], 0
        state.machine = state.machine_base = 1.0
        self.events.emit("round", round=state.round, reason=why, study=self.round_spec().name)
        state.save(self.settings.state)


def _breach(spec: StudySpec, metrics: Mapping[str, float]) -> str:
    """The first resolved outcome constraint ``metrics`` break ('' when none does). A
    constraint whose metric is missing or not finite counts as broken; a relative one still
    waiting for the default's value is not judged."""
    for constraint in spec.outcome_constraints:
        if constraint.relative:
            continue
        value = metrics.get(constraint.metric)
        if value is None or not math.isfinite(value) or not constraint.satisfied(value):
            return f"{constraint} (measured {value})"
    return ""


def _mean(windows: list[dict[str, float]]) -> dict[str, float]:
    """Per metric, the mean over the windows that reported it."""
    names = dict.fromkeys(k for w in windows for k in w)
    out = {}
    for name in names:
        values = [w[name] for w in windows if name in w]
        out[name] = sum(values) / len(values)
    return out


def _reported_metrics(measured: Measured) -> dict[str, float]:
    """A measured trial's metrics as its ``trial`` event shows them: the windows' means."""
    if measured.metrics is not None:
        return dict(measured.metrics)
    return _mean([dict(m.metrics) for m in measured.repeats])


def _relative_change(
    baseline: Mapping[str, float], metrics: Mapping[str, float]
) -> dict[str, float]:
    out = {}
    for name, base in baseline.items():
        if name in metrics:
            out[name] = abs(metrics[name] - base) / max(abs(base), 1e-12)
    return out


def _set_aside(path: Path) -> None:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    with contextlib.suppress(OSError):
        os.replace(path, path.with_name(f"{path.name}.{stamp}.old"))


def _int(table: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"daemon.{key}", f"got {value!r}", f"an integer in [{low}, {high}]")
    return value


def _flag(table: Mapping[str, Any], key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ValidationError(f"daemon.{key}", f"got {value!r}", "true or false")
    return value


def _number(table: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValidationError(f"daemon.{key}", f"got {value!r}", f"a number in [{low}, {high}]")
    return float(value)
