"""The portfolio's generators (``designer.portfolio``): the forest's expected improvement
(``tuner/designer/models/forest.py``) and the EXPLORE step, each through the designer.

The choice among them is tested row by row in ``test_strategy.py``; here the steps run on
real fits: a forest follows a threshold a GP smooths over, EXPLORE goes where nothing was
tried, and a study with the setting runs every generator and stores which one made a trial.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from runner.loop import run_trials
from tuner.designer import History, make_designer
from tuner.designer.models import forest
from tuner.encoding import UnitBoxEncoder
from tuner.errors import ValidationError
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, TrialStatus


@dataclass
class Outcome:
    status: TrialStatus
    metrics: dict[str, float]
    reason: str = ""


def _spec(d: int = 4, goal: str = "maximize", **designer: object) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "portfolio",
            "knobs": [
                {"name": f"x{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(d)
            ],
            "objectives": [{"name": "y", "goal": goal}],
            "designer": {"seed": 3, "portfolio": True, **designer},
        }
    )


def _threshold(config: dict) -> float:
    """A step at x0 = 0.6 worth 10, and a small smooth term in the others."""
    return 10.0 * (config["x0"] > 0.6) - sum((config[f"x{i}"] - 0.5) ** 2 for i in range(1, 4))


def _trials(spec: StudySpec, points: list[list[float]], value=_threshold) -> list[Trial]:
    encoder = UnitBoxEncoder(spec.space)
    out = []
    for i, point in enumerate(points, start=1):
        config = encoder.decode(point)
        out.append(
            Trial(i, config, TrialStatus.COMPLETED, {"y": value(config)}, step=StepKind.SOBOL)
        )
    return out


def test_the_forest_proposes_past_the_threshold_it_learned() -> None:
    spec = _spec()
    rng = np.random.default_rng(0)
    points = rng.uniform(0.0, 0.55, size=(12, 4)).tolist()  # nothing past x0 = 0.6 ...
    points += [[0.8, 0.5, 0.5, 0.5], [0.9, 0.1, 0.9, 0.2]]  # ... but two points
    trials = _trials(spec, points)
    rows = forest.propose(spec, UnitBoxEncoder(spec.space), trials, 3, seed=1)
    assert 3 <= len(rows) <= 12 and len({tuple(r) for r in rows}) == len(rows)
    assert all(r[0] > 0.55 for r in rows[:3])  # the forest's leaves keep the step
    assert rows == forest.propose(spec, UnitBoxEncoder(spec.space), trials, 3, seed=1)


def test_the_forest_counts_broken_and_constraint_breaking_trials_as_the_worst() -> None:
    spec = StudySpec.from_dict(
        {
            "name": "c",
            "knobs": [{"name": "x0", "kind": "float", "low": 0.0, "high": 1.0}],
            "objectives": [{"name": "y", "goal": "minimize"}],
            "outcome_constraints": ["p <= 1"],
        }
    )
    trials = [
        Trial(1, {"x0": 0.1}, TrialStatus.COMPLETED, {"y": 5.0, "p": 0.5}),
        Trial(2, {"x0": 0.5}, TrialStatus.COMPLETED, {"y": 1.0, "p": 2.0}),  # breaks p <= 1
        Trial(3, {"x0": 0.9}, TrialStatus.INFEASIBLE, {}),
        Trial(4, {"x0": 0.3}, TrialStatus.COMPLETED, {"y": 3.0, "p": 0.9}),
    ]
    data = forest.training_set(spec, UnitBoxEncoder(spec.space), trials)
    assert data is not None
    X, y, best = data
    assert y.tolist() == [5.0, 5.0, 5.0, 3.0] and best == 3.0 and X.shape == (4, 1)
    assert forest.training_set(spec, UnitBoxEncoder(spec.space), trials[1:3]) is None


def test_expected_improvement_prefers_a_lower_mean_and_then_more_spread() -> None:
    ei = forest.expected_improvement(
        np.array([1.0, 0.0, 0.0, 2.0]), np.array([0.1, 0.1, 0.5, 0.0]), best=0.5
    )
    assert ei[1] > ei[0] and ei[2] > ei[1] and ei[3] == 0.0


def test_explore_takes_the_point_farthest_from_every_configuration_tried() -> None:
    spec = _spec(d=2)
    corner = [[0.05, 0.05], [0.1, 0.0], [0.0, 0.1], [0.08, 0.12], [0.12, 0.08]]
    trials = _trials(spec, corner, value=lambda c: c["x0"])
    designer = make_designer(spec)
    history = History.build(designer.encoder, trials, [])
    made = designer.space_filling(history, [], 2, StepKind.EXPLORE)
    assert [s.step for s in made] == [StepKind.EXPLORE] * 2
    first, second = (designer.encoder.encode(s.config) for s in made)
    assert min(first) > 0.8  # the far corner
    assert np.hypot(first[0] - second[0], first[1] - second[1]) > 0.4  # then away from both


def test_a_study_with_the_portfolio_runs_every_generator_and_stores_it() -> None:
    spec = _spec()
    trials = run_trials(spec, lambda c: Outcome(TrialStatus.COMPLETED, {"y": _threshold(c)}), 30)
    kinds = [t.step for t in trials]
    assert {StepKind.GLOBAL, StepKind.EXPLORE, StepKind.FOREST} <= set(kinds)
    assert kinds.index(StepKind.EXPLORE) < kinds.index(StepKind.FOREST)  # after a stall
    assert set(kinds) <= {
        StepKind.SOBOL, StepKind.GLOBAL, StepKind.FOREST, StepKind.EXPLORE, StepKind.FILL_IN,
    }  # fmt: skip
    assert len({tuple(sorted(t.config.items())) for t in trials}) == len(trials)
    again = run_trials(spec, lambda c: Outcome(TrialStatus.COMPLETED, {"y": _threshold(c)}), 30)
    assert [t.config for t in again] == [t.config for t in trials]  # the same choices


def test_the_setting_is_a_flag_and_stays_out_of_older_fingerprints() -> None:
    with pytest.raises(ValidationError, match=r"designer\.portfolio"):
        _spec(portfolio="yes")
    assert "portfolio" not in _spec(portfolio=False).to_dict()["designer"]
    on = _spec()
    assert StudySpec.from_dict(on.to_dict()) == on
