"""The measurement protocol: repeats, adaptive repeats, controls, drift and unstable trials.

A fake noisy target with a known truth (``Noisy``) stands in for a busy machine: every
measurement is the truth times lognormal noise, divided by a slow-down the test chooses per
run, so each test knows what a correct report is.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.measurement import MeasurementProtocol, could_win, measure
from runner.session import run_session, summarize
from server.service import TuningService
from server.storage import SQLiteStorage
from targets.base import ConfigRejected, Target, TrialOutcome
from tuner.confirmation import pooled_noise
from tuner.errors import ValidationError
from tuner.space import FloatKnob, Knob
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, TrialStatus

KNOBS = (FloatKnob("x", default=0.0, low=0.0, high=1.0),)


def make_spec(name: str = "noisy", constraint: str | None = "p95_ms <= 10") -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "objectives": [{"name": "tps", "goal": "maximize"}],
            "outcome_constraints": [constraint] if constraint else [],
            "designer": {"seed": 3, "initial_trials": 4},
        },
        knobs=KNOBS,
    )


def truth(x: float) -> float:
    """The true throughput: 100 at the default, 200 at x = 0.7, falling off beyond."""
    return 100.0 + 100.0 * math.exp(-(((x - 0.7) / 0.25) ** 2)) - 100.0 * math.exp(-12.0)


class Noisy(Target):
    """``tps = truth(x) * noise / slow(run)``, ``p95_ms = 5 * slow(run)``.

    Args:
        cov: The spread of the lognormal noise (its log standard deviation).
        slow: The machine's slow-down for the n-th run (from 0).
        wild: Configurations whose measurements swing wildly (an unstable system).
    """

    kind = "noisy"

    def __init__(
        self,
        cov: float = 0.05,
        seed: int = 0,
        slow: Callable[[int], float] = lambda n: 1.0,
        wild: Callable[[float], bool] = lambda x: False,
    ) -> None:
        self.cov, self.slow, self.wild = cov, slow, wild
        self.rng = random.Random(seed)
        self.runs: list[float] = []

    def describe_knobs(self) -> tuple[Knob, ...]:
        return KNOBS

    def describe_metrics(self) -> dict[str, str]:
        return {"tps": "higher is better", "p95_ms": "lower is better"}

    def apply(self, config: dict[str, Any]) -> None:
        self.x = float(config["x"])

    def measure(self) -> dict[str, float]:
        slow = self.slow(len(self.runs))
        self.runs.append(self.x)
        noise = math.exp(self.rng.gauss(0.0, self.cov))
        if self.wild(self.x):
            noise *= 2.0 if len(self.runs) % 2 else 0.5
        return {"tps": truth(self.x) * noise / slow, "p95_ms": 5.0 * slow}

    def restore(self) -> None:
        pass


@pytest.fixture
def service(tmp_path: Path) -> Iterator[TuningService]:
    svc = TuningService(SQLiteStorage(tmp_path / "t.db"))
    yield svc
    svc.close()


@pytest.mark.parametrize(
    ("settings", "field", "allowed"),
    [
        ({"repeats": 0}, "session.repeats", "[1, 100]"),
        ({"repeats": True}, "session.repeats", "[1, 100]"),
        ({"control_every": -1}, "session.control_every", "[0, 10000]"),
        ({"repeats": 3, "max_repeats": 2}, "session.max_repeats", "[3, 100]"),
        ({"confirm": 101}, "session.confirm", "[0, 100]"),
        ({"confirm_select": -1}, "session.confirm_select", "[0, 100]"),
        ({"confirm_max": 101}, "session.confirm_max", "[0, 100]"),
        ({"confirm_width": 1.0}, "session.confirm_width", "(1, 100]"),
        ({"confirm_width": "2"}, "session.confirm_width", "(1, 100]"),
    ],
)
def test_a_bad_protocol_names_the_field_and_the_allowed_values(
    settings: dict[str, Any], field: str, allowed: str
) -> None:
    with pytest.raises(ValidationError) as error:
        MeasurementProtocol(**settings)
    assert error.value.field == field and allowed in str(error.value)


class Script(Target):
    """Outcomes from a list, one per run."""

    kind = "script"

    def __init__(self, outcomes: list[TrialOutcome]) -> None:
        self.outcomes = outcomes

    def run_trial(self, config: dict[str, Any], progress: Any = None) -> TrialOutcome:
        return self.outcomes.pop(0)

    def describe_knobs(self) -> tuple[Knob, ...]:
        return KNOBS

    def describe_metrics(self) -> dict[str, str]:
        return {}

    def apply(self, config: dict[str, Any]) -> None:
        raise ConfigRejected("not used")

    def measure(self) -> dict[str, float]:
        return {}

    def restore(self) -> None:
        pass


def ok(tps: float) -> TrialOutcome:
    return TrialOutcome(TrialStatus.COMPLETED, {"tps": tps, "p95_ms": 5.0})


def test_measure_repeats_then_stops_where_the_configuration_or_the_machine_failed() -> None:
    done = measure(Script([ok(1), ok(2), ok(3)]), {"x": 0.0}, 3)
    assert done.status is TrialStatus.COMPLETED and len(done.repeats) == 3
    assert [r.metrics["tps"] for r in done.repeats] == [1, 2, 3]
    assert all(r.kind is MeasurementKind.REPEAT and r.at > 0 for r in done.repeats)
    # a configuration that breaks the system on its second run is not stable: INFEASIBLE
    broke = TrialOutcome(TrialStatus.INFEASIBLE, {}, "crashed")
    done = measure(Script([ok(1), broke, ok(3)]), {"x": 0.0}, 3)
    assert done.status is TrialStatus.INFEASIBLE and done.reason == "repeat 2: crashed"
    assert done.repeats == ()
    # the machine's failure after good runs keeps them
    lost = TrialOutcome(TrialStatus.FAILED, {}, "disk full")
    done = measure(Script([ok(1), ok(2), lost]), {"x": 0.0}, 3)
    assert done.status is TrialStatus.COMPLETED and len(done.repeats) == 2
    # adaptive: more while the caller says so, never beyond ``most``
    done = measure(Script([ok(1)] * 9), {"x": 0.0}, 1, lambda values: True, most=4)
    assert len(done.repeats) == 4
    done = measure(Script([ok(1)] * 9), {"x": 0.0}, 2, lambda values: False, most=4)
    assert len(done.repeats) == 2


def test_a_trial_is_raced_while_its_upper_bound_reaches_the_incumbent() -> None:
    spec = make_spec()
    noise = {"tps": (0.1**2, 20), "p95_ms": (0.05**2, 20)}  # 10 % and 5 % per measurement
    incumbent = {"tps": 100.0, "p95_ms": 5.0}
    # 85 is 16 % below 100; one measurement's bound reaches 100 * exp(0.2) = 122: race on
    assert could_win(spec, [{"tps": 85.0, "p95_ms": 5.0}], incumbent, noise)
    # four measurements averaging 85: the bound is 85 * exp(0.1) = 94 < 100: stop
    assert not could_win(spec, [{"tps": 85.0, "p95_ms": 5.0}] * 4, incumbent, noise)
    # far below after one: stop at once
    assert not could_win(spec, [{"tps": 60.0, "p95_ms": 5.0}], incumbent, noise)
    # a p95 of 12 cannot come under 10 within two standard errors of 5 %: stop
    assert not could_win(spec, [{"tps": 150.0, "p95_ms": 12.0}], incumbent, noise)
    # nothing feasible yet: only the constraint decides
    assert could_win(spec, [{"tps": 1.0, "p95_ms": 9.0}], None, noise)
    # unknown noise never rules a trial out
    assert could_win(spec, [{"tps": 1.0, "p95_ms": 50.0}], incumbent, {})


def test_an_adaptive_session_measures_the_promising_trials_more_and_stores_every_repeat(
    service: TuningService,
) -> None:
    spec = make_spec()
    target = Noisy(cov=0.05, seed=1)
    protocol = MeasurementProtocol(repeats=1, max_repeats=4, control_every=3)
    result = run_session(service, target, spec, 14, protocol=protocol)
    trials = result.trials
    default = result.default
    assert default is not None and default.repeats == 4  # the reference, as often as any
    others = [t for t in trials if t is not default]
    counts = [t.repeats for t in others]
    assert min(counts) == 1 and max(counts) > 1, counts
    assert sum(counts) < 4 * len(others)  # the poor ones were not repeated
    repeats = service.list_measurements(spec.name, kinds=[MeasurementKind.REPEAT])
    assert len(repeats) == sum(t.repeats for t in trials)
    for trial in trials:
        mine = [m.metrics["tps"] for m in repeats if m.trial_id == trial.id]
        assert trial.metrics["tps"] == pytest.approx(sum(mine) / len(mine))
        assert (trial.spread.get("tps") is not None) == (len(mine) > 1)
    # a control of the default after every 3 trials, stored apart from its repeats
    controls = service.list_measurements(spec.name, kinds=[MeasurementKind.CONTROL])
    assert len(controls) == (len(trials) - 1) // 3
    assert {m.trial_id for m in controls} == {default.id}
    assert target.runs.count(0.0) >= 4 + len(controls)
    # what summarize reads back
    assert result.drift is not None and len(result.drift.values) == 4 + len(controls)
    assert not result.drift.changed()


def test_a_machine_that_slows_down_is_reported_as_drift(service: TuningService) -> None:
    spec = make_spec(constraint=None)
    target = Noisy(cov=0.03, seed=2, slow=lambda n: 1.0 if n < 12 else 2.0)
    protocol = MeasurementProtocol(repeats=1, max_repeats=2, control_every=2)
    result = run_session(service, target, spec, 12, protocol=protocol)
    assert result.drift is not None and result.drift.changed()
    _, worst = result.drift.worst(maximize=True)
    assert worst == pytest.approx(0.5, rel=0.15)
    # the first controls saw the old machine
    assert result.drift.factors[0] == pytest.approx(1.0, rel=0.1)
    # trials measured once the machine had slowed (after the last two controls' times):
    # their raw ratio to the default is half the truth, but against the default as the
    # machine was then, they are right
    late = [t for t in result.trials if t.updated_at > result.drift.times[-2]]
    assert late and all(t.id in result.relative for t in late)
    default = truth(0.0)
    for t in late:
        true_ratio = truth(float(t.config["x"])) / default
        assert result.relative[t.id] == pytest.approx(true_ratio, rel=0.12)
        assert t.metrics["tps"] / result.drift.reference < 0.7 * true_ratio


def test_a_trial_whose_repeats_disagree_is_flagged_and_never_the_best(
    service: TuningService,
) -> None:
    """Configurations above x = 0.5 swing between half and twice their truth: their mean
    can beat everything, but they are not what a user wants deployed."""
    spec = make_spec(constraint=None)
    target = Noisy(cov=0.03, seed=4, wild=lambda x: x > 0.5)
    result = run_session(service, target, spec, 14, protocol=MeasurementProtocol(repeats=3))
    wild = [t.id for t in result.trials if t.config["x"] > 0.5]
    assert wild and set(wild) <= set(result.unstable)
    assert result.best is not None and result.best.id not in wild
    assert result.best.config["x"] <= 0.5


def test_pooled_noise_pools_repeats_and_controls_per_metric_on_the_log_scale() -> None:
    spec = make_spec()

    def m(trial: int, tps: float, kind: MeasurementKind = MeasurementKind.REPEAT) -> Measurement:
        return Measurement({"tps": tps, "p95_ms": 5.0}, kind, 1.0, 0, trial)

    control, confirm = MeasurementKind.CONTROL, MeasurementKind.CONFIRM
    found = pooled_noise(
        spec,
        [m(1, 100), m(1, 110), m(2, 50), m(1, 90, control), m(3, 10, confirm), m(3, 1000, confirm)],
    )
    var, df = found["tps"]
    logs = [math.log(v) for v in (100, 110, 90)]
    mean = sum(logs) / 3
    assert df == 2 and var == pytest.approx(sum((v - mean) ** 2 for v in logs) / 2)
    assert found["p95_ms"] == (0.0, 2)
    assert pooled_noise(spec, [m(1, 100), m(1, 110)], exclude=1) == {}


def test_summarize_leaves_unstable_trials_out_of_the_best_and_keeps_the_raw_values() -> None:
    spec = make_spec(constraint=None)
    from tuner.trial import Trial

    trials = [
        Trial(1, {"x": 0.0}, TrialStatus.COMPLETED, {"tps": 100.0, "p95_ms": 5.0},
              step=StepKind.DEFAULT, repeats=3),
        Trial(2, {"x": 0.3}, TrialStatus.COMPLETED, {"tps": 150.0, "p95_ms": 5.0}, repeats=3),
        Trial(3, {"x": 0.6}, TrialStatus.COMPLETED, {"tps": 190.0, "p95_ms": 5.0}, repeats=3),
    ]  # fmt: skip
    values = {1: [99, 100, 101], 2: [149, 150, 151], 3: [60, 390, 120]}
    measurements = [
        Measurement({"tps": float(v), "p95_ms": 5.0}, MeasurementKind.REPEAT, float(i), 0, t)
        for t, vs in values.items() for i, v in enumerate(vs)
    ]  # fmt: skip
    result = summarize(spec, trials, measurements)
    assert result.unstable == (3,)
    assert result.best is not None and result.best.id == 2
    assert result.ratio == pytest.approx(1.5)
    assert summarize(spec, trials).best.id == 3  # type: ignore[union-attr]
