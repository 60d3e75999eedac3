"""The generation strategy's decision table, row by row (``tuner/designer/strategy.py``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.designer.base import History
from tuner.designer.strategy import (
    DEFAULT,
    GLOBAL,
    LOCAL,
    PRIOR,
    RANDOM,
    SOBOL,
    TREND,
    LocalStep,
    Situation,
    Step,
    next_step,
    plan,
    random_draw,
)
from tuner.encoding import UnitBoxEncoder
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, TrialStatus

# After the design (5 points), learned, one objective on a box: a plain global step.
BASE = Situation(designed=5, initial=5, learned=True)
TREND_OPEN = {"trend_probe": True, "trend_open": True}

ROWS: list[tuple[str, dict[str, object], Step]] = [
    ("the default comes first", {"default_due": True, "designed": 0}, DEFAULT),
    ("the default even before a random draw", {"default_due": True, "random_draw": True}, DEFAULT),
    ("the design is not complete", {"designed": 4}, SOBOL),
    ("nothing COMPLETED yet: keep designing", {"designed": 9, "learned": False}, SOBOL),
    ("the design wins over a random draw", {"designed": 2, "random_draw": True}, SOBOL),
    ("a random draw after the design", {"random_draw": True}, RANDOM),
    ("plain BO", {}, GLOBAL),
    ("plain BO, odd step: no trust region", {"designed": 6}, GLOBAL),
    ("expert priors: the region first", {"prior_region": True, "designed": 9}, PRIOR),
    ("expert priors: then everywhere", {"prior_region": True, "designed": 10}, GLOBAL),
    (
        "priors win over the trust region",
        {"prior_region": True, "trust_region": True, "designed": 6},
        PRIOR,
    ),
    ("trust region: odd step local", {"trust_region": True, "designed": 6}, LOCAL),
    ("trust region: even step", {"trust_region": True, "designed": 5}, GLOBAL),
    (
        "several objectives: always global",
        {"single_incumbent": False, "trust_region": True, "designed": 6},
        GLOBAL,
    ),
    ("trend probe open", {**TREND_OPEN, "trust_region": True, "designed": 6}, TREND),
    ("trend probe open, even step", {**TREND_OPEN, "trust_region": True}, TREND),
    (
        "trend probe with plateaus: odd step local on the trend's mean",
        {**TREND_OPEN, "trust_region": True, "plateau": True, "designed": 6},
        LocalStep(trend_mean=True),
    ),
    ("trend probe with plateaus: even step", {**TREND_OPEN, "plateau": True}, TREND),
    (
        "trend probe closed: back to the trust region",
        {"trend_probe": True, "trend_open": False, "trust_region": True, "designed": 6},
        LOCAL,
    ),
    ("trend probe closed, even step", {"trend_probe": True, "trust_region": True}, GLOBAL),
    ("a random draw wins over the trend", {**TREND_OPEN, "random_draw": True}, RANDOM),
]


@pytest.mark.parametrize(("why", "fields", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_decision_table(why: str, fields: dict[str, object], expected: Step) -> None:
    assert next_step(replace(BASE, **fields)) == expected, why  # type: ignore[arg-type]


def _spec(**designer: object) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "s",
            "knobs": [{"name": "x", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5}],
            "objectives": [{"name": "y", "goal": "minimize"}],
            "designer": {"initial_trials": 3, **designer},
        }
    )


def test_a_plan_takes_the_default_once_and_grows_the_design() -> None:
    spec = _spec()
    history = History.build(UnitBoxEncoder(spec.space), [], [])
    first = Situation(default_due=True, initial=3)
    assert plan(spec, history, first, 5) == [DEFAULT, SOBOL, SOBOL, SOBOL, SOBOL]
    done = [
        Trial(i, {"x": i / 10}, TrialStatus.COMPLETED, {"y": 1.0}, step=StepKind.SOBOL)
        for i in range(1, 4)
    ]
    history = History.build(UnitBoxEncoder(spec.space), done, [])
    learned = Situation(designed=3, initial=3, learned=True, trust_region=True)
    assert plan(spec, history, learned, 3) == [GLOBAL, LOCAL, GLOBAL]


def test_random_draws_are_a_function_of_the_seed_history_size_and_slot() -> None:
    spec = _spec(random_fraction=0.5, seed=7)
    history = History.build(UnitBoxEncoder(spec.space), [], [])
    draws = [random_draw(spec, history, slot) for slot in range(40)]
    assert draws == [random_draw(spec, history, slot) for slot in range(40)]
    assert 10 <= sum(draws) <= 30  # about half
    assert not any(random_draw(_spec(), history, slot) for slot in range(40))
    assert all(random_draw(_spec(random_fraction=1.0), history, slot) for slot in range(40))


def test_constants_live_on_their_steps() -> None:
    assert (LOCAL.length, LOCAL.halvings, LOCAL.patience) == (0.8, 5, 3)
    assert (TREND.narrow, TREND.probe, TREND.keep) == (2.0, 6, 0.4)
    assert PRIOR.phase == 2 and GLOBAL.candidate_margin == 0.5
    assert {s.kind for s in (DEFAULT, SOBOL, RANDOM, PRIOR, GLOBAL, LOCAL, TREND)} == {
        k for k in StepKind if k not in (StepKind.FILL_IN, StepKind.FALLBACK, StepKind.IMPORT)
    }
