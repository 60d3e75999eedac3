"""The generation strategy's decision table, row by row (``tuner/designer/strategy.py``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.designer.base import History
from tuner.designer.strategy import (
    DEFAULT,
    EXPLORE,
    FOREST,
    GLOBAL,
    LOCAL,
    PORTFOLIO,
    PRIOR,
    RANDOM,
    SOBOL,
    TRANSFER,
    TREND,
    LocalStep,
    Situation,
    Step,
    next_step,
    plan,
    portfolio_pick,
    random_draw,
    read_situation,
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
    ("the portfolio picks the forest", {"portfolio_pick": FOREST}, FOREST),
    ("the portfolio explores after stagnation", {"portfolio_pick": EXPLORE}, EXPLORE),
    (
        "the portfolio wins over the trust region and the trend",
        {**TREND_OPEN, "trust_region": True, "designed": 6, "portfolio_pick": FOREST},
        FOREST,
    ),
    ("the portfolio waits for the design", {"designed": 4, "portfolio_pick": FOREST}, SOBOL),
    (
        "a random draw wins over the portfolio",
        {"random_draw": True, "portfolio_pick": EXPLORE},
        RANDOM,
    ),
    ("priors win over the portfolio", {"prior_region": True, "portfolio_pick": FOREST}, PRIOR),
    (
        "several objectives: no portfolio",
        {"single_incumbent": False, "portfolio_pick": FOREST},
        GLOBAL,
    ),
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
    assert PORTFOLIO.improvement == LOCAL.improvement
    steps = (DEFAULT, TRANSFER, SOBOL, RANDOM, PRIOR, GLOBAL, LOCAL, TREND, FOREST, EXPLORE)
    assert {s.kind for s in steps} == {
        k for k in StepKind if k not in (StepKind.FILL_IN, StepKind.FALLBACK, StepKind.IMPORT)
    }


def test_transfer_seeds_take_the_design_slots_after_the_default() -> None:
    first = Situation(default_due=True, designed=0, initial=4, seeds=2)
    steps = plan(_spec(), History((), ()), first, 6)
    assert steps == [DEFAULT, TRANSFER, TRANSFER, SOBOL, SOBOL, SOBOL]
    # seeds only fill the initial design: past it, the model steps as without sources
    late = Situation(designed=4, initial=4, seeds=1, learned=True)
    assert next_step(late) == GLOBAL


# -- the portfolio's choice, from the study's own trials ------------------------------------


def _done(
    i: int, y: float | None, step: StepKind, status: TrialStatus = TrialStatus.COMPLETED
) -> Trial:
    metrics = {} if y is None else {"y": y}
    return Trial(i, {"x": i / 100}, status, metrics, step=step)


def _design(n: int = 3) -> list[Trial]:
    return [_done(i, 10.0 - i, StepKind.SOBOL) for i in range(1, n + 1)]  # minimize: 9, 8, 7


def test_the_forest_competes_only_after_the_search_stalled_then_by_its_gains() -> None:
    spec = _spec(portfolio=True)
    trials = [*_design(), _done(4, 6.0, StepKind.GLOBAL)]  # a new best: score 1
    assert portfolio_pick(spec, trials, 3) is None  # the GP leads until it stalls
    trials.append(_done(5, 8.5, StepKind.EXPLORE))  # the search stalled once
    assert portfolio_pick(spec, trials, 3) == FOREST  # the forest untried: UCB1 tries it
    trials.append(_done(6, 9.5, StepKind.FOREST))  # beat none of 5: score 0
    # UCB1 with N = 2: GP 1 + sqrt(2 ln 2) against forest 0 + sqrt(2 ln 2): the GP
    assert portfolio_pick(spec, trials, 3) is None
    trials += [_done(7, 5.0, StepKind.FOREST), _done(8, 4.0, StepKind.FOREST)]
    trials += [_done(9, 9.9, StepKind.GLOBAL), _done(10, 9.8, StepKind.LOCAL)]
    # forest 0, 1, 1 (mean 2/3), GP 1, 0, 1/9 (mean 0.37), both tried 3 times
    assert portfolio_pick(spec, trials, 3) == FOREST


def test_stagnation_is_answered_by_one_explore_step_and_then_counted_again() -> None:
    spec = _spec(portfolio=True)
    trials = _design()  # best 7
    trials += [_done(4 + k, 8.0, StepKind.GLOBAL if k % 2 else StepKind.FOREST) for k in range(3)]
    assert portfolio_pick(spec, trials, 3) == EXPLORE  # 3 model steps without a new best
    assert portfolio_pick(spec, trials, 4) != EXPLORE  # a longer design waits longer
    pending = replace(_done(7, None, StepKind.EXPLORE), status=TrialStatus.ACTIVE)
    assert portfolio_pick(spec, [*trials, pending], 3) != EXPLORE  # one at a time
    explored = [*trials, _done(7, 8.5, StepKind.EXPLORE)]
    assert portfolio_pick(spec, explored, 3) != EXPLORE
    explored += [_done(8 + k, 8.0, StepKind.GLOBAL) for k in range(3)]
    assert portfolio_pick(spec, explored, 3) == EXPLORE  # stalled again
    improved = [*trials[:-1], _done(6, 6.9, StepKind.FOREST)]  # a new best resets the count
    assert portfolio_pick(spec, improved, 3) != EXPLORE


def test_broken_trials_score_zero_and_nothing_feasible_leaves_it_to_the_gp() -> None:
    spec = _spec(portfolio=True)
    broken = [_done(i, None, StepKind.SOBOL, TrialStatus.INFEASIBLE) for i in range(1, 4)]
    assert portfolio_pick(spec, broken, 3) is None  # no feasible value: qLogPoF's search
    trials = [*_design(), _done(4, 1.0, StepKind.GLOBAL), _done(5, 9.0, StepKind.EXPLORE)]
    trials.append(_done(6, None, StepKind.FOREST, TrialStatus.INFEASIBLE))  # score 0
    trials += [_done(7, 0.5, StepKind.GLOBAL), _done(8, 0.4, StepKind.GLOBAL)]
    assert portfolio_pick(spec, trials, 10) is None  # GP 1, 1, 1 against forest 0


def test_the_situation_carries_the_pick_only_with_the_setting_on_one_objective_on_a_box() -> None:
    trials = [*_design(), _done(4, 6.0, StepKind.GLOBAL), _done(5, 8.5, StepKind.EXPLORE)]
    for portfolio, expected in ((True, FOREST), (False, None)):
        spec = _spec(portfolio=portfolio)
        history = History.build(UnitBoxEncoder(spec.space), trials, [])
        assert read_situation(spec, history).portfolio_pick == expected
