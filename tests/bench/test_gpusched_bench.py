"""bench.gpusched: every method tunes on training traces (Tiresias's defaults first) and its
best configuration is judged on held-out traces next to the baselines; the p99 constraint
holds on every training trace by default, and the held-out table counts the runs whose
configuration keeps the p99 limit on each trace it was not tuned on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpusched
from bench.common import markdown_table


def _held(p99: dict[str, float]) -> dict[str, object]:
    """A held-out trace's results: Tiresias's p99 JCT is 100 s, each run's as given."""
    policies = {gpusched.TIRESIAS: {"p99_jct_s": 100.0, "avg_jct_s": 50.0}}
    policies.update({k: {"p99_jct_s": v, "avg_jct_s": 40.0} for k, v in p99.items()})
    return {"gpus": 8, "jobs": 10, "policies": policies}


def _run(method: str, seed: int, aggregate: str, train: float | None) -> gpusched.Run:
    config = None if train is None else {"num_queues": 2}
    p99 = None if train is None else {"a": 1.0, "b": train}
    return gpusched.Run(method, seed, [0.9], config, 1.0, aggregate, p99)


def test_the_held_out_table_counts_runs_within_the_limit_per_trace() -> None:
    runs = [
        _run("ours", 0, "worst", 1.05),
        _run("ours", 1, "worst", 1.1),
        _run("ours", 2, "worst", None),  # found nothing feasible: left out of the counts
        _run("ours", 0, "geomean", 1.3),
        _run("ours", 1, "geomean", 1.0),
    ]
    test = {
        "t1": _held({"ours:0": 105.0, "ours:1": 111.0, "ours-geomean:0": 150.0,
                     "ours-geomean:1": 90.0}),
        "t2": _held({"ours:0": 100.0, "ours:1": 100.0, "ours-geomean:0": 109.0,
                     "ours-geomean:1": 120.0}),
    }  # fmt: skip
    summary = gpusched.held_out_p99(runs, test)
    assert summary["ours"]["t1"] == {
        "ratios": {"0": pytest.approx(1.05), "1": pytest.approx(1.11)}, "within": 1, "runs": 2
    }  # fmt: skip
    assert summary["ours"]["t2"]["within"] == 2
    assert summary["ours-geomean"]["t1"]["within"] == 1
    assert summary["ours-geomean"]["t2"]["within"] == 1
    text = markdown_table(gpusched.limit_table(runs, test))
    lines = text.splitlines()
    assert "| method (training constraint) | t1 | t2 | every held-out trace |" in lines[2]
    # t1: 1.05 and 1.11 -> 1/2, worst 1.110; t2 both 1.0; every held-out trace: seed 0 only;
    # every training trace: 1.05 and 1.1 (the limit itself holds)
    assert "| ours (worst trace) | 1/2 (1.110) | 2/2 (1.000) | 1/2 | 2/2 |" in lines
    # geomean: seed 0 breaks t1, seed 1 breaks t2, and seed 0 broke a training trace
    assert "| ours (geomean) | 1/2 (1.500) | 1/2 (1.200) | 0/2 | 1/2 |" in lines


def test_a_run_constrains_the_worst_training_trace_unless_told_otherwise() -> None:
    assert gpusched.constraint_metric("worst") == "p99_ratio_worst"
    assert gpusched.constraint_metric("geomean") == "p99_ratio_geomean"
    with pytest.raises(ValueError, match="worst"):
        gpusched.constraint_metric("mean")
    assert gpusched._parser().parse_args([]).aggregate == "worst"


@pytest.mark.slow
def test_a_tiny_run_prints_the_held_out_limit_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--seeds", "2", "--budget", "5", "--max-jobs", "60", "--methods", "random",
            "--aggregate", "worst,geomean", "--train", "103959,6c71a0", "--test", "2869ce",
            "--out", str(tmp_path), "--markdown"]  # fmt: skip
    assert gpusched.main(argv) == 0
    out = capsys.readouterr().out
    assert "**Held-out traces: runs keeping p99 JCT <= 1.1 x Tiresias (worst ratio)**" in out
    assert "| random (worst trace) |" in out and "| random (geomean) |" in out
    data = json.loads((tmp_path / "gpusched.json").read_text())
    assert data["aggregates"] == ["worst", "geomean"]
    for run in data["runs"]:
        assert set(run["train_p99"]) == {"103959", "6c71a0"}
        if run["aggregate"] == "worst":  # the chosen configuration holds on every trace
            assert max(run["train_p99"].values()) <= gpusched.P99_LIMIT
    row = data["held_out_p99"]["random"]["2869ce"]
    assert row["runs"] == 2
    assert row["within"] == sum(v <= gpusched.P99_LIMIT for v in row["ratios"].values())


@pytest.mark.slow
def test_main_tunes_every_method_and_judges_on_held_out_traces(tmp_path: Path) -> None:
    argv = ["--seeds", "1", "--budget", "12", "--max-jobs", "100", "--train", "103959",
            "--test", "2869ce", "--out", str(tmp_path)]  # fmt: skip
    assert gpusched.main(argv) == 0
    data = json.loads((tmp_path / "gpusched.json").read_text())
    assert (tmp_path / "gpusched.png").stat().st_size > 0
    assert {r["method"] for r in data["runs"]} == set(gpusched.METHODS)
    for run in data["runs"]:
        assert len(run["best"]) == 12
        assert run["best"][0] == pytest.approx(1.0)  # Tiresias's defaults, measured first
        assert all(b <= a for a, b in zip(run["best"], run["best"][1:], strict=False))
        assert run["config"] is not None
        assert run["aggregate"] == "worst"
    held = data["held_out"]["2869ce"]["policies"]
    assert set(gpusched.BASELINES) <= set(held)
    assert {f"{m}:0" for m in gpusched.METHODS} <= set(held)
    # on this trace FIFO's head-of-line blocking costs more than Tiresias's queues
    assert held["FIFO"]["avg_jct_s"] > held["Tiresias (3250/7200/18000)"]["avg_jct_s"]
    assert set(data["held_out_p99"]) == set(gpusched.METHODS)
