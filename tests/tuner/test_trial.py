"""Tests for tuner.trial: the status life cycle, feasibility and ranking."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tuner.errors import StateError
from tuner.study import StudySpec
from tuner.trial import (
    OBSERVED,
    StepKind,
    Trial,
    TrialStatus,
    best_so_far,
    best_trial,
    is_feasible,
    with_resolved_constraints,
)

S = TrialStatus
FINAL = (S.COMPLETED, S.INFEASIBLE, S.FAILED, S.ABANDONED, S.TIMED_OUT, S.EARLY_STOPPED)
ALLOWED = {
    (S.PENDING, S.ACTIVE),
    *((S.PENDING, final) for final in FINAL),  # a queued trial measured elsewhere
    *((S.ACTIVE, final) for final in FINAL),
}
ALL_PAIRS = [(a, b) for a in TrialStatus for b in TrialStatus]


@pytest.mark.parametrize(
    ("old", "new"), sorted(ALLOWED), ids=lambda s: s.value if isinstance(s, S) else str(s)
)
def test_allowed_transitions(old: TrialStatus, new: TrialStatus) -> None:
    assert old.can_become(new)
    old.check_transition(new, 3)  # does not raise


@pytest.mark.parametrize(
    ("old", "new"),
    [pair for pair in ALL_PAIRS if pair not in ALLOWED],
    ids=lambda s: s.value if isinstance(s, S) else str(s),
)
def test_disallowed_transitions_name_both_statuses(old: TrialStatus, new: TrialStatus) -> None:
    assert not old.can_become(new)
    with pytest.raises(StateError, match=rf"trial 7 is {old.value} and cannot become {new.value}"):
        old.check_transition(new, 7)


def test_transition_error_lists_what_is_allowed() -> None:
    with pytest.raises(
        StateError, match=r"\(allowed from ACTIVE: ABANDONED, COMPLETED, EARLY_STOPPED, FAILED,"
    ):
        S.ACTIVE.check_transition(S.PENDING, 1)
    with pytest.raises(
        StateError, match=r"\(allowed from COMPLETED: none: the trial is finished\)"
    ):
        S.COMPLETED.check_transition(S.FAILED, 1)


def test_final_and_pending_statuses() -> None:
    assert {s for s in TrialStatus if s.is_final} == set(FINAL)
    assert {s for s in TrialStatus if s.is_pending} == {S.PENDING, S.ACTIVE}
    assert set(OBSERVED) == {S.COMPLETED, S.INFEASIBLE, S.TIMED_OUT, S.EARLY_STOPPED}
    assert S("ACTIVE") is S.ACTIVE and S.ACTIVE == "ACTIVE"


def test_trial_defaults() -> None:
    trial = Trial(1, {"x": 1.0})
    assert trial.status is S.ACTIVE
    assert (trial.metrics, trial.reason, trial.source, trial.warning) == ({}, "", "", "")


# -- feasibility and ranking ------------------------------------------------------------


def _spec(goal: str = "maximize", constraints: tuple[str, ...] = ("p95 <= 20",)) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "s",
            "knobs": [{"name": "x", "kind": "float"}],
            "objectives": [{"name": "tps", "goal": goal}],
            "outcome_constraints": list(constraints),
        }
    )


def _t(
    id_: int, status: TrialStatus = S.COMPLETED, **metrics: float
) -> Trial:  # a trial with metrics
    return Trial(id_, {"x": id_ / 100}, status, dict(metrics))


@pytest.mark.parametrize(
    ("trial", "feasible"),
    [
        (_t(1, tps=10.0, p95=5.0), True),
        (_t(1, tps=10.0, p95=20.0), True),  # on the bound
        (_t(1, tps=10.0, p95=20.5), False),
        (_t(1, tps=10.0), False),  # constrained metric missing
        (_t(1, p95=5.0), False),  # objective missing
        (_t(1, tps=math.nan, p95=5.0), False),
        (_t(1, tps=math.inf, p95=5.0), False),
        (_t(1, tps=10.0, p95=math.nan), False),
        (_t(1, S.INFEASIBLE, tps=10.0, p95=5.0), False),
        (_t(1, S.TIMED_OUT, tps=10.0, p95=5.0), False),
        (_t(1, S.FAILED, tps=10.0, p95=5.0), False),
        (_t(1, S.ACTIVE, tps=10.0, p95=5.0), False),
        (_t(1, S.ABANDONED, tps=10.0, p95=5.0), False),
    ],
)
def test_is_feasible(trial: Trial, feasible: bool) -> None:
    assert is_feasible(_spec(), trial) is feasible


def test_is_feasible_with_lower_bound_and_extra_metrics() -> None:
    spec = _spec(constraints=("p95 <= 20", "hit_rate >= 0.9"))
    assert is_feasible(spec, _t(1, tps=1.0, p95=1.0, hit_rate=0.9, other=math.nan))
    assert not is_feasible(spec, _t(1, tps=1.0, p95=1.0, hit_rate=0.89))


def test_is_feasible_without_constraints_needs_only_the_objective() -> None:
    spec = _spec(constraints=())
    assert is_feasible(spec, _t(1, tps=-5.0))
    assert not is_feasible(spec, _t(1, tps=math.nan))


def test_best_trial_maximize_skips_infeasible() -> None:
    trials = [
        _t(1, tps=10.0, p95=5.0),
        _t(2, tps=50.0, p95=25.0),  # best value, breaks the constraint
        _t(3, tps=30.0, p95=19.0),
        _t(4, S.INFEASIBLE, tps=99.0, p95=1.0),
        _t(5, tps=math.nan, p95=1.0),
        _t(6, tps=20.0, p95=1.0),
    ]
    best = best_trial(_spec(), trials)
    assert best is not None and best.id == 3
    assert best_so_far(_spec(), trials) == [10.0, 10.0, 30.0, 30.0, 30.0, 30.0]


def test_best_trial_minimize() -> None:
    spec = _spec("minimize")
    trials = [_t(1, tps=10.0, p95=5.0), _t(2, tps=-3.0, p95=30.0), _t(3, tps=4.0, p95=20.0)]
    best = best_trial(spec, trials)
    assert best is not None and best.id == 3
    assert best_so_far(spec, trials) == [10.0, 10.0, 4.0]


@pytest.mark.parametrize("goal", ["maximize", "minimize"])
def test_best_trial_ties_go_to_the_earliest(goal: str) -> None:
    trials = [_t(1, tps=5.0, p95=1.0), _t(2, tps=7.0, p95=1.0), _t(3, tps=7.0, p95=1.0)]
    if goal == "minimize":
        trials = [_t(1, tps=9.0, p95=1.0), _t(2, tps=7.0, p95=1.0), _t(3, tps=7.0, p95=1.0)]
    best = best_trial(_spec(goal), trials)
    assert best is not None and best.id == 2


def test_best_trial_ties_go_to_the_earliest_whatever_the_input_order() -> None:
    trials = [_t(3, tps=7.0, p95=1.0), _t(2, tps=7.0, p95=1.0)]
    best = best_trial(_spec(), trials)
    assert best is not None and best.id == 2


@pytest.mark.parametrize(
    "trials",
    [
        [],
        [_t(1, tps=1.0, p95=50.0)],
        [_t(1, S.INFEASIBLE), _t(2, S.FAILED), _t(3, S.ACTIVE, tps=1.0, p95=1.0)],
        [_t(1, tps=math.nan, p95=1.0)],
    ],
)
def test_no_best_trial_without_a_feasible_one(trials: list[Trial]) -> None:
    assert best_trial(_spec(), trials) is None
    assert best_so_far(_spec(), trials) == [None] * len(trials)


def test_best_so_far_sorts_by_id() -> None:
    trials: list[Any] = [_t(3, tps=9.0, p95=1.0), _t(1, tps=2.0, p95=30.0), _t(2, tps=4.0, p95=1.0)]
    assert best_so_far(_spec(), trials) == [None, 4.0, 9.0]


def test_best_so_far_accepts_any_iterable() -> None:
    trials = (_t(i, tps=float(i % 3), p95=1.0) for i in range(1, 6))
    assert best_so_far(_spec(), trials) == [1.0, 2.0, 2.0, 2.0, 2.0]


def test_relative_constraints_resolve_against_the_measured_default() -> None:
    spec = StudySpec.from_dict(
        {
            "name": "envpipe",
            "knobs": [{"name": "x", "kind": "float", "default": 0.5}],
            "objectives": [{"name": "energy", "goal": "minimize"}],
            "outcome_constraints": ["tps >= 0.99 * default", "p95 <= 20"],
        }
    )
    fast = Trial(2, {"x": 0.1}, S.COMPLETED, {"energy": 50.0, "tps": 99.5, "p95": 5.0})
    slow = Trial(3, {"x": 0.2}, S.COMPLETED, {"energy": 40.0, "tps": 98.0, "p95": 5.0})
    # before the default is measured nothing can be judged against it
    assert with_resolved_constraints(spec, [fast, slow]) == spec
    assert best_trial(spec, [fast, slow]) is None
    default = Trial(
        1,
        {"x": 0.5},
        S.COMPLETED,
        {"energy": 60.0, "tps": 100.0, "p95": 5.0},
        step=StepKind.DEFAULT,
    )
    resolved = with_resolved_constraints(spec, [slow, default, fast])
    assert [str(c) for c in resolved.outcome_constraints] == ["tps >= 99", "p95 <= 20"]
    assert is_feasible(resolved, fast) and not is_feasible(resolved, slow)
    best = best_trial(spec, [default, fast, slow])  # resolves by itself
    assert best is not None and best.id == 2
    assert best_so_far(spec, [default, fast, slow]) == [60.0, 50.0, 50.0]
    # a default that failed leaves the bound unresolved
    broken = Trial(1, {"x": 0.5}, S.INFEASIBLE, {}, reason="crash", step=StepKind.DEFAULT)
    assert with_resolved_constraints(spec, [broken, fast]) == spec
