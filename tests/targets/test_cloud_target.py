"""The cloud targets: the instance catalog, replay of a table of runs (the modelled table of
``examples/cloud_runs.csv``, which ``examples/cloud_model.py`` makes), and the launcher running
real commands per deployment."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from knobs.cloud import load_cloud_catalog
from runner.config import parse_config
from targets.cloud.target import CloudLaunchTarget, CloudReplayTarget
from targets.registry import build_target
from tuner.errors import ValidationError
from tuner.trial import TrialStatus

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "examples" / "cloud_runs.csv"  # modelled runs (examples/cloud_model.py)
WORKLOAD = "model_pagerank"  # 34 of its 69 runs fail: out of memory on c4, or time out


def rows(workload: str) -> list[dict[str, str]]:
    with TABLE.open(newline="") as handle:
        return [r for r in csv.DictReader(handle) if r["workload"] == workload]


def config_of(row: dict[str, str]) -> dict[str, Any]:
    return {"family": row["family"], "size": row["size"], "nodes": int(row["num_nodes"])}


def test_the_catalog_gives_scouts_69_deployments_and_prices() -> None:
    # Scout's own measured runs agree with it: tests/bench/test_cloud_bench.py, where present
    catalog = load_cloud_catalog()
    candidates = catalog.candidates()
    assert len(candidates) == 69
    assert {c["nodes"] for c in candidates if c["size"] == "2xlarge"} == {4, 6, 8, 10, 12}
    assert [k.name for k in catalog.knobs()] == ["family", "size", "nodes"]
    assert catalog.sizes == ("large", "xlarge", "2xlarge")
    # 8 x c4.2xlarge ($0.398 an hour each) for 30 minutes
    cost = catalog.cost_usd({"family": "c4", "size": "2xlarge", "nodes": 8}, 1800.0)
    assert cost == pytest.approx(8 * 0.398 / 2)
    with pytest.raises(ValidationError) as caught:
        load_cloud_catalog("gcp_1999")
    assert caught.value.field == "target.catalog" and "aws_2017" in str(caught.value)


def test_replay_returns_the_measured_run_and_failed_runs_are_infeasible() -> None:
    target = build_target("cloud_replay", {"workload": WORKLOAD, "table": str(TABLE)})
    assert isinstance(target, CloudReplayTarget)
    measured = rows(WORKLOAD)
    done = next(r for r in measured if r["completed"] == "1")
    outcome = target.run_trial(config_of(done))
    assert outcome.status is TrialStatus.COMPLETED
    assert outcome.metrics == {
        "runtime_s": float(done["runtime_s"]),
        "cost_usd": float(done["cost_usd"]),
    }
    failed = next(r for r in measured if r["completed"] == "0")
    outcome = target.run_trial(config_of(failed))
    assert outcome.status is TrialStatus.INFEASIBLE
    assert "did not complete" in outcome.reason and WORKLOAD in outcome.reason
    assert len(target.describe_candidates()) == 69


def test_replay_of_a_deployment_without_a_run_is_failed_not_invented(tmp_path: Path) -> None:
    table = tmp_path / "lookup.csv"
    with TABLE.open(newline="") as src, table.open("w", newline="") as dst:
        reader = csv.DictReader(src)
        writer = csv.DictWriter(dst, reader.fieldnames or [])
        writer.writeheader()
        kept = [r for r in reader if r["workload"] == WORKLOAD][:10]
        writer.writerows(kept)
    target = CloudReplayTarget(workload=WORKLOAD, table=str(table))
    key = lambda c: (c["family"], c["size"], c["nodes"])  # noqa: E731
    assert sorted(map(key, target.describe_candidates())) == sorted(key(config_of(r)) for r in kept)
    missing = {"family": "r4", "size": "2xlarge", "nodes": 12}
    outcome = target.run_trial(missing)
    assert outcome.status is TrialStatus.FAILED and "not measured" in outcome.reason


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"workload": "spark_nothing", "table": str(TABLE)}, "target.workload"),
        ({"workload": WORKLOAD, "table": "/no/such.csv"}, "target.table"),
        ({"workload": WORKLOAD, "table": str(TABLE), "catalog": "azure"}, "target.catalog"),
        ({"workload": WORKLOAD, "table": str(TABLE), "zone": "a"}, "target.zone"),
    ],
)
def test_replay_options_are_checked(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build_target("cloud_replay", options)
    assert caught.value.field == field


def test_replay_without_a_table_names_the_option_and_reads_nothing_beside_the_checkout() -> None:
    with pytest.raises(ValidationError) as caught:
        build_target("cloud_replay", {"workload": WORKLOAD})
    assert caught.value.field == "target.table" and "is required" in caught.value.message
    assert "examples/cloud_runs.csv" in caught.value.message and "shared" not in str(caught.value)
    assert "workload, family, size, num_nodes" in str(caught.value.allowed)


def test_the_modelled_table_is_what_its_model_makes() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "cloud_model.py"), "--check"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    modelled = rows("model_terasort")
    assert len(modelled) == 69 and {r["source"] for r in modelled} == {
        "model (examples/cloud_model.py)"
    }
    failed = [r for r in rows(WORKLOAD) if r["completed"] == "0"]
    assert {r["family"] for r in failed} >= {"c4"} and all(
        r["runtime_s"] == "3600.0" for r in failed
    )


def test_a_config_file_study_gets_the_targets_candidates(tmp_path: Path) -> None:
    config = parse_config(
        {
            "study": {
                "name": "cloud",
                "objectives": [{"name": "cost_usd", "goal": "minimize"}],
                "outcome_constraints": ["runtime_s <= 900"],
            },
            "target": {"kind": "cloud_replay", "workload": WORKLOAD, "table": str(TABLE)},
            "session": {"trials": 5, "db": str(tmp_path / "t.db")},
        },
        {},
    )
    assert len(config.spec.candidates) == 69
    assert config.spec.space.names == ("family", "size", "nodes")
    # the model sees each deployment's totals: 8 x c4.2xlarge has 64 vCPUs and 120 GiB
    keys = [(c["family"], c["size"], c["nodes"]) for c in config.spec.candidates]
    features = dict(zip(keys, config.spec.candidate_features, strict=True))
    assert features[("c4", "2xlarge", 8)] == {"vcpus": 64.0, "memory_gib": 120.0}
    assert features[("r4", "large", 4)] == {"vcpus": 8.0, "memory_gib": 61.0}


def test_a_study_of_some_knobs_keeps_the_features_of_its_candidates(tmp_path: Path) -> None:
    config = parse_config(
        {
            "study": {
                "name": "c",
                "objectives": [{"name": "cost_usd", "goal": "minimize"}],
                "knobs": [{"name": "nodes"}],
            },
            "target": {"kind": "cloud_replay", "workload": WORKLOAD, "table": str(TABLE)},
            "session": {"trials": 5, "db": str(tmp_path / "t.db")},
        },
        {},
    )
    catalog = load_cloud_catalog()
    default = catalog.default
    assert [c["nodes"] for c in config.spec.candidates] == list(
        catalog.node_counts[default["size"]]
    )
    for candidate, features in zip(
        config.spec.candidates, config.spec.candidate_features, strict=True
    ):
        assert features == catalog.resources({**default, **candidate})


# -- the launcher -----------------------------------------------------------------------
LAUNCHER = """\
import json, sys, time
log, step = sys.argv[1], sys.argv[2]
with open(log, "a") as f:
    f.write(" ".join(sys.argv[2:]) + "\\n")
