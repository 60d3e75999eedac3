"""The suite's problems: ``bench/suite_problems.py``, ``dbres.py`` and ``yahpo_bridge.py``.

Tests that read ``../shared/benchdata`` are skipped with a reason when it is absent, and the
YAHPO ones when ``bench/.venv-yahpo`` is missing (``bench/setup_yahpo.sh``). Only develop
problems are built and measured; the report half is checked by name only.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from bench import dbres, dbsurrogate, hdbo, yahpo_bridge
from bench import suite_problems as sp
from bench.cloud import workloads
from bench.common import data_absent
from bench.contract import Measurement, SuiteProblem, run_rng
from tuner.space import SearchSpace, knob_from_dict

DATA = sp.DATA
SUITE = sp.read_suite()
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=data_absent(DATA))
needs_yahpo = pytest.mark.skipif(
    yahpo_bridge.unavailable() is not None,
    reason="bench/.venv-yahpo is missing: run bench/setup_yahpo.sh",
)


def _build(name: str, half: str = "develop") -> SuiteProblem:
    problems, skipped = sp.build([name], half, SUITE)
    assert not skipped, skipped
    return problems[0]


def _constant(value: float | None) -> SuiteProblem:
    def measure(config: dict, rng: random.Random) -> Measurement:
        if value is None:
            return Measurement("infeasible")
        return Measurement("completed", {"y": value})

    return SuiteProblem(
        "db:const",
        "db",
        "develop",
        ({"name": "x", "kind": "float"},),
        "y",
        "maximize",
        (),
        10,
        measure,
        lambda c: value,
    )


def test_names_of_both_halves_resolve_to_known_definitions() -> None:
    develop, report = sp.suite_names("develop", SUITE), sp.suite_names("report", SUITE)
    assert not set(develop) & set(report)
    assert "db:sysbench-20~cov05" in develop and "db:seats-100~cov15" in report
    assert "db:tpcc-100" in develop and "db:tpcc-20" in report  # issue 26's report is develop
    assert "cloud:spark_join_huge:cost_usd" in develop and "sched:gavel:2869ce" in develop
    assert {n.split(":")[0] for n in report} == {"db"} and len(report) == 8 * 3
    for name in develop + report:
        family, rest = name.split(":", 1)
        if family == "db":
            base = rest.split("~")[0]
            assert base in dbsurrogate.SAMPLE_SETS or base in dbres.RES_SETS | dbres.RESTRICTIONS
        elif family == "hdbo":
            assert rest in hdbo.alebo_problems() or rest == "hartmann6-d20"
        elif family == "yahpo":
            assert yahpo_bridge.split_name(rest)[0] in yahpo_bridge.SCENARIOS


def test_select_takes_names_and_prefixes() -> None:
    names = sp.suite_names("develop", SUITE)
    assert sp.select(names, ["hdbo"]) == [
        "hdbo:branin-d100",
        "hdbo:hartmann6-d100",
        "hdbo:hartmann6-d20",
        "hdbo:hartmann6-d1000",
    ]
    assert sp.select(names, ["db:job-5"]) == ["db:job-5", "db:job-5~cov05", "db:job-5~cov15"]
    assert sp.select(names, ["hdbo:hartmann6-d100"]) == ["hdbo:hartmann6-d100"]
    assert len(sp.select(names, ["cloud:spark_lr"])) == 4
    assert sp.select(names, ["nothing"]) == []
    assert sp.select(names, ["=db:job-5"]) == ["db:job-5"]
    assert sp.select(names, ["=db:job-5", "hdbo:hartmann6-d20"]) == [
        "db:job-5",
        "hdbo:hartmann6-d20",
    ]
    assert sp.select(names, ["=hdbo"]) == []
    assert sp.select(names, iter(["=db:job-5", "hdbo:hartmann6-d20"])) == [  # read once
        "db:job-5",
        "hdbo:hartmann6-d20",
    ]


def test_a_report_problem_is_refused_for_the_develop_half() -> None:
    with pytest.raises(ValueError, match="not a develop problem"):
        sp.build(["db:tpcc-20"], "develop", SUITE)


def test_noisy_twin_mean_is_the_true_value_and_outliers_occur() -> None:
    twin = sp.noisy_twin(_constant(100.0), cov=0.15, rate=0.02, factor=3.0)
    assert twin.name == "db:const~cov15" and twin.true_value({"x": 0.5}) == 100.0
    rng = random.Random(7)
    values = [twin.measure({"x": 0.5}, rng).metrics["y"] for _ in range(40_000)]
    outliers = [v for v in values if v > 200.0 or v < 50.0]  # x3 or /3 of a ~15 % draw
    assert 0.01 < len(outliers) / len(values) < 0.03
    shift = 0.02 * (3.0 + 1 / 3.0 - 2.0) / 2  # what the outliers add to the mean
    assert statistics.fmean(values) == pytest.approx(100.0 * (1 + shift), rel=0.005)
    inliers = [v for v in values if 50.0 <= v <= 200.0]
    assert statistics.fmean(inliers) == pytest.approx(100.0, rel=0.005)
    assert statistics.stdev(inliers) / statistics.fmean(inliers) == pytest.approx(0.15, rel=0.05)


def test_noisy_twin_keeps_infeasible_and_draws_from_the_runs_generator() -> None:
    twin = sp.noisy_twin(_constant(None), cov=0.05, rate=0.02, factor=3.0)
    assert twin.measure({"x": 0.1}, random.Random(0)).status == "infeasible"
    noisy = sp.noisy_twin(_constant(10.0), cov=0.05, rate=0.0, factor=3.0)
    first = [noisy.measure({}, run_rng("p", 1)).metrics["y"] for _ in range(2)]
    assert first[0] == first[1]  # same seed, same draw: every method meets the same noise
    assert sp.twin_suffix(0.05) == "~cov05" and sp.twin_suffix(0.15) == "~cov15"


@needs_data
def test_db_problems_and_their_noisy_twins_build() -> None:
    problems, skipped = sp.build(["db:job-5", "db:job-5~cov05"], "develop", SUITE)
    assert not skipped
    clean, twin = problems
    assert clean.goal == "minimize" and clean.embed_dims == 4 and clean.budget == 100
    assert not any("recommended" in k for k in clean.knobs)  # no priors in the suite
    config = {k["name"]: k["low"] if k["kind"] == "int" else k["choices"][0] for k in clean.knobs}
    value = clean.true_value(config)
    assert value is not None and clean.measure(config, run_rng("x", 0)).metrics["latency"] == value
    assert twin.true_value(config) == value and twin.name == "db:job-5~cov05"


@needs_data
def test_res_logs_are_read_with_their_failed_runs() -> None:
    tpcc = dbres.load_res(DATA, "tpcc-100")
    assert tpcc.X.shape == (600, 100) and int(tpcc.failed.sum()) == 158
    kinds = [k["kind"] for k in tpcc.knobs]
    assert kinds.count("categorical") == 54 and kinds.count("int") == 46
    big = next(k for k in tpcc.knobs if k["name"] == "innodb_online_alter_log_max_size")
    assert big["high"] == dbres.INT64_MAX
    ycsb = dbres.load_res(DATA, "ycsb-100")
    assert int(ycsb.failed.sum()) == 314 and math.isnan(ycsb.y[ycsb.failed][0])
    SearchSpace(tuple(knob_from_dict(k) for k in tpcc.knobs))  # valid for our designer


@needs_data
def test_the_benchbase_logs_hold_the_same_knobs_as_tpcc() -> None:
    tpcc = {k["name"] for k in dbres.load_res(DATA, "tpcc-100").knobs}
    for name, lines, failed in (
        ("seats-100", 600, 305),
        ("tatp-100", 433, 6),
        ("voter-100", 600, 9),
    ):
        samples = dbres.load_res(DATA, name)
        assert samples.X.shape == (lines, 100) and int(samples.failed.sum()) == failed
        assert len({k["name"] for k in samples.knobs} & tpcc) >= 99


@needs_data
def test_a_restriction_frees_the_most_important_knobs_and_holds_the_rest_at_defaults() -> None:
    """Checked on the mechanics only (the report half is never measured in tests): the rule
    ranks by the forests' importances, and a held knob's value is MySQL's default."""
    model = dbres.surrogate(DATA.resolve(), "tpcc-100")
    top = dbres.important_knobs(model, 20)
    assert len(set(top)) == 20 and top[:5] == dbres.important_knobs(model, 5)
    assert "completion_type" in top  # decides 150 of TPC-C's 158 failures (module doc)
    knobs, held, predict = dbres.restricted(DATA.resolve(), "tpcc-20")
    assert [k["name"] for k in knobs] == [k["name"] for k in model.knobs if k["name"] in top]
    assert len(held) == 80 and not set(held) & set(top)
    ranges = json.loads((DATA / dbsurrogate.FOLDER / "SYSBENCH_shap_knobs.json").read_text())
    assert all(str(v) == str(ranges[n]["default"]) for n, v in held.items())
    config = {k["name"]: k["low"] if k["kind"] == "int" else k["choices"][0] for k in knobs}
    assert predict(config) == model.predict({**held, **config})


