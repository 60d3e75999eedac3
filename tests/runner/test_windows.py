"""The daemon's windowed measurement (``runner.measurement.measure_windows``) and the one
control routine of sessions and the daemon (``runner.measurement.control``)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from runner.measurement import Measured, control, measure_windows
from runner.memory import MemoryAPI
from targets.base import Target
from tuner.errors import ConfigRejected, TargetError, TrialTimedOut
from tuner.space import Config, FloatKnob, Knob
from tuner.study import StudySpec
from tuner.trial import MeasurementKind, TrialStatus


class Scripted(Target):
    """Measures the windows it was given, in order; logs every call."""

    kind = "scripted"

    def __init__(
        self, windows: list[dict[str, float] | Exception], apply_error: Exception | None = None
    ) -> None:
        self.windows, self.apply_error = list(windows), apply_error
        self.calls: list[str] = []

    def describe_knobs(self) -> tuple[Knob, ...]:
        return (FloatKnob("x", default=0.0, low=0.0, high=1.0),)

    def describe_metrics(self) -> dict[str, str]:
        return {"tps": "ops/s", "p95_ms": "ms"}

    def apply(self, config: Config) -> None:
        self.calls.append(f"apply {config['x']}")
        if self.apply_error is not None:
            raise self.apply_error

    def measure(self) -> dict[str, float]:
        self.calls.append("measure")
        window = self.windows.pop(0)
        if isinstance(window, Exception):
            raise window
        return dict(window)

    def restore(self) -> None:
        self.calls.append("restore")


def _slo(metrics: Mapping[str, float]) -> str:
    return "p95_ms <= 10" if metrics.get("p95_ms", 0.0) > 10 else ""


def _run(
    target: Scripted, windows: int = 3
) -> tuple[Measured, list[tuple[bool, float]], list[int]]:
    rollbacks: list[tuple[bool, float]] = []
    breaches: list[int] = []
    measured = measure_windows(
        target, {"x": 0.5}, windows, _slo, lambda broke, s: rollbacks.append((broke, s)),
        lambda window, constraint, metrics: breaches.append(window),
    )  # fmt: skip
    return measured, rollbacks, breaches


def test_every_window_is_a_repeat_of_one_applied_configuration() -> None:
    target = Scripted([{"tps": 10.0, "p95_ms": 5.0}, {"tps": 12.0, "p95_ms": 6.0}])
    measured, rollbacks, breaches = _run(target, 2)
    assert measured.status is TrialStatus.COMPLETED and measured.metrics is None
    assert [m.metrics["tps"] for m in measured.repeats] == [10.0, 12.0]
    assert target.calls == ["apply 0.5", "measure", "measure", "restore"]
    assert [b for b, _ in rollbacks] == [False] and breaches == []


def test_a_window_that_breaks_the_slo_ends_the_trial_with_that_window_and_rolls_back() -> None:
    target = Scripted([{"tps": 10.0, "p95_ms": 5.0}, {"tps": 30.0, "p95_ms": 50.0}, {"tps": 1.0}])
    measured, rollbacks, breaches = _run(target)
    assert measured.status is TrialStatus.COMPLETED
    assert [m.metrics["p95_ms"] for m in measured.repeats] == [50.0]  # the breach alone
    assert target.calls == ["apply 0.5", "measure", "measure", "restore"]  # no third window
    assert breaches == [2] and [b for b, _ in rollbacks] == [True]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ConfigRejected("would not start"), TrialStatus.INFEASIBLE),
        (TrialTimedOut("took 60 s"), TrialStatus.TIMED_OUT),
        (TargetError("disk full"), TrialStatus.FAILED),
    ],
)
def test_a_target_error_is_the_outcome_it_stands_for_and_rolls_back(
    error: TargetError, status: TrialStatus
) -> None:
    target = Scripted([{"tps": 10.0, "p95_ms": 5.0}, error])
    measured, rollbacks, _ = _run(target)
    assert (measured.status, measured.repeats, measured.reason) == (status, (), str(error))
    assert target.calls[-1] == "restore" and [b for b, _ in rollbacks] == [True]


def test_a_rejected_apply_is_restored_too() -> None:
    target = Scripted([], apply_error=ConfigRejected("bad value"))
    measured, rollbacks, _ = _run(target)
    assert measured.status is TrialStatus.INFEASIBLE
    assert target.calls == ["apply 0.5", "restore"] and [b for b, _ in rollbacks] == [True]


def test_windows_with_different_metrics_give_their_means() -> None:
    target = Scripted([{"tps": 10.0, "p95_ms": 5.0}, {"tps": 14.0}])
    measured, _, _ = _run(target, 2)
    assert measured.repeats == () and measured.metrics == {"tps": 12.0, "p95_ms": 5.0}


def _study(api: MemoryAPI, default_tps: float | None) -> StudySpec:
    spec = StudySpec.from_dict(
        {"name": "c", "objectives": [{"name": "tps", "goal": "maximize"}]},
        knobs=(FloatKnob("x", default=0.0, low=0.0, high=1.0),),
    )
    api.create_study(spec)
    if default_tps is not None:
        [trial] = api.suggest_trials(spec.name, 1)
        api.complete_trial(spec.name, trial.id, {"tps": default_tps})
    return spec


def test_a_control_runs_the_default_trials_configuration_and_is_stored_with_it() -> None:
    api = MemoryAPI()
    spec = _study(api, 100.0)
    target = Scripted([{"tps": 90.0}])
    found = control(api, target, spec)
    assert found.metrics == {"tps": 90.0} and found.default is not None
    assert target.calls == ["apply 0.0", "measure", "restore"]
    [stored] = api.list_measurements(spec.name, kinds=[MeasurementKind.CONTROL])
    assert (stored.trial_id, stored.metrics) == (found.default.id, {"tps": 90.0})


def test_without_a_default_trial_a_control_runs_only_a_fallback_and_stores_nothing() -> None:
    api = MemoryAPI()
    spec = _study(api, None)
    target = Scripted([{"tps": 80.0}])
    nothing = control(api, target, spec)
    assert nothing.metrics is None and "no completed default trial" in nothing.reason
    assert target.calls == []
    found = control(api, target, spec, fallback={"x": 0.0})
    assert found.metrics == {"tps": 80.0} and found.default is None
    assert api.list_measurements(spec.name) == []


def test_a_control_that_fails_says_why_and_stores_nothing() -> None:
    api = MemoryAPI()
    spec = _study(api, 100.0)
    found = control(api, Scripted([TargetError("host lost")]), spec)
    assert found.metrics is None and found.reason == "FAILED: host lost"
    assert api.list_measurements(spec.name, kinds=[MeasurementKind.CONTROL]) == []
    assert found.default is not None  # it was found, only the run failed