if step == "up" and sys.argv[3] == "r4.large":
    sys.exit(4)                                 # no r4.large capacity
if step == "run":
    nodes = int(sys.argv[4])
    if sys.argv[3] == "c4.2xlarge":
        sys.exit(2)                             # the launcher breaks
    if nodes == 4:
        time.sleep(30)                          # too slow: past the deadline
    if nodes == 6:
        print("starting", flush=True)           # no metrics: wall time is the runtime
        time.sleep(0.2)
        sys.exit(0)
    print("log line")
    print(json.dumps({"runtime_s": 20.0 / nodes, "records": 5}))
"""


def launcher(tmp_path: Path, **options: Any) -> tuple[CloudLaunchTarget, Path]:
    script = tmp_path / "cluster.py"
    script.write_text(LAUNCHER, encoding="utf-8")
    log = tmp_path / "steps.log"
    base = [sys.executable, str(script), str(log)]
    settings: dict[str, Any] = {
        "provision": [*base, "up", "{instance_type}", "{nodes}"],
        "command": [*base, "run", "{instance_type}", "{nodes}"],
        "teardown": [*base, "down", "{instance_type}"],
        "deadline_s": 3.0,
        "timeout_s": 10.0,
    }
    settings.update(options)
    target = build_target("cloud_launch", settings)
    assert isinstance(target, CloudLaunchTarget)
    return target, log


def test_the_launcher_provisions_runs_and_tears_down_each_deployment(tmp_path: Path) -> None:
    target, log = launcher(tmp_path)
    with target:
        outcome = target.run_trial({"family": "m4", "size": "xlarge", "nodes": 8})
    assert outcome.status is TrialStatus.COMPLETED
    assert outcome.metrics["runtime_s"] == 2.5 and outcome.metrics["records"] == 5
    assert outcome.metrics["cost_usd"] == pytest.approx(0.2 * 8 * 2.5 / 3600)
    assert log.read_text().splitlines() == ["up m4.xlarge 8", "run m4.xlarge 8", "down m4.xlarge"]


def test_without_printed_metrics_the_wall_time_is_the_runtime(tmp_path: Path) -> None:
    target, _ = launcher(tmp_path)
    outcome = target.run_trial({"family": "c4", "size": "large", "nodes": 6})
    assert outcome.status is TrialStatus.COMPLETED
    assert 0.2 <= outcome.metrics["runtime_s"] < 3.0
    assert outcome.metrics["cost_usd"] == pytest.approx(
        0.1 * 6 * outcome.metrics["runtime_s"] / 3600
    )


def test_a_run_past_the_deadline_is_infeasible_and_killed(tmp_path: Path) -> None:
    target, log = launcher(tmp_path, deadline_s=1.0)
    start = time.monotonic()
    outcome = target.run_trial({"family": "m4", "size": "large", "nodes": 4})
    assert time.monotonic() - start < 10
    assert outcome.status is TrialStatus.INFEASIBLE and "deadline" in outcome.reason
    assert log.read_text().splitlines()[-1] == "down m4.large"  # torn down all the same


def test_a_reported_runtime_past_the_deadline_is_infeasible(tmp_path: Path) -> None:
    target, _ = launcher(tmp_path, deadline_s=2.0)
    outcome = target.run_trial({"family": "m4", "size": "xlarge", "nodes": 8})
    assert outcome.status is TrialStatus.INFEASIBLE and "took 2.5 s" in outcome.reason


def test_a_launcher_failure_is_failed_and_teardown_still_runs(tmp_path: Path) -> None:
    target, log = launcher(tmp_path)
    outcome = target.run_trial({"family": "c4", "size": "2xlarge", "nodes": 8})
    assert outcome.status is TrialStatus.FAILED and "exit status 2" in outcome.reason
    outcome = target.run_trial({"family": "r4", "size": "large", "nodes": 8})
    assert outcome.status is TrialStatus.FAILED and "provision" in outcome.reason
    assert log.read_text().splitlines()[-1] == "down r4.large"


def test_a_failed_teardown_stops_the_session(tmp_path: Path) -> None:
    target, _ = launcher(tmp_path, teardown=[sys.executable, "-c", "import sys; sys.exit(1)"])
    with pytest.raises(Exception, match="teardown"):
        target.run_trial({"family": "m4", "size": "xlarge", "nodes": 8})


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"command": "run.sh {nodes}"}, "target.command"),
        ({"command": ["run.sh", "{zone}"]}, "target.command[1]"),
        ({"command": ["run.sh"], "deadline_s": 0}, "target.deadline_s"),
        ({"command": ["run.sh"], "teardown": ["down", "{cores}"]}, "target.teardown[1]"),
    ],
)
def test_launcher_options_are_checked(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build_target("cloud_launch", options)
    assert caught.value.field == field


def test_metrics_are_read_from_the_last_json_line(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "print('{\"runtime_s\": 1.0}')\nprint('{\"runtime_s\": 2.0}')\nprint('done')\n"
    )
    target = CloudLaunchTarget(command=[sys.executable, str(script)])
    outcome = target.run_trial({"family": "m4", "size": "large", "nodes": 4})
    assert outcome.metrics["runtime_s"] == 2.0


def test_phases_cannot_split_a_candidate_list(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_config(
            {
                "study": {
                    "name": "cloud",
                    "objectives": [{"name": "cost_usd", "goal": "minimize"}],
                },
                "target": {"kind": "cloud_replay", "workload": WORKLOAD, "table": str(TABLE)},
                "session": {
                    "db": str(tmp_path / "t.db"),
                    "phases": [
                        {"knobs": ["family", "size"], "trials": 5},
                        {"knobs": ["nodes"], "trials": 5},
                    ],
                },
            },
            {},
        )
    assert caught.value.field == "session.phases"


C5 = """
description = "a user's catalog: the c5 family"
default = { family = "c5", size = "large", nodes = 2 }
[node_counts]
large = [2, 4]
[[instances]]
family = "c5"
size = "large"
vcpus = 2
memory_gib = 4.0
price_usd_per_hour = 0.085
"""


def c5_table(path: Path) -> Path:
    """The default table's first runs of the workload, with a c5 deployment added."""
    with TABLE.open(newline="") as src, path.open("w", newline="") as dst:
        reader = csv.DictReader(src)
        writer = csv.DictWriter(dst, reader.fieldnames or [])
        writer.writeheader()
        first = next(r for r in reader if r["workload"] == WORKLOAD)
        writer.writerow(first)
        writer.writerow({**first, "family": "c5", "size": "large", "num_nodes": "2"})
    return path


