"""Several objectives: Pareto front, reference point, hypervolume, and the qLogNEHVI designer.

The designer runs for real (BoTorch fits, qLogNEHVI) on Branin-Currin (Daulton et al. 2020),
the two-objective test problem of BoTorch's tutorials, on the unit square.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tuner.designer import make_designer
from tuner.designer.base import Suggestion
from tuner.designer.models.model import FitCache
from tuner.designer.steps.embedded import EmbeddedDesigner, grown_level
from tuner.study import StudySpec
from tuner.trial import (
    StepKind,
    Trial,
    TrialStatus,
    dominates,
    hypervolume,
    is_feasible,
    pareto_front,
    reference_point,
)

S = TrialStatus


def spec_of(
    objectives: list[dict[str, Any]],
    constraints: tuple[str, ...] = (),
    algorithm: str = "bo",
    knobs: int = 2,
    **extra: Any,
) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "mo",
            "knobs": [
                {"name": f"x{i}", "kind": "float", "low": 0, "high": 1} for i in range(knobs)
            ],
            "objectives": objectives,
            "outcome_constraints": list(constraints),
            "designer": {"algorithm": algorithm, "seed": 3, "start_with_default": False},
            **extra,
        }
    )


MIN_MIN = [{"name": "f1", "goal": "minimize"}, {"name": "f2", "goal": "minimize"}]


def trial(id_: int, status: TrialStatus = S.COMPLETED, **metrics: float) -> Trial:
    return Trial(id_, {"x0": 0.5, "x1": 0.5}, status, dict(metrics))


def test_dominance_respects_each_goal() -> None:
    spec = spec_of([{"name": "tps", "goal": "maximize"}, {"name": "p99", "goal": "minimize"}])
    assert dominates(spec, {"tps": 10, "p99": 5}, {"tps": 9, "p99": 5})
    assert dominates(spec, {"tps": 10, "p99": 4}, {"tps": 9, "p99": 5})
    assert not dominates(spec, {"tps": 10, "p99": 6}, {"tps": 9, "p99": 5})  # a trade-off
    assert not dominates(spec, {"tps": 10, "p99": 5}, {"tps": 10, "p99": 5})  # equal


def test_pareto_front_keeps_feasible_non_dominated_trials_in_id_order() -> None:
    spec = spec_of(MIN_MIN, constraints=("mem <= 100",))
    trials = [
        trial(1, f1=3.0, f2=1.0, mem=10),
        trial(2, f1=1.0, f2=3.0, mem=10),
        trial(3, f1=2.0, f2=2.0, mem=10),
        trial(4, f1=2.5, f2=2.5, mem=10),  # dominated by 3
        trial(5, f1=0.5, f2=0.5, mem=500),  # would dominate all, breaks the constraint
        trial(6, S.INFEASIBLE, f1=0.1, f2=0.1, mem=1),
        trial(7, f1=2.0, f2=2.0, mem=20),  # equal to 3: only the earliest is kept
    ]
    assert [t.id for t in pareto_front(spec, trials)] == [1, 2, 3]
    assert not is_feasible(spec, trials[4])
    assert pareto_front(spec, trials[4:6]) == []


def test_one_objective_front_is_the_best_trial() -> None:
    spec = spec_of([{"name": "f1", "goal": "maximize"}])
    trials = [trial(1, f1=1.0), trial(2, f1=3.0), trial(3, f1=3.0)]
    assert [t.id for t in pareto_front(spec, trials)] == [2]


def test_reference_point_uses_the_given_values_and_infers_the_rest() -> None:
    trials = [trial(1, f1=1.0, f2=30.0), trial(2, f1=3.0, f2=10.0), trial(3, f1=5.0, f2=50.0)]
    # front {1, 2}: f1 in [1, 3] (minimize: 3 + 0.1 * 2), f2 in [10, 30] (maximize: 10 - 2)
    spec = spec_of([{"name": "f1", "goal": "minimize"}, {"name": "f2", "goal": "maximize"}])
    assert [t.id for t in pareto_front(spec, trials)] == [1, 3]
    assert reference_point(spec, trials) == pytest.approx([5.0 + 0.4, 30.0 - 2.0])
    given = spec_of(
        [{"name": "f1", "goal": "minimize", "reference": 9}, {"name": "f2", "goal": "maximize"}]
    )
    assert reference_point(given, trials) == pytest.approx([9.0, 28.0])
    assert reference_point(spec, []) is None
    # a single front point: 10 % of its own magnitude
    assert reference_point(spec, trials[:1]) == pytest.approx([1.1, 27.0])


def test_hypervolume_of_a_staircase() -> None:
    spec = spec_of(MIN_MIN)
    trials = [trial(1, f1=1.0, f2=3.0), trial(2, f1=2.0, f2=2.0), trial(3, f1=3.0, f2=1.0)]
    assert hypervolume(spec, trials, [4.0, 4.0]) == pytest.approx(3.0 + 2.0 + 1.0)
    assert hypervolume(spec, trials, [1.5, 4.0]) == pytest.approx(0.5)  # only trial 1 counts
    assert hypervolume(spec, trials, [0.5, 0.5]) == 0.0
    assert hypervolume(spec, [], [4.0, 4.0]) == 0.0


def branin_currin(config: dict[str, Any]) -> dict[str, float]:
    x0, x1 = config["x0"], config["x1"]
    a, b = 15 * x0 - 5, 15 * x1
    branin = (b - 5.1 / (4 * math.pi**2) * a**2 + 5 / math.pi * a - 6) ** 2
    branin += 10 * (1 - 1 / (8 * math.pi)) * math.cos(a) + 10
    currin = (1 - math.exp(-1 / (2 * x1 + 1e-9))) * (
        (2300 * x0**3 + 1900 * x0**2 + 2092 * x0 + 60) / (100 * x0**3 + 500 * x0**2 + 4 * x0 + 20)
    )
    return {"f1": branin, "f2": currin, "x_sum": x0 + x1}


REFERENCE = [18.0, 6.0]  # BoTorch's reference point for Branin-Currin (max hypervolume 59.36)


def drive(spec: StudySpec, n: int) -> list[Trial]:
    designer = make_designer(spec, FitCache())
    trials: list[Trial] = []
    for i in range(n):
        s = designer.suggest(1, trials, [])[0]
        trials.append(
            Trial(
                i + 1,
                s.config,
                S.COMPLETED,
                branin_currin(s.config),
                source=s.step.value,
                step=s.step,
            )
        )
    return trials


@pytest.fixture(scope="module")
def bo_run() -> list[Trial]:
    return drive(spec_of(MIN_MIN), 18)


def test_hypervolume_bo_beats_its_space_filling_design(bo_run: list[Trial]) -> None:
    spec = spec_of(MIN_MIN)
    sobol = drive(spec_of(MIN_MIN, algorithm="sobol"), 18)
    bo = hypervolume(spec, bo_run, REFERENCE)
    assert all(t.step.model_based for t in bo_run[6:])
    assert bo > hypervolume(spec, sobol, REFERENCE) + 5.0
    assert bo > hypervolume(spec, bo_run[:10], REFERENCE)  # the model-based trials added to it
    assert len(pareto_front(spec, bo_run)) >= 4  # a front, not one point


def test_outcome_constraints_hold_the_search_with_several_objectives() -> None:
    spec = spec_of(MIN_MIN, constraints=("x_sum <= 0.8",))
    trials = drive(spec, 16)
    model_based = [t for t in trials if t.step.model_based]
    assert model_based
    feasible = sum(is_feasible(spec, t) for t in model_based)
    assert feasible >= 0.7 * len(model_based), [t.metrics["x_sum"] for t in model_based]
    assert all(t.metrics["x_sum"] <= 0.8 for t in pareto_front(spec, trials))


def test_pending_points_make_parallel_multi_objective_suggestions_differ(
    bo_run: list[Trial],
) -> None:
    designer = make_designer(spec_of(MIN_MIN), FitCache())
    batch = designer.suggest(3, bo_run, [])
    assert len({tuple(s.config.values()) for s in batch}) == 3
    assert all(s.step.model_based for s in batch)


def test_given_reference_points_reach_the_acquisition() -> None:
    # a reference point no trial can beat in f2 makes every hypervolume improvement zero,
    # which the designer must survive (it falls back to a valid suggestion)
    objectives = [
        {"name": "f1", "goal": "minimize", "reference": 18.0},
        {"name": "f2", "goal": "minimize", "reference": -1.0},
    ]
    spec = spec_of(objectives)
    trials = drive(spec, 8)
    assert len(trials) == 8 and len({tuple(t.config.values()) for t in trials}) == 8


def test_embedded_designer_searches_several_objectives() -> None:
    spec = spec_of(MIN_MIN, knobs=6, embedding={"kind": "llamatune", "dims": 2, "grow_after": 3})
    designer = make_designer(spec, FitCache())
    assert isinstance(designer, EmbeddedDesigner)
    trials: list[Trial] = []
    for i in range(10):
        s: Suggestion = designer.suggest(1, trials, [])[0]
        metrics = branin_currin(s.config)
        t = Trial(
            i + 1,
            s.config,
            S.COMPLETED,
            metrics,
            source=s.step.value,
            step=s.step,
            embedded=s.embedded,
        )
        trials.append(t)
    assert all(t.step.model_based or t.step is StepKind.FILL_IN for t in trials[7:])
    assert all(len(t.embedded) in (2, 4) for t in trials)
    assert pareto_front(spec, trials)


def test_growth_counts_trials_that_join_no_front() -> None:
    spec = spec_of(MIN_MIN, knobs=6, embedding={"kind": "llamatune", "dims": 2, "grow_after": 3})
    skip = spec.designer.initial_size(2) + 1
    design = [trial(i + 1, f1=10.0 + i, f2=10.0 - i) for i in range(skip)]  # a front of 6
    worse = [trial(skip + 1 + i, f1=20.0, f2=20.0) for i in range(3)]
    assert grown_level(spec, design, top=2) == 0
    assert grown_level(spec, design + worse[:2], top=2) == 0
    assert grown_level(spec, design + worse, top=2) == 1
    # a trade-off that no earlier trial dominates is progress, and resets the count
    joins = trial(skip + 3, f1=0.5, f2=30.0)
    assert grown_level(spec, design + worse[:2] + [joins], top=2) == 0


def test_objectives_of_a_pareto_study_are_modelled_in_metric_units() -> None:
    # f1 spans four orders of magnitude: one objective alone would be modelled in log space,
    # but a hypervolume in log units would chase values near zero without bound
    from tuner.designer.models.model import outcome_data
    from tuner.encoding import UnitBoxEncoder

    spec = spec_of(MIN_MIN, constraints=("x_sum <= 5",))
    trials = [
        Trial(i + 1, {"x0": i / 10, "x1": 0.5}, S.COMPLETED,
              {"f1": 10.0 ** (i - 3), "f2": 1.0 + i, "x_sum": 10.0 ** (i - 2)})
        for i in range(6)
    ]  # fmt: skip
    data = {d.name: d for d in outcome_data(spec, UnitBoxEncoder(spec.space), tuple(trials))}
    assert not data["f1"].log and not data["f2"].log
    assert data["x_sum"].log  # a constrained metric keeps its log scale
    single = spec_of([{"name": "f1", "goal": "minimize"}])
    alone = outcome_data(single, UnitBoxEncoder(single.space), tuple(trials))
    assert alone[0].log