@needs_data
def test_pg_surrogate_predicts_failures_and_latency() -> None:
    samples = dbres.load_res(DATA, "pg-5")
    assert samples.X.shape == (1317, 5) and int(samples.failed.sum()) == 45
    quality = dbres.validate(samples, folds=3)
    assert quality["r2"] > 0.5 and quality["auc"] > 0.9
    model = dbres.surrogate(DATA.resolve(), "pg-5")
    names = [k["name"] for k in samples.knobs]
    failed_row = samples.X[samples.failed][0]
    config = {
        n: float(v) if n == "checkpoint_completion_target" else int(v)
        for n, v in zip(names, failed_row, strict=True)
    }
    assert model.predict(config) is None  # a logged failure is predicted to fail


@needs_data
def test_hdbo_cloud_and_sched_problems_build() -> None:
    branin = _build("hdbo:branin-d100")
    assert branin.budget == 100 and branin.embed_dims == 16 and branin.optimum == 0.397887
    cloud = _build("cloud:spark_lr_huge:cost_usd")
    assert cloud.budget == 30 and len(cloud.candidates) == len(cloud.candidate_features) == 69
    assert set(cloud.candidate_features[0]) == {"vcpus", "memory_gib"}
    assert not any("default" in k for k in cloud.knobs)
    assert cloud.optimum == min(v for c in cloud.candidates if (v := cloud.true_value(c)))
    table = DATA / sp.CLOUD_TABLE
    assert {"spark_lr_bigdata", "spark_lr_huge"} <= set(workloads(table))
    outcomes = [cloud.measure(c, random.Random(0)) for c in cloud.candidates]
    infeasible = [m for m in outcomes if m.status == "infeasible"]
    assert infeasible and all(not m.metrics for m in infeasible)