def test_a_table_with_instance_types_the_catalog_lacks_names_them(tmp_path: Path) -> None:
    table = c5_table(tmp_path / "lookup.csv")
    with pytest.raises(ValidationError) as caught:
        CloudReplayTarget(workload=WORKLOAD, table=str(table))
    assert caught.value.field == "target.table"
    assert "c5.large x 2" in str(caught.value) and "c4.large" in str(caught.value.allowed)


def test_a_users_catalog_file_covers_its_own_instance_types(tmp_path: Path) -> None:
    catalog = tmp_path / "aws_c5.toml"
    catalog.write_text(C5, encoding="utf-8")
    loaded = load_cloud_catalog(str(catalog))
    assert [i.family for i in loaded.instances] == ["c5"] and loaded.name == "aws_c5"
    table = tmp_path / "lookup.csv"
    with table.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["workload", "family", "size", "num_nodes", "runtime_s", "cost_usd",
                         "completed"])  # fmt: skip
        writer.writerow(["w", "c5", "large", "2", "100", "0.5", "True"])
        writer.writerow(["w", "c5", "large", "4", "60", "0.6", "True"])
    target = build_target("cloud_replay", {"workload": "w", "table": str(table),
                                           "catalog": str(catalog)})  # fmt: skip
    assert len(target.describe_candidates()) == 2
    # one family and one size: no knob for either, every trial gets the default's
    assert [k.name for k in target.describe_knobs()] == ["nodes"]
    config = parse_config(
        {"study": {"name": "c5", "objectives": [{"name": "runtime_s", "goal": "minimize"}]},
         "target": {"kind": "cloud_replay", "workload": "w", "table": str(table),
                    "catalog": str(catalog)},
         "session": {"db": str(tmp_path / "t.db")}},
        {},
    )  # fmt: skip
    assert config.spec.space.names == ("nodes",) and len(config.spec.candidates) == 2
    with config.target as started:
        outcome = started.run_trial({"nodes": 4})
    assert outcome.metrics["runtime_s"] == 60.0
    with pytest.raises(ValidationError) as caught:
        load_cloud_catalog(str(tmp_path / "missing.toml"))
    assert caught.value.field == "target.catalog" and "aws_2017" in str(caught.value.allowed)


