"""bench.cloud: every method searches Scout's deployments per workload and objective, and
the table sits next to the published bbo-arena runs of the same workloads. Skipped where
``../shared/benchdata`` is absent (Scout's runs via bbo-arena carry no license to ship)."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import pytest

from bench import cloud
from bench.common import data_absent
from knobs.cloud import load_cloud_catalog

pytestmark = pytest.mark.skipif(not cloud.DATA.is_dir(), reason=data_absent(cloud.DATA))


def test_published_runs_are_averaged_over_the_chosen_workloads() -> None:
    path = cloud.DATA / "bbo_arena_published_baselines.csv"
    names = cloud.workloads(cloud.DATA / "cloud_config_lookup.csv")
    assert len(names) == 18
    table = cloud.published(path, names)
    with path.open(newline="") as handle:
        rows = [
            float(r["mean_best_over_opt"])
            for r in csv.DictReader(handle)
            if r["objective"] == "runtime"
            and r["algorithm"] == "GP_EI_init6_xi0.01"
            and r["k_evals"] == "10"
            and r["workload"] in names
        ]
    assert len(rows) == 18
    assert table[("runtime_s", "GP_EI_init6_xi0.01")][10][0] == pytest.approx(sum(rows) / 18)
    assert set(cloud.PUBLISHED) == {a for (o, a) in table if o == "cost_usd"}


def test_a_failed_run_scores_as_bbo_arena_scores_it() -> None:
    # 22 of its 69 measured runs failed or timed out
    curve = cloud.run_one("random", "spark1.5_regression_bigdata", "runtime_s", 0, 20,
                          cloud.DATA / "cloud_config_lookup.csv")  # fmt: skip
    assert len(curve) == 20
    assert all(b <= a for a, b in itertools.pairwise(curve))
    assert max(curve) <= cloud.FAILED_VALUE["runtime_s"]


@pytest.mark.slow
def test_main_runs_every_method_and_resumes(tmp_path: Path) -> None:
    argv = ["--seeds", "2", "--budget", "10", "--workloads", "spark_lr_huge", "--jobs", "1",
            "--out", str(tmp_path)]  # fmt: skip
    assert cloud.main(argv) == 0
    data = json.loads((tmp_path / "cloud.json").read_text())
    assert (tmp_path / "cloud.png").stat().st_size > 0
    optimum = data["optima"]["spark_lr_huge/runtime_s"]
    assert optimum == pytest.approx(1039.6, abs=0.1)  # 4 x r4.xlarge (reference notes)
    for objective in cloud.OBJECTIVES:
        for method in cloud.METHODS:
            cell = data["results"][objective][method]["spark_lr_huge"]
            assert cell["seeds"] == [0, 1] and len(cell["mean_best_over_opt"]) == 10
            assert all(v >= 1.0 for v in cell["mean_best_over_opt"])
            assert all(0.0 <= p <= 1.0 for p in cell["frac_found_opt"])
    before = (tmp_path / "cloud.json").read_text()
    assert cloud.main([*argv, "--resume"]) == 0  # nothing left to run: the same numbers
    after = json.loads((tmp_path / "cloud.json").read_text())
    assert after["results"] == json.loads(before)["results"]


def test_scouts_measured_runs_are_the_catalogs_69_deployments_at_its_prices() -> None:
    catalog = load_cloud_catalog()
    with (cloud.DATA / "cloud_config_lookup.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    key = lambda c: (c["family"], c["size"], int(c["nodes"]))  # noqa: E731
    for workload in {r["workload"] for r in rows}:
        measured = [r for r in rows if r["workload"] == workload]
        configs = [{"family": r["family"], "size": r["size"], "nodes": r["num_nodes"]}
                   for r in measured]  # fmt: skip
        assert sorted(map(key, configs)) == sorted(map(key, catalog.candidates()))
        for row, config in zip(measured, configs, strict=True):
            if row["completed"] == "1":
                cost = catalog.cost_usd(config, float(row["runtime_s"]))
                assert cost == pytest.approx(float(row["cost_usd"]), rel=1e-5)
