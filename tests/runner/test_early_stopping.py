"""Early stopping in a session (``runner.session`` over ``runner.memory.MemoryAPI``): a
target that reports windows, the study's stop rule, and what is stored. The session-level
test of each stop rule fails when it stops a trial that would have won."""

from __future__ import annotations

import math
import random
from typing import Any

from runner.measurement import MeasurementProtocol
from runner.memory import MemoryAPI
from runner.session import run_session
from targets.base import Target
from tuner.space import Config, FloatKnob, Knob
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, TrialStatus

WINDOWS = 10


def truth(x: float) -> dict[str, float]:
    """Throughput rises with x to 2000 at x = 0.8 then falls; latency breaks 5 ms below
    x = 0.15 (a configuration that is fast but cannot meet the SLO)."""
    tps = 2000.0 * math.exp(-(((x - 0.8) / 0.35) ** 2)) + 200.0
    p95 = 12.0 if x < 0.15 else 2.0 + x
    return {"tps": tps, "p95_ms": p95}


class Windowed(Target):
    """Reports its measurement in ``WINDOWS`` windows around ``truth`` with 3 % noise per
    window (a seeded stream), and stops when told; logs how many windows each run ran."""

    kind = "windowed"

    def __init__(self) -> None:
        self.rng = random.Random(5)
        self.x = 0.0
        self.ran: list[tuple[float, int]] = []

    def describe_knobs(self) -> tuple[Knob, ...]:
        return (FloatKnob("x", default=0.3, low=0.0, high=1.0),)

    def describe_metrics(self) -> dict[str, str]:
        return {"tps": "ops/s", "p95_ms": "ms"}

    def apply(self, config: Config) -> None:
        self.x = float(config["x"])

    def measure(self) -> dict[str, float]:
        true = truth(self.x)
        seen: list[dict[str, float]] = []
        for _ in range(WINDOWS):
            window = {k: v * math.exp(self.rng.gauss(0.0, 0.03)) for k, v in true.items()}
            seen.append(window)
            if self.window(window):
                break
        if self.watched:  # a trial's run (controls and confirmations report no windows)
            self.ran.append((self.x, len(seen)))
        return {k: sum(w[k] for w in seen) / len(seen) for k in true}

    def restore(self) -> None:
        self.x = 0.0


def _spec(**stopping: Any) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "es",
            "objectives": [{"name": "tps", "goal": "maximize"}],
            "outcome_constraints": ["p95_ms <= 5"],
            "designer": {"seed": 2, "initial_trials": 5},
            "stopping": {"early_stop": True, **stopping},
        },
        knobs=Windowed().describe_knobs(),
    )


def test_losing_trials_stop_early_and_none_would_have_won() -> None:
    """The default again every 3 trials (controls) measures the run-to-run noise the rule
    needs; before the first control nothing can be stopped."""
    api, target = MemoryAPI(), Windowed()
    result = run_session(api, target, _spec(), 16, protocol=MeasurementProtocol(control_every=3))
    trials = {t.id: t for t in result.trials}
    stopped = [t for t in result.trials if t.status is TrialStatus.EARLY_STOPPED]
    assert stopped, "nothing stopped: the rule saved no time"
    default = next(t for t in result.trials if t.step is StepKind.DEFAULT)
    assert default.status is TrialStatus.COMPLETED  # the reference is never stopped
    for trial in stopped:
        # what it would have measured in full lost to a trial completed before it, or
        # broke the constraint: the rule never stopped a trial that would have won
        true = truth(float(trial.config["x"]))
        earlier = [t for t in result.trials if t.id < trial.id and t.status is TrialStatus.COMPLETED
                   and t.metrics["p95_ms"] <= 5]  # fmt: skip
        best = max((t.metrics["tps"] for t in earlier), default=-math.inf)
        assert true["p95_ms"] > 5 or true["tps"] < best, (trial.id, true, best)
        assert trial.reason.startswith("stopped early after")
        assert trials[trial.id].metrics["tps"] > 0  # it keeps what it measured
    windows = {x: n for x, n in target.ran}
    assert all(windows[float(t.config["x"])] < WINDOWS for t in stopped)
    progress = api.list_measurements("es", kinds=[MeasurementKind.PROGRESS])
    assert len(progress) == sum(n for _, n in target.ran)  # every window is stored
    assert result.best is not None and result.best.status is TrialStatus.COMPLETED


def test_the_constraint_rule_stops_a_trial_that_cannot_meet_the_slo() -> None:
    """No feasible incumbent yet (the default broke the SLO), so only the constraint rule
    can stop: windows at about 12 ms against a 5 ms bound stop the trial within eight (never
    before the fourth); windows at about 2.5 ms never do."""
    api, rng = MemoryAPI(), random.Random(3)
    api.create_study(_spec())
    [default] = api.suggest_trials("es", 1, "me")
    api.complete_trial("es", default.id, {"tps": 900.0, "p95_ms": 20.0})
    controls = [Measurement({"tps": v, "p95_ms": 20 * v / 900}, MeasurementKind.CONTROL)
                for v in (880.0, 930.0, 905.0)]  # fmt: skip
    api.add_measurements("es", default.id, controls)  # the run-to-run noise the rule needs
    for x, stops in ((0.05, True), (0.5, False)):
        [trial] = api.suggest_trials("es", 1, "me")
        answers = []
        for _ in range(8):
            window = {k: v * math.exp(rng.gauss(0.0, 0.03)) for k, v in truth(x).items()}
            answers.append(api.report_progress("es", trial.id, window, "me"))
        assert not any(a.stop for a in answers[:3])  # min_windows = 4
        assert answers[-1].stop is stops, (x, [a.stop for a in answers])
        if stops:
            assert "p95_ms cannot meet p95_ms <= 5" in answers[-1].reason
        api.complete_trial("es", trial.id, truth(x))


def test_without_early_stop_every_trial_runs_its_windows_and_they_are_stored() -> None:
    api, target = MemoryAPI(), Windowed()
    protocol = MeasurementProtocol(control_every=3)
    result = run_session(api, target, _spec(early_stop=False), 8, protocol=protocol)
    assert all(t.status is TrialStatus.COMPLETED for t in result.trials)
    assert all(n == WINDOWS for _, n in target.ran)
    progress = api.list_measurements("es", kinds=[MeasurementKind.PROGRESS])
    assert len(progress) == 8 * WINDOWS  # the trials' windows; controls report none
    assert sorted({m.round for m in progress}) == list(range(1, WINDOWS + 1))
