"""The daemon's measurement protocol, in process: trial windows stored as repeats, controls
of the default while watching, and drift judged per control (``daemon.control_every``)."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runner.daemon import Daemon, DaemonSettings, EventLog
from server.service import TuningService
from server.storage import SQLiteStorage
from targets.base import Target
from tuner.space import FloatKnob, Knob
from tuner.study import StudySpec
from tuner.trial import MeasurementKind, StepKind

KNOBS = (FloatKnob("x", default=0.0, low=0.0, high=1.0),)
SPEC = StudySpec.from_dict(
    {
        "name": "d",
        "objectives": [{"name": "tps", "goal": "maximize"}],
        "outcome_constraints": ["p95_ms <= 10"],
        "designer": {"seed": 1, "initial_trials": 2},
    },
    knobs=KNOBS,
)


class Device(Target):
    """``tps = (100 + 100 x) * speed``; after ``change_at`` measurements, ``slow`` divides
    the speed of every configuration (the machine) or of the tuned ones only (the load)."""

    kind = "device"

    def __init__(self, change_at: int, machine: bool) -> None:
        self.change_at, self.machine = change_at, machine
        self.calls = 0
        self.x = 0.0

    def describe_knobs(self) -> tuple[Knob, ...]:
        return KNOBS

    def describe_metrics(self) -> dict[str, str]:
        return {"tps": "higher is better", "p95_ms": "lower is better"}

    def apply(self, config: dict[str, Any]) -> None:
        self.x = float(config["x"])

    def measure(self) -> dict[str, float]:
        self.calls += 1
        changed = self.calls > self.change_at and (self.machine or self.x > 0)
        speed = 0.5 if changed else 1.0
        return {"tps": (100 + 100 * self.x) * speed, "p95_ms": 5.0}

    def restore(self) -> None:
        self.x = 0.0


def run(
    tmp_path: Path, target: Target, windows: int, spec: StudySpec = SPEC, trials: int = 4,
    **settings: Any,
) -> tuple[TuningService, list[dict[str, Any]]]:  # fmt: skip
    """The daemon on ``target`` for ``windows`` watch windows: its service and events."""
    service = TuningService(SQLiteStorage(tmp_path / "t.db"))
    stream = io.StringIO()
    chosen = {
        "windows_per_trial": 2, "watch": ("tps",), "drift": 0.25, "drift_windows": 2,
        "baseline_windows": 2, "control_every": 2, **settings,
    }  # fmt: skip
    config = DaemonSettings(state=tmp_path / "state.json", max_windows=windows, **chosen)
    Daemon(service, target, spec, trials, config, EventLog(None, stream)).run()
    return service, [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_slower_machine_is_logged_but_does_not_start_a_new_round(tmp_path: Path) -> None:
    # 4 trials x 2 windows = 8 calls; then windows and controls; the machine halves at 14
    service, events = run(tmp_path, Device(change_at=14, machine=True), windows=12)
    kinds = [e["event"] for e in events]
    assert "machine_drift" in kinds and "drift" not in kinds and "round" not in kinds
    controls = [e for e in events if e["event"] == "control"]
    assert controls[0]["machine"] == pytest.approx(1.0)
    assert controls[-1]["machine"] == pytest.approx(0.5)
    # each trial's windows are its repeats; the controls belong to the default trial
    trials = service.list_trials("d.r1")
    assert all(t.repeats == 2 for t in trials)
    default = next(t for t in trials if t.step is StepKind.DEFAULT)
    stored = service.list_measurements("d.r1", kinds=[MeasurementKind.CONTROL])
    assert len(stored) == len(controls) and {m.trial_id for m in stored} == {default.id}
    service.close()


def test_a_load_that_slows_only_the_tuned_configuration_starts_a_new_round(
    tmp_path: Path,
) -> None:
    service, events = run(tmp_path, Device(change_at=14, machine=False), windows=12)
    kinds = [e["event"] for e in events]
    assert "drift" in kinds and "round" in kinds and "machine_drift" not in kinds
    service.close()


def test_the_control_measures_the_default_on_a_command_target_with_placeholders(
    tmp_path: Path,
) -> None:
    """A command whose arguments name a knob (``{batch}``) cannot run on a restored, empty
    configuration; the control runs the default trial's configuration instead, so every
    control of a real command target measures (they all failed when it restored and
    measured)."""
    import sys

    from targets.registry import build_target
    from tuner.space import IntKnob

    program = tmp_path / "infer.py"
    program.write_text(
        "import json, sys\nbatch = int(sys.argv[1])\n"
        "print(json.dumps({'tps': 100.0 + batch, 'p95_ms': 5.0}))\n",
        encoding="utf-8",
    )
    spec = StudySpec.from_dict(
        {
            "name": "cmd",
            "objectives": [{"name": "tps", "goal": "maximize"}],
            "outcome_constraints": ["p95_ms <= 10"],
            "designer": {"seed": 1, "initial_trials": 2},
        },
        knobs=(IntKnob("batch", default=1, low=1, high=64),),
    )
    options = {"command": [sys.executable, str(program), "{batch}"], "metrics": ["tps", "p95_ms"]}
    with build_target("command", options) as target:
        service, events = run(tmp_path, target, 4, spec, 3, windows_per_trial=1,
                              baseline_windows=1, drift_windows=3)  # fmt: skip
    controls = [e for e in events if e["event"] == "control"]
    assert len(controls) == 2 and all("error" not in c for c in controls), controls
    assert all(c["metrics"]["tps"] == 101.0 and c["machine"] == 1.0 for c in controls)
    stored = service.list_measurements("cmd.r1", kinds=[MeasurementKind.CONTROL])
    assert [m.metrics["tps"] for m in stored] == [101.0, 101.0]


class NoisyDevice(Device):
    """``Device`` whose every measurement is off by up to 5 %, seeded."""

    def __init__(self) -> None:
        import random

        super().__init__(change_at=10**9, machine=True)
        self.rng = random.Random(5)

    def measure(self) -> dict[str, float]:
        got = super().measure()
        return {**got, "tps": got["tps"] * self.rng.uniform(0.95, 1.05)}


@pytest.mark.parametrize("rule", ["fixed", "sequential"])
def test_a_round_is_confirmed_before_its_best_is_applied(tmp_path: Path, rule: str) -> None:
    """``[daemon] confirm``: after the round's trials the default and its best few run in
    interleaved rounds (stored as CONFIRM measurements), by the study's rule, and the daemon
    applies what the confirmation keeps: here the confirmed best, a real gain."""
    spec = replace(SPEC, stopping=replace(SPEC.stopping, confirm=rule))
    service, events = run(tmp_path, NoisyDevice(), 1, spec, 5, windows_per_trial=1,
                          baseline_windows=1, control_every=0, confirm=3)  # fmt: skip
    (found,) = [e for e in events if e["event"] == "confirm"]
    applied = next(e for e in events if e["event"] == "applied")
    assert found["significant"] and found["ratio"] > 1.2 and found["kept"] == applied["trial"]
    assert found["rounds"] >= 3 and (found["stopped"] is None) == (rule == "fixed")
    stored = service.list_measurements("d.r1", kinds=[MeasurementKind.CONFIRM])
    assert len(stored) >= 2 * 3 + 2  # the estimate's rounds, after the selection's
    service.close()