@needs_data
def test_sched_constraint_decides_the_true_value() -> None:
    sched = _build("sched:gavel:0e4a51")
    assert sched.constraints == ("p99_ratio <= 1.1",) and sched.objective == "jct_ratio"
    default = sched.measure({}, random.Random(0))
    assert default.metrics["jct_ratio"] == pytest.approx(1.0) == default.metrics["p99_ratio"]
    assert sched.true_value({}) == pytest.approx(1.0)
    starved = {  # found by random search: about one uniform configuration in nine breaks it
        "num_queues": 4, "threshold_1": 388691.6213435914, "ratio_2": 2.157080835048132,
        "ratio_3": 1.694908328670649, "ratio_4": 32.11694028097357,
        "starvation": 9.166143812137763, "interval_s": 83.12958999100658,
    }  # fmt: skip
    broken = sched.measure(starved, random.Random(0))
    assert broken.status == "completed" and broken.metrics["p99_ratio"] > 1.1
    assert sched.true_value(starved) is None
    assert sched.measure(starved, random.Random(1)) is broken  # cached: deterministic


@needs_data
def test_yahpo_knobs_drop_the_instance_and_fix_fidelities_at_their_maximum() -> None:
    knobs, fixed = yahpo_bridge.scenario_knobs(DATA, "lcbench", "167168")
    assert fixed == {"OpenML_task_id": "167168", "epoch": 52}
    assert {k["name"]: k.get("log", False) for k in knobs}["batch_size"] is True
    knobs, fixed = yahpo_bridge.scenario_knobs(DATA, "rbv2_xgboost", "16")
    assert fixed == {"task_id": "16", "trainsize": 1.0, "repl": 10} and len(knobs) == 14
    assert yahpo_bridge.scenario_knobs(DATA, "iaml_glmnet", "1489")[1]["trainsize"] == 1.0
    for name in SUITE["develop"]["yahpo"]:
        yahpo_bridge.scenario_knobs(DATA, *yahpo_bridge.split_name(name))  # instance exists
    with pytest.raises(ValueError, match="no instance"):
        yahpo_bridge.scenario_knobs(DATA, "lcbench", "1")


def test_yahpo_problems_are_skipped_without_their_environment(tmp_path: Path) -> None:
    (tmp_path / yahpo_bridge.FOLDER).mkdir(parents=True)  # the data, but not the environment
    problems, skipped = sp.build(
        ["yahpo:lcbench-167168"], "develop", SUITE, tmp_path, yahpo_python=tmp_path / "python"
    )
    assert not problems and "setup_yahpo.sh" in skipped["yahpo:lcbench-167168"]


@needs_data
@needs_yahpo
def test_yahpo_problems_evaluate_through_one_child() -> None:
    problems, skipped = sp.build(
        ["yahpo:rbv2_xgboost-16", "yahpo:iaml_glmnet-1489"], "develop", SUITE
    )
    assert not skipped
    xgb, glmnet = problems
    assert xgb.goal == "maximize" and glmnet.goal == "minimize" and glmnet.objective == "mmce"
    linear = {
        k["name"]: k["low"] if k["kind"] != "categorical" else k["choices"][0] for k in xgb.knobs
    }
    linear["booster"] = "gblinear"
    moved = {**linear, "eta": 0.5, "max_depth": 12, "rate_drop": 0.9}  # inactive for gblinear
    value = xgb.true_value(linear)
    assert value is not None and 0.0 <= value <= 1.0
    assert xgb.true_value(moved) == value  # inactive knobs change nothing
    assert xgb.true_value({**linear, "booster": "dart"}) != value
    m = glmnet.measure({"alpha": 0.5, "s": 0.01}, random.Random(0))
    assert m.status == "completed" and 0.0 <= m.metrics["mmce"] <= 1.0