def test_the_cloud_benchmark_names_an_uncatalogued_table_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import cloud

    c5_table(tmp_path / "cloud_config_lookup.csv")
    code = cloud.main(["--data", str(tmp_path), "--seeds", "1", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "c5.large x 2" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "change, field, message",
    [
        (
            lambda t: t.replace('default = { family = "c5", size = "large", nodes = 2 }\n', ""),
            "default",
            "got None",
        ),
        (
            lambda t: t.replace("[node_counts]\nlarge = [2, 4]", "node_counts = [2, 4]"),
            "node_counts",
            "got [2, 4]",
        ),
        (
            lambda t: t.replace("large = [2, 4]", "large = [2]"),
            "instances",
            "offers one deployment",
        ),
    ],
)
def test_a_catalog_file_that_does_not_hold_together_names_the_file_and_the_key(
    tmp_path: Path, change: Any, field: str, message: str
) -> None:
    catalog = tmp_path / "aws_c5.toml"
    catalog.write_text(change(C5), encoding="utf-8")
    with pytest.raises(ValidationError) as caught:
        load_cloud_catalog(str(catalog))
    assert caught.value.field == f"{catalog}: {field}" and message in caught.value.message


def test_a_table_says_completed_as_1_0_true_or_false_and_anything_else_is_named(
    tmp_path: Path,
) -> None:
    table = tmp_path / "lookup.csv"
    header = "workload,family,size,num_nodes,runtime_s,cost_usd,completed\n"
    table.write_text(header + "w,c4,large,4,100,0.5,yes\n", encoding="utf-8")
    with pytest.raises(ValidationError) as caught:
        CloudReplayTarget(workload="w", table=str(table))
    assert caught.value.field == "target.table" and "line 2: completed is 'yes'" in str(
        caught.value
    )
    table.write_text(header + "w,c4,large,4,100\n", encoding="utf-8")  # a short row
    with pytest.raises(ValidationError) as caught:
        CloudReplayTarget(workload="w", table=str(table))
    assert "line 2" in str(caught.value)
