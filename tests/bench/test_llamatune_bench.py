"""Tests of the LlamaTune benchmark: problem definitions, surrogates, ratios, a tiny run.

The mlos-core peer needs its own environment (``bench/setup_mlos.sh``); nothing here starts
it. Tests that read ``../shared/benchdata`` are skipped with a reason when it is absent.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from bench import dbsurrogate, hdbo, llamatune, llamatune_report, mlos_peer
from bench.common import data_absent
from bench.methods import RunResult

DATA = llamatune.DEFAULT_DATA
needs_knob_data = pytest.mark.skipif(
    not (DATA / dbsurrogate.FOLDER).is_dir(), reason=data_absent(DATA / dbsurrogate.FOLDER)
)
needs_curves = pytest.mark.skipif(
    not (DATA / hdbo.CURVES_CSV).is_file(), reason=data_absent(DATA / hdbo.CURVES_CSV)
)
BRANIN_MINIMIZERS = [(-math.pi, 12.275), (math.pi, 2.275), (9.42478, 2.475)]
H6_MINIMIZER = (0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573)


def _random_config(problem: hdbo.KnobProblem, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    return {k["name"]: rng.uniform(k["low"], k["high"]) for k in problem.knobs}


def test_alebo_branin_definition_and_optima() -> None:
    problem = hdbo.branin_problem()
    assert problem.dim == 100 and problem.goal == "minimize"
    assert [(k["low"], k["high"]) for k in problem.knobs[:50]] == [(-5.0, 10.0)] * 50
    assert [(k["low"], k["high"]) for k in problem.knobs[50:]] == [(0.0, 15.0)] * 50
    for seed, (x1, x2) in enumerate(BRANIN_MINIMIZERS):
        config = _random_config(problem, seed)  # the 98 other parameters do not matter
        config.update(x19=x1, x64=x2)
        assert problem.evaluate(config) == pytest.approx(0.397887, abs=1e-6)
    config = _random_config(problem, 7)
    config.update(x0=math.pi, x1=2.275)  # the active parameters are x19 and x64, not x0, x1
    assert problem.evaluate(config) != pytest.approx(0.397887, abs=1e-3)


@pytest.mark.parametrize("dim", [100, 1000])
def test_alebo_hartmann6_definition_and_optimum(dim: int) -> None:
    problem = hdbo.hartmann6_problem(dim)
    assert problem.dim == dim and problem.optimum == -3.32237
    assert {(k["low"], k["high"]) for k in problem.knobs} == {(0.0, 1.0)}
    config = _random_config(problem, 1)
    active = hdbo.HARTMANN6_ACTIVE[dim]
    config.update({f"x{i}": v for i, v in zip(active, H6_MINIMIZER, strict=True)})
    assert problem.evaluate(config) == pytest.approx(-3.32237, abs=1e-5)
    shuffled = dict(config, **{f"x{active[0]}": H6_MINIMIZER[1], f"x{active[1]}": H6_MINIMIZER[0]})
    assert problem.evaluate(shuffled) > -3.3  # the order of the active parameters matters
    with pytest.raises(ValueError, match="D in"):
        hdbo.hartmann6_problem(50)


def test_the_hartmann6_guard_has_its_optimum_inside_20_knobs(tmp_path: Path) -> None:
    [problem], skipped = llamatune.build_problems(["hartmann6-d20"], tmp_path)  # no data needed
    assert not skipped and problem.dim == 20 and problem.budget == 100
    assert problem.embed_dims == 16 and problem.published is None
    config = _random_config(problem, 3)
    active = hdbo.HARTMANN6_GUARD_ACTIVE
    config.update({f"x{i}": v for i, v in zip(active, H6_MINIMIZER, strict=True)})
    assert problem.evaluate(config) == pytest.approx(-3.32237, abs=1e-5)
    corner = dict(config, **{f"x{i}": 1.0 for i in active})  # the faces are poor here
    assert problem.evaluate(corner) > -0.5


def test_best_so_far_and_trials_to_reach_follow_the_goal() -> None:
    low = hdbo.KnobProblem("m", (), lambda c: 0.0, "f", "minimize", 5, 5, 2)
    high = hdbo.KnobProblem("m", (), lambda c: 0.0, "tps", "maximize", 5, 5, 2)
    assert llamatune.best_so_far(low, [3.0, 5.0, 1.0, 2.0]) == [3.0, 3.0, 1.0, 1.0]
    assert llamatune.best_so_far(high, [3.0, 5.0, 1.0, 2.0]) == [3.0, 5.0, 5.0, 5.0]
    assert llamatune.trials_to_reach(low, [3.0, 3.0, 1.0, 1.0], 1.0) == 3  # ties count
    assert llamatune.trials_to_reach(low, [3.0, 3.0, 1.0, 1.0], 0.5) is None
    assert llamatune.trials_to_reach(high, [3.0, 5.0, 5.0], 4.0) == 2


def test_time_to_target_on_hand_made_curves() -> None:
    problem = hdbo.KnobProblem("m", (), lambda c: 0.0, "tps", "maximize", 10, 10, 2)
    curves = [
        [1, 2, 5, 5, 6, 6, 6, 6, 6, 6],  # reaches 5 at trial 3
        [1, 1, 1, 1, 1, 1, 4, 5, 5, 5],  # at trial 8
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],  # never: counts the whole budget (10)
    ]
    result = llamatune.time_to_target(problem, [[float(v) for v in c] for c in curves], 5.0, 10)
    assert result["trials"] == [3, 8, None]
    assert result["reached"] == 2 and result["seeds"] == 3
    assert result["mean_ratio"] == pytest.approx((0.3 + 0.8 + 1.0) / 3)


def test_summary_ratio_against_mlos_and_goals() -> None:
    problem = hdbo.KnobProblem("job", (), lambda c: 0.0, "latency", "minimize", 100, 30, 4)
    mlos = [[200.0] * 50 + [100.0] * 50, [200.0] * 99 + [120.0]]  # best at 100: mean 110
    ours = [[150.0] * 9 + [105.0] * 91, [150.0] * 39 + [90.0] * 61]
    runs = [
        RunResult(method, "job", seed, list(curve), 1.0)
        for method, curves in (("mlos", mlos), ("ours", ours))
        for seed, curve in enumerate(curves)
    ]
    summary = llamatune.summarize(problem, runs, 100)
    assert summary["checkpoints"] == [25, 50, 100]
    assert summary["target"] == {"ref_trials": 100, "value": pytest.approx(110.0)}
    assert summary["time_to_target"]["ours"]["trials"] == [10, 40]
    assert summary["time_to_target"]["ours"]["mean_ratio"] == pytest.approx(0.25)
    assert summary["methods"]["ours"]["checkpoints"]["25"]["mean"] == pytest.approx(127.5)
    (goal,) = llamatune.goals({"job": summary}, alebo_at_50=0.749)
    assert goal["passed"] and goal["value"] == pytest.approx(0.25)


def test_published_curves_reader_on_a_small_file(tmp_path) -> None:
    path = tmp_path / hdbo.CURVES_CSV
    path.parent.mkdir(parents=True)
    header = "problem,method,n_reps,iteration,mean_best,sem_best,median_best,q25_best,q75_best"
    path.write_text(
        f"{header}\n"
        '"Gramacy, D=100",ALEBO,50,2,0.9,0.1,0.8,0.7,1.0\n'
        '"Gramacy, D=100",ALEBO,50,1,inf,nan,inf,1.2,nan\n'
    )
    curve = hdbo.read_published(tmp_path)["Gramacy, D=100"]["ALEBO"]
    assert curve.reps == 50 and curve.mean[0] == math.inf and curve.mean[1] == 0.9
    assert curve.at(2) == 0.9 and curve.at(3) is None
    path.write_text(f'{header}\n"P",M,5,2,1,1,1,1,1\n')
    with pytest.raises(ValueError, match=r"not 1\.\.n"):
        hdbo.read_published(tmp_path)


@needs_curves
def test_published_curves_of_the_alebo_paper() -> None:
    curves = hdbo.read_published(DATA)
    alebo = curves["Branin, D=100"]["ALEBO"]
    assert len(alebo.mean) == 50 and alebo.reps == 50
    assert alebo.at(50) == pytest.approx(0.7493, abs=1e-4)
    assert len(curves["Hartmann6, D=1000"]["smac"].mean) == 200
    assert curves["Hartmann6, D=1000"]["smac"].reps == 10
    for problem in hdbo.alebo_problems().values():
        assert problem.published in curves


@needs_knob_data
@pytest.mark.parametrize(("name", "knobs"), [("sysbench-20", 20), ("job-5", 5)])
def test_surrogate_predicts_held_out_rows(name: str, knobs: int) -> None:
    samples = dbsurrogate.load_samples(DATA, name)
    assert len(samples.knobs) == knobs and samples.X.shape == (len(samples.y), knobs)
    order = list(range(len(samples.y)))
    random.Random(0).shuffle(order)
    cut = int(0.8 * len(order))
    train, test = order[:cut], order[cut:]
    part = dbsurrogate.Samples(samples.knobs, samples.X[train], samples.y[train])
    model = dbsurrogate.fit_surrogate(part, seed=0, trees=30)
    assert model.score(samples.X[test], samples.y[test]) > 0.5


@needs_knob_data
def test_surrogate_problems_knobs_and_values() -> None:
    problem = dbsurrogate.surrogate_problem(DATA, "job-5")
    kinds = {k["name"]: k["kind"] for k in problem.knobs}
    assert kinds["innodb_stats_method"] == "categorical"
    assert kinds["innodb_thread_concurrency"] == "int"
    special = {k["name"]: k.get("special_values") for k in problem.knobs}
    assert special["innodb_thread_concurrency"] == [0]
    samples = dbsurrogate.load_samples(DATA, "job-5")
    assert samples.X[:, 2].max() == 2  # enum strings became indices
    config = {k["name"]: (k["choices"][0] if "choices" in k else k["low"]) for k in problem.knobs}
    value = problem.evaluate(config)
    assert samples.y.min() <= value <= samples.y.max()
    assert problem.goal == "minimize" and problem.embed_dims == 4


def test_mlos_peer_reports_a_missing_environment(tmp_path) -> None:
    missing = tmp_path / "no-venv" / "python"
    with pytest.raises(mlos_peer.PeerUnavailable, match=r"setup_mlos\.sh"):
        mlos_peer.probe(missing)
    with pytest.raises(mlos_peer.PeerUnavailable, match=r"setup_mlos\.sh"):
        mlos_peer.MlosPeer(missing, {"seed": 1})


@needs_knob_data
def test_tiny_run_of_random_and_skopt_writes_results(tmp_path) -> None:
    args = ["--seeds", "1", "--budget", "12", "--problems", "job-5", "--out", str(tmp_path)]
    args += ["--methods", "random,skopt,mlos", "--mlos-python", str(tmp_path / "none")]
    assert llamatune.main(args) == 0
    data = json.loads((tmp_path / "llamatune.json").read_text())
    summary = data["summary"]["job-5"]
    assert set(summary["methods"]) == {"random", "skopt"}
    assert "mlos" in data["meta"]["skipped"]  # skipped with a reason, not a crash
    for method in ("random", "skopt"):
        curve = summary["methods"][method]["mean_curve"]
        assert len(curve) == 12 and curve == sorted(curve, reverse=True)  # latency: minimize
    assert summary["checkpoints"] == [12] and summary["target"]["value"] is None
    assert len(data["runs"]) == 2 and data["goals"] == []
    assert (tmp_path / "llamatune.png").stat().st_size > 0
    assert llamatune.main(["--report", str(tmp_path / "llamatune.json"), "--markdown"]) == 0


@needs_knob_data
def test_every_run_is_logged_and_resume_takes_finished_runs(tmp_path) -> None:
    base = ["--problems", "job-5", "--budget", "5", "--methods", "random", "--no-plot"]
    base += ["--out", str(tmp_path)]
    assert llamatune.main([*base, "--seeds", "2"]) == 0
    log = tmp_path / llamatune.RUNS_LOG
    first = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["seed"], len(r["best"])) for r in first] == [(0, 5), (1, 5)]
    assert llamatune.main([*base, "--seeds", "3", "--resume"]) == 0
    data = json.loads((tmp_path / "llamatune.json").read_text())
    assert sorted(r["seed"] for r in data["runs"]) == [0, 1, 2]
    assert len(log.read_text().splitlines()) == 3  # seeds 0 and 1 were not run again
    # another budget is another experiment: nothing is taken from the log
    assert llamatune.main([*base[:3], "4", *base[4:], "--seeds", "1", "--resume"]) == 0
    assert len(log.read_text().splitlines()) == 4


@needs_knob_data
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "sysbench-20",
            {
                "innodb_lru_scan_depth",
                "innodb_doublewrite",
                "innodb_log_file_size",
                "general_log",
                "innodb_thread_concurrency",
            },
        ),
        ("job-5", {"innodb_thread_concurrency", "innodb_stats_persistent"}),
    ],
)
def test_every_prior_lies_in_its_knobs_range_and_names_a_source(
    name: str, expected: set[str]
) -> None:
    knobs = dbsurrogate.load_samples(DATA, name).knobs
    with_prior = [k for k in knobs if k.get("recommended")]
    assert {k["name"] for k in with_prior} == expected
    for knob in with_prior:
        assert len(knob["recommended_source"]) > 40  # a document and the sentence it says
        if knob["kind"] == "int":
            low, high = knob["recommended"]
            assert isinstance(low, int) and isinstance(high, int)
            assert knob["low"] <= low <= high <= knob["high"]
        else:
            assert set(knob["recommended"]) < set(knob["choices"])
    problem = hdbo.KnobProblem(name, knobs, lambda c: 0.0, "m", "minimize", 6, 6, 4)
    spec = llamatune.study_spec(problem, 0, None, priors=True)  # the tuner accepts them too
    assert spec.designer.expert_priors
    assert {k.name for k in spec.space.knobs if k.recommended} == expected
    without = llamatune.study_spec(problem, 0, None)  # the other methods never see them
    assert not without.designer.expert_priors and not any(
        k.recommended for k in without.space.knobs
    )


@needs_knob_data
def test_sysbench_enum_codes_follow_knobs_tuning_eas_sorted_order() -> None:
    knobs = {k["name"]: k for k in dbsurrogate.load_samples(DATA, "sysbench-20").knobs}
    assert knobs["innodb_doublewrite"]["choices"] == ["OFF", "ON"]  # code 0 = OFF
    assert knobs["log_output"]["choices"] == ["FILE", "NONE", "TABLE"]
    assert dbsurrogate.encode((knobs["general_log"],), {"general_log": "OFF"}) == [0.0]
    job = {k["name"]: k for k in dbsurrogate.load_samples(DATA, "job-5").knobs}
    assert job["innodb_stats_method"]["choices"][0] == "nulls_equal"  # strings: JSON order


def test_a_prior_outside_its_range_is_rejected() -> None:
    knob = {"name": "k", "kind": "int", "low": 100, "high": 1000}
    with pytest.raises(ValueError, match=r"outside \[100, 1000\]"):
        dbsurrogate._check_prior(knob, dbsurrogate.Prior((50, 500), "manual"))
    choice = {"name": "c", "kind": "categorical", "choices": ["ON", "OFF"]}
    with pytest.raises(ValueError, match="not among"):
        dbsurrogate._check_prior(choice, dbsurrogate.Prior(("on",), "manual"))
    with pytest.raises(ValueError, match="source"):
        dbsurrogate._check_prior(choice, dbsurrogate.Prior(("ON",), " "))


@needs_knob_data
@pytest.mark.parametrize("name", ["sysbench-20", "job-5"])
def test_ours_priors_first_design_points_lie_in_the_recommended_region(name: str) -> None:
    knobs = dbsurrogate.load_samples(DATA, name).knobs  # no forest: the configs are the point
    seen: list[dict] = []

    def record(config: dict) -> float:
        seen.append(dict(config))
        return float(len(seen))

    problem = hdbo.KnobProblem(name, knobs, record, "m", "maximize", 6, 6, 4)
    result = llamatune.run_method("ours-priors", problem, 0, 6, llamatune.Settings(threads=1))
    assert result.notes == {"sobol": 6} and len(seen) == 6  # the initial design
    for knob in knobs:
        values = [config[knob["name"]] for config in seen]
        if not knob.get("recommended"):
            assert knob["kind"] != "int" or len(set(values)) > 1  # the whole range stays open
        elif knob["kind"] == "int":
            low, high = knob["recommended"]
            assert all(low <= v <= high for v in values), (knob["name"], values)
        else:
            assert set(values) <= set(knob["recommended"]), (knob["name"], values)


def test_ours_priors_runs_only_where_knobs_carry_priors() -> None:
    branin = hdbo.branin_problem()
    assert "has none" in (llamatune.cannot_run("ours-priors", branin) or "")
    assert llamatune.cannot_run("ours-full", branin) is None
    knobs = (
        {
            "name": "x",
            "kind": "int",
            "low": 0,
            "high": 9,
            "recommended": [1, 2],
            "recommended_source": "a manual",
        },
    )
    small = hdbo.KnobProblem("s", knobs, lambda c: 0.0, "f", "minimize", 5, 5, 1)
    assert llamatune.cannot_run("ours-priors", small) is None
    assert llamatune.not_run("ours-priors", small, 5) is None
    wide = replace(small, knobs=knobs * 21)
    assert "at most 20 knobs" in (llamatune.not_run("ours-priors", wide, 5) or "")


def test_tables_mark_the_methods_with_priors() -> None:
    problem = hdbo.KnobProblem("job", (), lambda c: 0.0, "latency", "minimize", 4, 4, 2)
    runs = [
        RunResult(method, "job", 0, [3.0, 2.0, 2.0, 1.0], 1.0)
        for method in ("ours-full", "ours-priors", "random")
    ]
    summaries = {"job": llamatune.summarize(problem, runs, 4)}
    headers = [str(c.header) for c in llamatune_report.quality_table(summaries, 1).columns]
    assert headers[2:] == ["ours-full", "ours-priors (with priors)", "random"]
    priors = {
        "job": {
            "k": {"recommended": ["ON"], "source": "MySQL manual"},
            "n": {"recommended": [0, 8], "source": "MySQL manual"},
        }
    }
    table = llamatune_report.priors_table(priors)
    assert "only by the methods marked (with priors);" in str(table.title)
    assert list(table.columns[2].cells) == ["ON", "0..8"]
