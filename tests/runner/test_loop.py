"""The one trial loop (``runner.loop``): what it stores is what the service stores; batches,
resumed studies, other callers' trials, a broken target."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runner.loop import MAX_CONSECUTIVE_FAILURES, run_loop, run_trials
from runner.measurement import Measured
from runner.memory import MemoryAPI
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.errors import TargetError
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import Measurement, StepKind, Trial, TrialStatus


@dataclass(frozen=True)
class Result:
    metrics: dict[str, float] = field(default_factory=dict)
    status: TrialStatus = TrialStatus.COMPLETED
    reason: str = ""


def _spec(**extra: Any) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "loop",
            "knobs": [
                {"name": "a", "kind": "int", "low": 0, "high": 20, "default": 10},
                {"name": "mode", "kind": "categorical", "choices": ["x", "y"], "default": "x"},
            ],
            "objectives": [{"name": "tps", "goal": "maximize"}],
            "outcome_constraints": ["p95 <= 0.9 * default"],
            "designer": {"initial_trials": 3, "seed": 5},
            **extra,
        }
    )


def _measure(config: Mapping[str, Any]) -> Result:
    a = float(config["a"])
    if a == 0:
        return Result(status=TrialStatus.INFEASIBLE, reason="would not start")
    if a == 20:
        return Result(status=TrialStatus.FAILED, reason="host lost")
    bonus = 5.0 if config["mode"] == "y" else 0.0
    return Result({"tps": 100 + 3 * a + bonus, "p95": 30 - a})


def test_the_loop_stores_what_the_service_stores(tmp_path: Path) -> None:
    """The same study through the service (SQLite, as a client drives it) and through
    ``run_trials``: the same configurations, step kinds, statuses, metrics and warnings."""
    spec = _spec()
    looped = run_trials(spec, _measure, 9)
    service = TuningService(SQLiteStorage(tmp_path / "t.db"))
    service.create_study(spec)
    for _ in range(9):
        (trial,) = service.suggest_trials("loop", 1, client_id="w")
        result = _measure(trial.config)
        service.complete_trial("loop", trial.id, result.metrics, result.status, result.reason)
    stored = service.list_trials("loop")

    def view(trials: list[Trial]) -> list[tuple[Any, ...]]:
        return [
            (t.id, t.config, t.step, t.source, t.status, t.metrics, t.reason, t.embedded)
            for t in trials
        ]

    assert view(looped) == view(stored)
    assert looped[0].step is StepKind.DEFAULT
    assert [t.step for t in looped[1:4]] == [StepKind.SOBOL] * 3
    assert all(t.step.model_based or t.step is StepKind.FILL_IN for t in looped[4:])


def test_a_batch_is_pending_while_it_is_measured() -> None:
    """With ``batch = 3`` the three suggestions of a call differ, and the next call comes
    only after all three are measured."""
    designer = {"initial_trials": 3, "seed": 5, "start_with_default": False}
    spec = _spec(designer=designer, outcome_constraints=["p95 <= 25"])
    calls: list[int] = []

    def measure(config: Config) -> Result:
        calls.append(len(calls))
        return _measure(config)

    asked: list[int] = []
    import runner.memory as memory

    original = memory.propose

    def counted(spec: StudySpec, trials: Any, count: int, cache: Any = None, **more: Any) -> Any:
        asked.append(len(calls))  # measurements done when the designer is asked
        assert all(t.status.is_final for t in trials)
        return original(spec, trials, count, cache, **more)

    memory.propose = counted  # type: ignore[assignment]
    try:
        trials = run_trials(spec, measure, 6, batch=3)
    finally:
        memory.propose = original  # type: ignore[assignment]
    assert asked == [0, 3]
    assert len(trials) == 6 and len({tuple(sorted(t.config.items())) for t in trials}) == 6
    assert [t.id for t in trials] == list(range(1, 7))


def test_failed_and_infeasible_trials_keep_their_reasons() -> None:
    knobs = [
        {"name": "a", "kind": "int", "low": 0, "high": 20, "default": 20},
        {"name": "mode", "kind": "categorical", "choices": ["x", "y"], "default": "x"},
    ]
    spec = _spec(knobs=knobs, outcome_constraints=["p95 <= 25"])
    api = MemoryAPI()
    trials = run_trials(spec, _measure, 4, api=api)
    assert (trials[0].status, trials[0].reason) == (TrialStatus.FAILED, "host lost")
    again = run_trials(spec, _measure, 6, api=api)
    assert again[:4] == trials  # resumed, not restarted
    assert all(t.config != trials[0].config for t in again[1:])  # never suggested again


def test_a_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch"):
        run_trials(_spec(), _measure, 3, batch=0)


def _once(trial: Trial) -> Measured:
    result = _measure(trial.config)
    return Measured(result.status, reason=result.reason, metrics=result.metrics)


def test_trials_another_caller_is_measuring_count_toward_the_budget() -> None:
    """Two trials ACTIVE for another worker: a loop for 5 trials runs 3 of its own."""
    api, spec = MemoryAPI(), _spec()
    api.create_study(spec)
    theirs = api.suggest_trials(spec.name, 2, "other")
    run_loop(api, spec, 5, _once, client_id="me")
    trials = api.list_trials(spec.name)
    assert len(trials) == 5
    assert [t.status for t in trials if t.id in {x.id for x in theirs}] == [TrialStatus.ACTIVE] * 2
    assert sum(t.client_id == "me" and t.status.is_final for t in trials) == 3


@pytest.mark.parametrize("restarted", ["daemon", "session"])
def test_a_trial_left_active_by_the_caller_before_a_restart_is_finished_first(
    restarted: str,
) -> None:
    """A daemon restarted on the same host keeps its client id and finds its trial ACTIVE;
    a session (a new process, a new client id) is handed its dead predecessor's trial as
    ``leftover``. Either way that trial is measured first, not counted as another's."""
    api, spec = MemoryAPI(), _spec()
    api.create_study(spec)
    before = "daemon:host:loop" if restarted == "daemon" else "session:host:1:loop"
    [left] = api.suggest_trials(spec.name, 1, before)
    seen: list[int] = []

    def measure(trial: Trial) -> Measured:
        seen.append(trial.id)
        return _once(trial)

    now = before if restarted == "daemon" else "session:host:2:loop"
    leftover = [left] if restarted == "session" else []
    run_loop(api, spec, 3, measure, client_id=now, leftover=leftover)
    assert seen == [left.id, 2, 3]
    assert all(t.status.is_final for t in api.list_trials(spec.name))


def test_repeats_complete_the_trial_with_their_means() -> None:
    api, spec = MemoryAPI(), _spec(designer={"initial_trials": 3, "seed": 5})
    repeats = (Measurement({"tps": 100.0, "p95": 10.0}), Measurement({"tps": 110.0, "p95": 12.0}))
    run_loop(api, spec, 1, lambda trial: Measured(TrialStatus.COMPLETED, repeats))
    [trial] = api.list_trials(spec.name)
    assert trial.metrics == {"tps": 105.0, "p95": 11.0} and trial.repeats == 2
    assert len(api.list_measurements(spec.name)) == 2


def test_five_failures_in_a_row_stop_the_loop_and_stop_ends_it_early() -> None:
    api, spec = MemoryAPI(), _spec()
    failed = Measured(TrialStatus.FAILED, reason="disk full")
    with pytest.raises(TargetError, match="5 trials in a row failed; last reason: disk full"):
        run_loop(api, spec, 20, lambda trial: failed)
    assert len(api.list_trials(spec.name)) == MAX_CONSECUTIVE_FAILURES
    api2 = MemoryAPI()
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 2

    run_loop(api2, spec, 20, _once, stop=stop)
    assert len(api2.list_trials(spec.name)) == 2
