"""bench.pareto, runner.sweep and bench.replay: the problems are the published ones, the
sweep writes a table the replay target reads, and the replay benchmark judges on means."""

from __future__ import annotations

import csv
import json
import math
import random
import sys
from pathlib import Path

import pytest

from bench import pareto, replay
from runner import sweep
from targets.replay import ReplayTarget
from tuner.constraints import OutcomeConstraint

ROOT = Path(__file__).resolve().parents[2]


def test_pareto_problems_match_their_definitions() -> None:
    # Branin-Currin at BoTorch's documented points; DTLZ2 on its front when g = 0
    f1, f2 = pareto.branin_currin([0.0, 0.0])
    assert f1 == pytest.approx(308.1291, rel=1e-4) and f2 == pytest.approx(3.0)
    on_front = pareto.dtlz2([0.3, 0.5, 0.5, 0.5, 0.5, 0.5])
    assert math.hypot(*on_front) == pytest.approx(1.0)
    assert pareto.PROBLEMS["dtlz2-d6"].max_hypervolume == pytest.approx(1.21 - math.pi / 4)
    curve = pareto.hypervolume_curve(pareto.PROBLEMS["dtlz2-d6"], [(2.0, 2.0), (0.1, 1.0)])
    assert curve == [0.0, pytest.approx(1.0 * 0.1)]


def test_pareto_main_runs_and_reports_time_to_target(tmp_path: Path) -> None:
    argv = ["--seeds", "1", "--problems", "branin-currin", "--methods", "random,optuna-tpe"]
    assert pareto.main([*argv, "--out", str(tmp_path), "--no-plot"]) == 0
    data = json.loads((tmp_path / "pareto.json").read_text())
    summary = data["summary"]["branin-currin"]
    assert set(summary["methods"]) == {"random", "optuna-tpe"}
    assert len(summary["methods"]["random"]["mean_curve"]) == 30


def write_table(path: Path, noise: float = 0.0) -> None:
    """A 4 x 3 grid: energy falls with the clock, latency rises; 3 repetitions."""
    rng = random.Random(0)
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["sm_mhz", "batch", "energy_j", "p99_ms", "status", "reason"])
        for _ in range(3):
            for clock in (1980, 1500, 1000, 500):
                for batch in (1, 4, 16):
                    if clock == 500 and batch == 16:
                        writer.writerow([clock, batch, "", "", "INFEASIBLE", "oom"])
                        continue
                    energy = clock / 1000 * (1 + 1 / batch) * (1 + noise * rng.uniform(-1, 1))
                    latency = 2000 / clock * batch
                    writer.writerow([clock, batch, energy, latency, "COMPLETED", ""])


def test_truth_judges_cells_by_their_means(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_table(path)
    truth = replay.truth_of(path, "energy_j", False, [OutcomeConstraint.parse("p99_ms <= 20")])
    assert truth.names == ("sm_mhz", "batch")
    assert (500, 16) not in truth.feasible  # it broke
    assert (500, 4) in truth.feasible and truth.best == pytest.approx(0.5 * 1.25)
    assert truth.hit((500, 4)) and not truth.hit((1000, 4))
    assert not truth.hit((1000, 16))  # 32 ms: infeasible


@pytest.mark.parametrize("method", replay.METHODS)
def test_every_method_runs_on_the_table_and_reaches_the_best(method: str, tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_table(path, noise=0.02)
    constraints = [OutcomeConstraint.parse("p99_ms <= 20")]
    truth = replay.truth_of(path, "energy_j", False, constraints)
    knobs = ReplayTarget(table=str(path), metrics=["energy_j", "p99_ms"]).describe_knobs()
    from tuner.study import StudySpec

    spec = StudySpec.from_dict(
        {"name": "t", "objectives": [{"name": "energy_j", "goal": "minimize"}],
         "outcome_constraints": ["p99_ms <= 20"], "designer": {"seed": 1}},
        knobs=knobs,
    )  # fmt: skip
    run = replay.run_method(method, path, spec, truth, 1, budget=12)
    assert len(run.cells) == 12
    assert run.reached is not None and truth.hit(tuple(run.cells[run.reached - 1]))
    if method == "grid":
        assert run.cells[0] == [1980, 16] and run.reached == 11  # from the top down
    if method in ("grid", "random"):
        assert len({tuple(c) for c in run.cells}) == 12  # no cell twice


def test_replay_main_writes_a_summary_and_a_plot(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_table(path, noise=0.05)
    argv = ["--table", str(path), "--objective", "energy_j", "--goal", "minimize",
            "--constraint", "p99_ms <= 20", "--seeds", "2", "--methods", "grid,random",
            "--out", str(tmp_path)]  # fmt: skip
    assert replay.main(argv) == 0
    data = json.loads((tmp_path / "replay-t.json").read_text())
    assert data["truth"]["cells"] == 12 and data["truth"]["target_cells"] >= 1
    assert data["summary"]["grid"]["reached"] == 2
    assert (tmp_path / "replay-t.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_measures_every_cell_default_first_into_a_replayable_table(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    program = tmp_path / "p.py"
    program.write_text(
        "import json, sys\n"
        "a, b = int(sys.argv[1]), sys.argv[2]\n"
        "if a == 3 and b == 'y':\n    sys.exit(3)\n"
        "print(json.dumps({'t': a * (2 if b == 'x' else 1)}))\n"
    )
    config.write_text(
        f"""
[study]
name = "s"
objectives = [{{ name = "t", goal = "minimize" }}]
[[study.knobs]]
name = "a"
kind = "int"
low = 1
high = 9
default = 2
[[study.knobs]]
name = "b"
kind = "categorical"
choices = ["x", "y"]
default = "y"
[[study.knobs]]
name = "c"
kind = "float"
low = 0
high = 1
default = 0.5
[target]
kind = "command"
command = [{json.dumps(sys.executable)}, {json.dumps(str(program))}, "{{a}}", "{{b}}"]
metrics = ["t"]
infeasible_exit_codes = [3]
"""
    )
    out = tmp_path / "table.csv"
    assert sweep.main([str(config), "--out", str(out), "--repeats", "2",
                       "--levels", "a=1,2,3"]) == 0  # fmt: skip
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 12 and rows[0]["a"] == "2" and rows[0]["b"] == "y"  # the default
    assert "c" not in rows[0] and float(rows[0]["trial_s"]) > 0  # c: held at its default
    broken = [r for r in rows if r["status"] == "INFEASIBLE"]
    assert len(broken) == 2 and all((r["a"], r["b"]) == ("3", "y") for r in broken)
    target = ReplayTarget(table=str(out), metrics=["t"])
    assert target.cells == 6
    assert sweep.main([str(config), "--out", str(out), "--levels", "z=1"]) == 1
