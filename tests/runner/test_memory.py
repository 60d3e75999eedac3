"""Sessions on the in-memory study (``runner.memory.MemoryAPI``): the protocol's repeats,
means and spreads as the service stores them, a budget of measurements, and resuming."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from runner.measurement import DEFAULT_PROTOCOL
from runner.memory import MemoryAPI
from runner.session import run_session
from targets.base import Target
from tuner.errors import NotFoundError, StateError
from tuner.space import FloatKnob, Knob
from tuner.study import StudySpec
from tuner.trial import MeasurementKind, StepKind, TrialStatus

KNOBS = (FloatKnob("x", default=0.0, low=0.0, high=1.0),)
SPEC = StudySpec.from_dict(
    {
        "name": "mem",
        "objectives": [{"name": "tps", "goal": "maximize"}],
        "designer": {"seed": 2, "initial_trials": 3},
    },
    knobs=KNOBS,
)


class Noisy(Target):
    """``tps = (100 + 100 x) * lognormal noise (cov 10 %)``."""

    kind = "noisy"

    def __init__(self) -> None:
        self.rng = random.Random(5)
        self.runs = 0

    def describe_knobs(self) -> tuple[Knob, ...]:
        return KNOBS

    def describe_metrics(self) -> dict[str, str]:
        return {"tps": "higher is better"}

    def apply(self, config: dict[str, Any]) -> None:
        self.x = float(config["x"])

    def measure(self) -> dict[str, float]:
        self.runs += 1
        return {"tps": (100.0 + 100.0 * self.x) * math.exp(self.rng.gauss(0.0, 0.1))}

    def restore(self) -> None:
        pass


def test_a_session_on_memory_stores_repeats_and_their_means() -> None:
    api, target = MemoryAPI(), Noisy()
    protocol = DEFAULT_PROTOCOL.__class__(repeats=1, max_repeats=3, control_every=2)
    result = run_session(api, target, SPEC, 8, protocol=protocol)
    trials = api.list_trials("mem")
    assert len(trials) == 8 and all(t.status is TrialStatus.COMPLETED for t in trials)
    assert trials[0].step is StepKind.DEFAULT and trials[0].repeats == 3  # the default: most
    measured = api.list_measurements("mem")
    assert len(measured) == target.runs  # every run is kept: repeats and controls
    for t in trials:
        repeats = [m.metrics["tps"] for m in measured
                   if m.trial_id == t.id and m.kind is MeasurementKind.REPEAT]  # fmt: skip
        assert len(repeats) == t.repeats
        assert t.metrics["tps"] == pytest.approx(sum(repeats) / len(repeats))
        assert ("tps" in t.spread) == (len(repeats) > 1)
    controls = api.list_measurements("mem", trials[0].id, [MeasurementKind.CONTROL])
    assert len(controls) == 3  # after trials 2-3, 4-5, 6-7 (the default does not count)
    assert result.ranking and result.ranking[0].step is not StepKind.DEFAULT


def test_stop_ends_a_session_on_a_budget_of_measurements() -> None:
    api, target = MemoryAPI(), Noisy()
    protocol = DEFAULT_PROTOCOL.__class__(repeats=2)
    result = run_session(api, target, SPEC, 100, protocol=protocol, stop=lambda: target.runs >= 9)
    # two runs per trial: asked before each trial, it stops after the fifth (10 runs), never
    # inside a trial
    assert len(result.trials) == 5 and target.runs == 10


def test_an_unfinished_trial_goes_back_to_its_client_and_errors_name_what_is_missing() -> None:
    api = MemoryAPI()
    assert api.create_study(SPEC)[1] and not api.create_study(SPEC)[1]
    [first] = api.suggest_trials("mem", 1, "w1")
    assert api.suggest_trials("mem", 1, "w1") == [first]  # resumed, not a new one
    [other] = api.suggest_trials("mem", 1, "w2")
    assert other.id == first.id + 1
    api.complete_trial("mem", first.id, {"tps": 1.0})
    with pytest.raises(StateError, match="COMPLETED"):
        api.complete_trial("mem", first.id, {"tps": 2.0})
    with pytest.raises(NotFoundError, match="no trial 9"):
        api.heartbeat("mem", 9)
    with pytest.raises(NotFoundError, match="no study named 'nope'"):
        api.list_trials("nope")
