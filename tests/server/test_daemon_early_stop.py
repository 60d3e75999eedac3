"""The daemon's trials and the study's stop rule: each window of a trial goes to the study
as progress, and ``[study.stopping] early_stop`` ends a trial whose windows show it cannot
beat the round's best (``runner.measurement.measure_windows``, ``runner.loop.reporter``)."""

from __future__ import annotations

import io
import json
import math
import random
from pathlib import Path
from typing import Any

from runner.daemon import Daemon, DaemonSettings, EventLog
from server.service import TuningService
from server.storage import SQLiteStorage
from targets.base import Target
from tuner.space import FloatKnob, Knob
from tuner.study import StudySpec
from tuner.trial import MeasurementKind, StepKind, TrialStatus

KNOBS = (FloatKnob("x", default=0.9, low=0.0, high=1.0),)
WINDOWS = 8


def true_tps(x: float) -> float:
    return 100.0 + 100.0 * x


class Noisy(Target):
    """``tps = 100 + 100 x`` with 2 % noise a window (seeded); counts the windows each
    configuration ran."""

    kind = "noisy"

    def __init__(self) -> None:
        self.rng = random.Random(3)
        self.x = 0.0
        self.windows: dict[float, int] = {}

    def describe_knobs(self) -> tuple[Knob, ...]:
        return KNOBS

    def describe_metrics(self) -> dict[str, str]:
        return {"tps": "higher is better", "p95_ms": "lower is better"}

    def apply(self, config: dict[str, Any]) -> None:
        self.x = float(config["x"])

    def measure(self) -> dict[str, float]:
        self.windows[self.x] = self.windows.get(self.x, 0) + 1
        return {"tps": true_tps(self.x) * math.exp(self.rng.gauss(0.0, 0.02)), "p95_ms": 5.0}

    def restore(self) -> None:
        self.x = 0.0


def _run(tmp_path: Path, early_stop: bool) -> tuple[TuningService, list[dict[str, Any]], Noisy]:
    spec = StudySpec.from_dict(
        {
            "name": "d",
            "objectives": [{"name": "tps", "goal": "maximize"}],
            "outcome_constraints": ["p95_ms <= 10"],
            "designer": {"seed": 1, "initial_trials": 4},
            "stopping": {"early_stop": early_stop},
        },
        knobs=KNOBS,
    )
    service = TuningService(SQLiteStorage(tmp_path / "t.db"))
    stream = io.StringIO()
    settings = DaemonSettings(
        state=tmp_path / "state.json", windows_per_trial=WINDOWS, watch=("tps",),
        baseline_windows=1, max_windows=1,
    )  # fmt: skip
    target = Noisy()
    Daemon(service, target, spec, 6, settings, EventLog(None, stream)).run()
    return service, [json.loads(line) for line in stream.getvalue().splitlines()], target


def test_a_losing_trial_leaves_the_device_early_and_none_that_would_have_won(
    tmp_path: Path,
) -> None:
    service, events, target = _run(tmp_path, early_stop=True)
    trials = service.list_trials("d.r1")
    stopped = [t for t in trials if t.status is TrialStatus.EARLY_STOPPED]
    assert stopped, [(t.config, t.status) for t in trials]
    best = max(
        (t for t in trials if t.status is TrialStatus.COMPLETED), key=lambda t: t.metrics["tps"]
    )
    for trial in stopped:
        # stopped after min_windows (4) and before its last window, on what it measured
        assert 4 <= trial.repeats < WINDOWS and "cannot beat" in trial.reason
        assert target.windows[float(trial.config["x"])] == trial.repeats
        # none that would have won: its true throughput is below the best trial's
        assert true_tps(float(trial.config["x"])) < true_tps(float(best.config["x"]))
        windows = service.list_measurements("d.r1", trial.id, [MeasurementKind.PROGRESS])
        assert [m.round for m in windows] == list(range(1, trial.repeats + 1))
    default = next(t for t in trials if t.step is StepKind.DEFAULT)
    assert default.status is TrialStatus.COMPLETED and default.repeats == WINDOWS
    # slower is not broken: no rollback; the events say which trials stopped
    assert not [e for e in events if e["event"] == "rollback"]
    said = {e["trial"]: e["status"] for e in events if e["event"] == "trial"}
    assert {t.id for t in stopped} == {i for i, s in said.items() if s == "EARLY_STOPPED"}
    service.close()


def test_without_the_rule_every_trial_runs_all_its_windows(tmp_path: Path) -> None:
    service, _, _ = _run(tmp_path, early_stop=False)
    trials = service.list_trials("d.r1")
    assert all(t.status is TrialStatus.COMPLETED and t.repeats == WINDOWS for t in trials)
    # a daemon's windows are its repeats: without a rule they are not stored twice
    assert not service.list_measurements("d.r1", kinds=[MeasurementKind.PROGRESS])
    repeats = service.list_measurements("d.r1", kinds=[MeasurementKind.REPEAT])
    assert len(repeats) == WINDOWS * len(trials)
    service.close()
