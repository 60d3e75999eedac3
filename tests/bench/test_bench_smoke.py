"""Smoke tests of the benchmarks: problem formulas, and each benchmark's core on a tiny run.

No timing is asserted here (speed is measured by ``python -m bench.latency``); the tests check
that the functions are right and that the benchmarks produce well-formed results.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from botorch.test_functions.synthetic import Branin, ConstrainedGramacy, Hartmann

from bench import synthetic
from bench.methods import METHODS, best_curve, penalized
from bench.problems import BRANIN, GRAMACY, HARTMANN6, gramacy_constraints

H6_MINIMIZER = (0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573)


def _points(problem, count: int, seed: int = 0) -> list[list[float]]:
    generator = torch.Generator().manual_seed(seed)
    u = torch.rand(count, problem.dim, generator=generator, dtype=torch.float64)
    low = torch.tensor([b[0] for b in problem.bounds], dtype=torch.float64)
    high = torch.tensor([b[1] for b in problem.bounds], dtype=torch.float64)
    return (low + (high - low) * u).tolist()


@pytest.mark.parametrize(("problem", "reference"), [(BRANIN, Branin()), (HARTMANN6, Hartmann(6))])
def test_functions_match_botorch(problem, reference) -> None:
    for x in _points(problem, 50):
        expected = reference(torch.tensor([x], dtype=torch.float64)).item()
        # BoTorch stores Hartmann's constants in float32 first: agreement to ~1e-7
        assert problem.objective(x) == pytest.approx(expected, abs=1e-6)


def test_gramacy_matches_botorch_slack() -> None:
    reference = ConstrainedGramacy()
    for x in _points(GRAMACY, 50):
        slack = reference.evaluate_slack_true(torch.tensor([x], dtype=torch.float64))[0]
        assert gramacy_constraints(x) == pytest.approx((-slack).tolist(), abs=1e-12)


def test_known_optima() -> None:
    for x in [(-math.pi, 12.275), (math.pi, 2.275), (9.42478, 2.475)]:
        assert BRANIN.objective(x) == pytest.approx(BRANIN.optimum, abs=1e-6)
    assert HARTMANN6.objective(H6_MINIMIZER) == pytest.approx(HARTMANN6.optimum, abs=1e-5)
    x = (0.19512, 0.40467)
    assert GRAMACY.objective(x) == pytest.approx(GRAMACY.optimum, abs=1e-5)
    assert max(gramacy_constraints(x)) <= 1e-5
    assert GRAMACY.is_feasible((math.sqrt(3) / 2 - 1e-9,) * 2)


def test_penalty_and_best_curve() -> None:
    infeasible, feasible = [0.0, 0.0], [0.8, 0.8]
    assert penalized(GRAMACY, infeasible) > GRAMACY.objective(infeasible)
    assert penalized(GRAMACY, feasible) == GRAMACY.objective(feasible)
    assert best_curve(GRAMACY, [infeasible, feasible, [1.0, 1.0]]) == [None, 1.6, 1.6]


def test_specs_describe_the_problems() -> None:
    spec = GRAMACY.spec(seed=3)
    assert spec.space.names == ("x1", "x2")
    assert [str(c) for c in spec.outcome_constraints] == ["c1 <= 0", "c2 <= 0"]
    assert spec.designer.seed == 3
    assert len(HARTMANN6.spec(0).space) == 6


@pytest.mark.slow
def test_synthetic_main_writes_results(tmp_path) -> None:
    args = ["--seeds", "1", "--budget", "6", "--problems", "gramacy", "--out", str(tmp_path)]
    assert synthetic.main(args) == 0
    data = json.loads((tmp_path / "synthetic.json").read_text())
    summary = data["summary"]["gramacy"]
    assert set(summary["methods"]) == set(METHODS)
    assert summary["checkpoints"] == [6]
    for method in METHODS:
        assert len(summary["methods"][method]["mean_curve"]) == 6
        assert set(summary["methods"][method]["checkpoints"]["6"]) >= {"mean", "std"}
    assert set(summary["regret_ratio"]) == {"skopt/ours", "random/ours"}
    assert len(data["runs"]) == len(METHODS)
    ours = next(r for r in data["runs"] if r["method"] == "ours")
    assert ours["notes"]["sobol"] == 5  # the 2-d Sobol design, then model-based suggestions
    assert sum(ours["notes"].get(k, 0) for k in ("global", "fill-in", "fallback")) == 1
    assert (tmp_path / "synthetic.png").stat().st_size > 0
