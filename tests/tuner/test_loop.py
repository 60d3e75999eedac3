"""The one trial loop (``tuner.loop``): what it stores is what the service stores."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.designer import FitCache
from tuner.loop import new_trial, propose, run_trials
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, TrialStatus


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


def test_relative_constraints_resolve_against_the_measured_default() -> None:
    """``p95 <= 0.9 * default``: the default measured p95 = 20, so the model must see the
    bound 18 (propose resolves it, as the service does)."""
    spec = _spec()
    default = new_trial(1, propose(spec, [], 1)[0])
    assert default.step is StepKind.DEFAULT
    done = Trial(1, default.config, TrialStatus.COMPLETED, {"tps": 130.0, "p95": 20.0},
                 step=StepKind.DEFAULT)  # fmt: skip
    from tuner.trial import with_resolved_constraints

    resolved = with_resolved_constraints(spec, [done])
    assert [str(c) for c in resolved.outcome_constraints] == ["p95 <= 18"]


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
    import tuner.loop as loop

    original = loop.propose

    def counted(spec: StudySpec, trials: Any, count: int, cache: Any = None) -> Any:
        asked.append(len(calls))  # measurements done when the designer is asked
        assert all(t.status.is_final for t in trials)
        return original(spec, trials, count, cache)

    loop.propose = counted  # type: ignore[assignment]
    try:
        trials = run_trials(spec, measure, 6, batch=3, cache=FitCache())
    finally:
        loop.propose = original  # type: ignore[assignment]
    assert asked == [0, 3]
    assert len(trials) == 6 and len({tuple(sorted(t.config.items())) for t in trials}) == 6
    assert [t.id for t in trials] == list(range(1, 7))


def test_failed_and_infeasible_trials_keep_their_reasons() -> None:
    knobs = [
        {"name": "a", "kind": "int", "low": 0, "high": 20, "default": 20},
        {"name": "mode", "kind": "categorical", "choices": ["x", "y"], "default": "x"},
    ]
    spec = _spec(knobs=knobs, outcome_constraints=["p95 <= 25"])
    trials = run_trials(spec, _measure, 4)
    assert (trials[0].status, trials[0].reason) == (TrialStatus.FAILED, "host lost")
    again = run_trials(spec, _measure, 6, trials=trials)
    assert again[:4] == trials  # resumed, not restarted
    assert all(t.config != trials[0].config for t in again[1:])  # never suggested again


def test_a_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch"):
        run_trials(_spec(), _measure, 3, batch=0)
