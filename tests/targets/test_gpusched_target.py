"""The gpusched target: 2D-LAS knobs mapped onto the simulator's policy, cluster sizing,
metrics relative to Tiresias's defaults (worst case or geometric mean over traces, and per
trace), option errors, and a real BO session over it."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import pytest

from runner.config import load_config, parse_config
from targets.registry import build_target
from targets.scheduler.gpusched import (
    SHIPPED_TRACES,
    GpuSchedTarget,
    cluster_size,
    knobs,
    policy_of,
    tiresias_policy,
)
from targets.scheduler.simulator import Job, Policy, read_tiresias, simulate
from tuner.constraints import METRIC_NAME
from tuner.errors import ValidationError
from tuner.space import SearchSpace
from tuner.trial import Trial, TrialStatus, is_feasible

ROOT = Path(__file__).resolve().parents[2]
TRACES = SHIPPED_TRACES  # Gavel's and Tiresias's traces, shipped with the target
TIRESIAS_60 = TRACES / "tiresias" / "60_job.csv"
GAVEL_SMALL = TRACES / "gavel_msr_seed0" / "2869ce.trace"
GAVEL_BUSY = TRACES / "gavel_msr_seed0" / "103959.trace"

# Two 1-GPU jobs on one GPU: a long one, then a short one that 2D-LAS lets overtake it
# once the long one has attained more than the top queue's limit.
TINY = (
    "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
    "0,1,0,1,a,1000,1\n1,1,10,1,b,100,1\n"
)


def gpusched(**options: Any) -> GpuSchedTarget:
    built = build_target("gpusched", options)
    assert isinstance(built, GpuSchedTarget)
    return built


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.csv"
    path.write_text(TINY, encoding="utf-8")
    return path


def test_the_default_configuration_is_tiresias_as_shipped() -> None:
    default = SearchSpace(knobs()).default_config()
    assert default is not None
    policy = policy_of(default)
    assert policy.kind == "dlas" and policy.starvation == 0.0
    assert policy.thresholds == pytest.approx((3250.0, 7200.0, 18000.0))


def test_queue_limits_grow_by_the_ratios_and_unused_ratios_are_ignored() -> None:
    config = {"num_queues": 3, "threshold_1": 100.0, "ratio_2": 10.0, "ratio_3": 50.0,
              "ratio_4": 7.0, "starvation": 2.0, "interval_s": 30.0}  # fmt: skip
    policy = policy_of(config, restart_s=5.0)
    assert policy.thresholds == pytest.approx((100.0, 1000.0))
    assert (policy.starvation, policy.interval_s, policy.restart_s) == (2.0, 30.0, 5.0)
    assert policy_of({**config, "num_queues": 1}).thresholds == ()
    assert policy_of({**config, "num_queues": 5}).thresholds == pytest.approx(
        (100.0, 1000.0, 50000.0, 350000.0)
    )


def test_a_trial_reports_the_simulated_schedule(tiny: Path) -> None:
    with gpusched(traces=[str(tiny)], gpus=1) as target:
        # one queue: FIFO order, the short job waits for the long one
        outcome = target.run_trial({"num_queues": 1})
        assert outcome.status is TrialStatus.COMPLETED
        assert outcome.metrics["avg_jct_s"] == pytest.approx((1000 + (1100 - 10)) / 2)
        # two queues with a 100 GPU-s limit: the short job (arrived at 10) waits behind the
        # long one in the top queue until the long one drops to the low queue at t=100,
        # then runs 100-200; the long one resumes and finishes at 1100
        two = target.run_trial({"num_queues": 2, "threshold_1": 100.0})
        assert two.metrics["avg_jct_s"] == pytest.approx(((1100 - 0) + (200 - 10)) / 2)
        assert two.metrics["preemptions"] == 1
        # Tiresias's defaults keep both jobs in the top queue (1000 GPU-s < 3250): FIFO
        assert two.metrics["jct_ratio"] == pytest.approx(two.metrics["avg_jct_s"] / 1045.0)


def test_metrics_match_the_simulator_and_tiresias_scores_one() -> None:
    with gpusched(traces=[str(TIRESIAS_60)], cluster=str(TRACES / "tiresias" / "cluster_spec.csv"),
                  restart_s=10) as target:  # fmt: skip
        default = target.run_trial(target.default_config())
        config = {"num_queues": 2, "threshold_1": 500.0, "starvation": 1.0}
        tuned = target.run_trial(config)
    jobs = read_tiresias(TIRESIAS_60)
    expected = simulate(jobs, 64, tiresias_policy(10.0)).summary()
    assert default.metrics["avg_jct_s"] == pytest.approx(expected["avg_jct_s"])
    for ratio in ("jct_ratio", "p99_ratio", "makespan_ratio"):
        assert default.metrics[ratio] == pytest.approx(1.0)
    full = {**SearchSpace(knobs()).default_config(), **config}  # type: ignore[dict-item]
    other = simulate(jobs, 64, policy_of(full, 10.0)).summary()
    assert tuned.metrics["p99_jct_s"] == pytest.approx(other["p99_jct_s"])
    assert tuned.metrics["jct_ratio"] == pytest.approx(other["avg_jct_s"] / expected["avg_jct_s"])


def test_several_traces_average_and_take_the_worst_ratio_by_default(tiny: Path) -> None:
    config = {"num_queues": 2, "threshold_1": 100.0}
    with gpusched(traces=[str(tiny), str(TIRESIAS_60)], gpus=8) as target:
        assert target.aggregate == "worst"
        both = target.run_trial(config).metrics
    with gpusched(traces=[str(tiny), str(TIRESIAS_60)], gpus=8, aggregate="geomean") as target:
        mean = target.run_trial(config).metrics
    singles = []
    for path in (tiny, TIRESIAS_60):
        with gpusched(traces=[str(path)], gpus=8) as target:
            singles.append(target.run_trial(config).metrics)
    assert both["avg_jct_s"] == pytest.approx(
        (singles[0]["avg_jct_s"] + singles[1]["avg_jct_s"]) / 2
    )
    for ratio in ("jct_ratio", "p99_ratio", "makespan_ratio"):
        values = [s[ratio] for s in singles]
        assert both[f"{ratio}__tiny"] == pytest.approx(values[0])
        assert both[f"{ratio}__60_job"] == pytest.approx(values[1])
        assert both[ratio] == both[f"{ratio}_worst"] == pytest.approx(max(values))
        assert both[f"{ratio}_geomean"] == pytest.approx(math.sqrt(values[0] * values[1]))
        assert mean[ratio] == pytest.approx(both[f"{ratio}_geomean"])
        assert mean[f"{ratio}_worst"] == pytest.approx(max(values))
    # the two traces disagree, so the aggregates differ and the test can tell them apart
    assert both["jct_ratio"] > mean["jct_ratio"]


def test_a_trace_over_the_limit_is_infeasible_even_when_the_average_is_within(
    tmp_path: Path,
) -> None:
    # One GPU. "starve": a 1000 s job at 0 and four 100 s jobs arriving every 100 s from 10.
    # Tiresias's defaults keep everything in the top queue (FIFO): JCTs 1000 and 4 x 1090.
    # With one limit at 100 GPU-s the long job is demoted at 100, waits for the four short
    # ones (100-500) and ends at 1400: p99 JCT 1400 / 1090 = 1.284, over 1.1. On the tiny
    # trace (twice) the same policy gives 1100 / 1090 = 1.009, so the geometric mean is
    # (1.009^2 x 1.284)^(1/3) = 1.094 <= 1.1: only the worst case sees the breach.
    starve = tmp_path / "starve.csv"
    rows = "".join(f"{k},1,{10 + 100 * (k - 1)},1,b,100,1\n" for k in range(1, 5))
    starve.write_text(TINY.splitlines(keepends=True)[0] + "0,1,0,1,a,1000,1\n" + rows)
    tiny = tmp_path / "tiny.csv"
    tiny.write_text(TINY, encoding="utf-8")
    config = {"num_queues": 2, "threshold_1": 100.0}
    feasible = {}
    for aggregate in (None, "worst", "geomean"):
        target_options: dict[str, Any] = {
            "kind": "gpusched", "traces": [str(tiny), str(tiny), str(starve)], "gpus": 1
        }  # fmt: skip
        if aggregate is not None:
            target_options["aggregate"] = aggregate
        parsed = parse_config(
            {"study": {"name": "s", "objectives": [{"name": "jct_ratio_geomean"}],
                       "outcome_constraints": ["p99_ratio <= 1.1"]},
             "target": target_options},
            {},
        )  # fmt: skip
        with parsed.target as target:
            outcome = target.run_trial(config)
        metrics = outcome.metrics
        assert metrics["p99_ratio__starve"] == pytest.approx(1400 / 1090)
        assert metrics["p99_ratio__tiny"] == metrics["p99_ratio__tiny_2"]
        assert metrics["p99_ratio__tiny"] == pytest.approx(1100 / 1090)
        assert metrics["p99_ratio_geomean"] == pytest.approx(
            ((1100 / 1090) ** 2 * 1400 / 1090) ** (1 / 3)
        )
        trial = Trial(1, config, outcome.status, metrics)
        feasible[aggregate] = is_feasible(parsed.spec, trial)
    assert feasible == {None: False, "worst": False, "geomean": True}


def test_per_trace_metrics_have_valid_distinct_names(tmp_path: Path) -> None:
    odd = tmp_path / "my trace+1.csv"
    odd.write_text(TINY, encoding="utf-8")
    target = gpusched(traces=[str(odd), str(odd)], gpus=1)
    assert [t.name for t in target.traces] == ["my_trace_1", "my_trace_1_2"]
    described = target.describe_metrics()
    with target:
        measured = target.run_trial({}).metrics
    assert set(measured) == set(described)
    for name in described:
        assert METRIC_NAME.match(name), name
    assert {"p99_ratio__my_trace_1", "p99_ratio__my_trace_1_2", "jct_ratio_geomean",
            "makespan_ratio_worst"} <= set(described)  # fmt: skip
    # a per-trace ratio can be constrained on its own
    parse_config(
        {"study": {"name": "s", "objectives": [{"name": "jct_ratio"}],
                   "outcome_constraints": ["p99_ratio__my_trace_1_2 <= 1.1"]},
         "target": {"kind": "gpusched", "traces": [str(odd), str(odd)], "gpus": 1}},
        {},
    )  # fmt: skip


def test_the_example_constrains_every_training_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example's trace paths are relative to the checkout
    config = load_config(ROOT / "examples" / "gpusched.toml")
    assert config.target.aggregate == "worst"  # type: ignore[attr-defined]
    assert [str(c) for c in config.spec.outcome_constraints] == ["p99_ratio <= 1.1"]
    assert config.spec.objective.name == "jct_ratio_geomean"


def test_load_sizes_the_cluster_from_the_trace() -> None:
    jobs = [Job(0, 0.0, 2, 100.0), Job(1, 100.0, 4, 100.0), Job(2, 200.0, 1, 400.0)]
    # GPU time 200 + 400 + 400 = 1000 over max(span 200, longest job 400) = 2.5 GPUs busy
    assert cluster_size(jobs, 1.0) == 4  # ceil(2.5), and at least the widest job (4)
    assert cluster_size(jobs, 0.25) == 10
    target = gpusched(traces=[str(GAVEL_SMALL)], load=0.8, max_jobs=100)
    (trace,) = target.traces
    assert len(trace.jobs) == 100 and trace.gpus == cluster_size(trace.jobs, 0.8)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"gpus": 4}, "target.traces"),
        ({"traces": ["/no/such/trace.csv"], "gpus": 4}, "target.traces[0]"),
        ({"traces": [str(TIRESIAS_60)]}, "target.gpus"),
        ({"traces": [str(TIRESIAS_60)], "gpus": 4, "load": 0.5}, "target.gpus"),
        ({"traces": [str(TIRESIAS_60)], "gpus": 0}, "target.gpus"),
        ({"traces": [str(TIRESIAS_60)], "gpus": 2}, "target.traces[0]"),  # an 8-GPU job
        ({"traces": [str(TIRESIAS_60)], "load": 0}, "target.load"),
        ({"traces": [str(TIRESIAS_60)], "gpus": 8, "restart_s": -1}, "target.restart_s"),
        ({"traces": [str(TIRESIAS_60)], "gpus": 8, "gpu_type": "h100"}, "target.gpu_type"),
        ({"traces": [str(TIRESIAS_60)], "gpus": 8, "policy": "fifo"}, "target.policy"),
        ({"traces": [str(GAVEL_SMALL)], "gpus": 64, "throughputs": "/nope"}, "target.throughputs"),
        ({"traces": [str(TIRESIAS_60)], "gpus": 8, "aggregate": "max"}, "target.aggregate"),
        ({"traces": [str(TIRESIAS_60)], "gpus": 8, "aggregate": None}, "target.aggregate"),
    ],
)
def test_bad_options_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        build_target("gpusched", options)
    assert info.value.field == field


def test_a_bad_aggregate_names_the_allowed_values() -> None:
    with pytest.raises(ValidationError, match=r"target\.aggregate: got 'mean'.*'worst', 'geomean'"):
        build_target("gpusched", {"traces": [str(TIRESIAS_60)], "gpus": 8, "aggregate": "mean"})


def test_an_unreadable_trace_is_an_error_naming_the_traces(tmp_path: Path) -> None:
    bad = tmp_path / "bad.trace"
    bad.write_text("Nonexistent model\tcmd\t-n\t1\t100\t0.0\t1\n", encoding="utf-8")
    table = TRACES / "gavel_simulation_throughputs.json"
    with pytest.raises(ValidationError) as info:
        build_target("gpusched", {"traces": [str(bad)], "gpus": 8, "throughputs": str(table)})
    assert info.value.field == "target.traces" and "bad.trace" in str(info.value)


@pytest.mark.slow
def test_a_bo_session_beats_tiresias_defaults_on_a_trace(tmp_path: Path) -> None:
    config = {
        "study": {
            "name": "sched",
            "objectives": [{"name": "jct_ratio", "goal": "minimize"}],
            "outcome_constraints": ["p99_ratio <= 1.5"],
            "designer": {"seed": 0, "initial_trials": 5},
        },
        "target": {
            "kind": "gpusched",
            "traces": [str(GAVEL_BUSY)],
            "load": 0.9,
            "max_jobs": 300,
            "restart_s": 30,
        },
    }
    parsed = parse_config(config, {})
    from runner.session import run_session
    from server.service import TuningService
    from server.storage import SQLiteStorage

    service = TuningService(SQLiteStorage(tmp_path / "s.db"))
    try:
        with parsed.target as target:
            result = run_session(service, target, parsed.spec, 15)
        trials = service.list_trials("sched")
    finally:
        service.close()
    assert trials[0].config == parsed.target.default_config()  # Tiresias as shipped first
    assert trials[0].metrics["jct_ratio"] == pytest.approx(1.0)
    assert result.best is not None and result.best.metrics["jct_ratio"] < 0.95
    assert result.best.metrics["p99_ratio"] <= 1.5
    # and better than FIFO on the same cluster
    (trace,) = parsed.target.traces  # type: ignore[attr-defined]
    fifo = simulate(trace.jobs, trace.gpus, Policy("fifo", restart_s=30)).summary()
    assert result.best.metrics["avg_jct_s"] < fifo["avg_jct_s"]


def test_a_job_of_no_gpus_or_no_duration_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(TINY.replace("1,1,10,1,b,100,1", "1,0,10,1,b,100,1"), encoding="utf-8")
    with pytest.raises(ValidationError) as caught:
        gpusched(traces=[str(path)], gpus=2)
    assert caught.value.field == "target.traces[0]" and "job 1 of bad.csv" in caught.value.message


def test_unused_queue_limits_are_marked_so_results_leave_them_out() -> None:
    space = SearchSpace(knobs())
    config = {k.name: k.default for k in space.knobs} | {"num_queues": 2}
    assert space.inactive(config) == {"ratio_2", "ratio_3", "ratio_4"}
    assert space.inactive(config | {"num_queues": 1}) == {
        "threshold_1", "ratio_2", "ratio_3", "ratio_4"
    }  # fmt: skip


def test_a_gavel_trace_of_ones_own_gets_its_durations_from_the_shipped_throughputs(
    tmp_path: Path,
) -> None:
    own = tmp_path / "mine.trace"  # no throughputs beside it or one folder up
    own.write_text((TRACES / "gavel_msr_seed0" / "51b7ef.trace").read_text(), encoding="utf-8")
    target = build_target("gpusched", {"traces": [str(own)], "gpus": 64})
    assert isinstance(target, GpuSchedTarget)
    assert len(target.traces[0].jobs) == 18 and all(j.duration > 0 for j in target.traces[0].jobs)


def test_a_missing_trace_names_the_folder_of_the_shipped_ones(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as info:
        build_target("gpusched", {"traces": [str(tmp_path / "none.trace")], "gpus": 8})
    assert info.value.field == "target.traces[0]" and str(SHIPPED_TRACES) in str(info.value)


def test_the_shipped_traces_are_package_data_with_their_licenses() -> None:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        patterns = tomllib.load(handle)["tool"]["setuptools"]["package-data"]["targets"]
    package = ROOT / "targets"
    files = [p for p in SHIPPED_TRACES.rglob("*") if p.is_file()]
    installed = {p for pattern in patterns for p in package.glob(pattern) if p.is_file()}
    assert len(files) > 20 and set(files) == installed  # a wheel carries every one of them
    names = {p.name for p in files}
    assert {"README.md", "LICENSE.gavel.MIT", "LICENSE.tiresias.Apache-2.0"} <= names
    readme = (SHIPPED_TRACES / "README.md").read_text(encoding="utf-8")
    assert "stanford-futuredata/gavel" in readme and "SymbioticLab/Tiresias" in readme
