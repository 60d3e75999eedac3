"""bench.load: workers drive a real ``tuner serve`` process over loopback; afterwards the
database holds every acknowledged completion once, and the check fails when it does not."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from bench import load, load_offered


def test_a_small_load_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    code = load.main(
        ["--clients", "6", "--cycles", "4", "--studies", "2", "--peer", "none",
         "--designer", "sobol,bo", "--bo-cycles", "2", "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    sobol, bo = json.loads((tmp_path / "load.json").read_text())["results"]
    for ours, cycles in ((sobol, 4), (bo, 2)):
        check = ours["check"]
        assert check["stored_trials"] == check["completed_stored"] == 6 * cycles
        assert check["lost"] == check["duplicated"] == check["handed_to_two_workers"] == 0
        assert ours["rpcs"]["SuggestTrials"]["calls"] == 6 * cycles + ours["refused"]
        assert ours["health"]["checks"] > 0 and ours["health"]["not_serving"] == 0
    assert bo["one_fit_ms"]["calls"] == 2, "one idle suggestion per study"
    assert bo["warm_up_ms"]["calls"] == 2, "and one per study before the workers start"
    assert (tmp_path / "load.png").stat().st_size > 0


def test_the_check_counts_a_completion_the_database_does_not_hold(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    args = argparse.Namespace(clients=2, cycles=2, studies=1, peer="none", out=tmp_path)
    result = load.run_ours(args, work)
    logs = [load.WorkerLog(completed=[("load-0", 99, (0.1,) * load.KNOBS, 1.0)])]
    fake = load.check_ours(load.stored_rows_sqlite(work / "ours-sobol.db"), logs, args)
    assert fake["lost"] == 1 and fake["duplicated"] == 3  # 4 stored, 1 (other) acknowledged
    assert result["check"]["lost"] == 0


@pytest.mark.parametrize("values", [(0.3,) * 4, (0.0, 1.0, 0.5, 0.3)])
def test_the_made_up_metric_is_zero_only_at_its_optimum(values: tuple[float, ...]) -> None:
    assert (load.metric(values) == 0.0) == (values == (0.3,) * 4)


def test_the_wire_contract_loads_beside_the_generated_code() -> None:
    import server.api.v1.tuner_pb2 as generated  # what the rest of the suite has loaded

    pb, services = load.wire()
    spec = pb.StudySpec(name="x", objectives=[pb.Objective(name="y", goal=pb.GOAL_MINIMIZE)])
    again = generated.StudySpec.FromString(spec.SerializeToString())
    assert again.objectives[0].goal == generated.GOAL_MINIMIZE
    assert callable(services.TunerServiceStub)


def test_the_storage_comparison_runs_every_configuration_each_round(
    tmp_path: Path, postgres_server_url: str
) -> None:
    from bench import load_storage

    code = load_storage.main(
        ["--rounds", "1", "--designer", "sobol", "--clients", "4", "--cycles", "2",
         "--studies", "2", "--pg-url", postgres_server_url, "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    runs = json.loads((tmp_path / "storage.json").read_text())["runs"]
    assert [r["method"] for r in runs] == [
        "ours (sobol)",
        "ours (sobol, postgresql x1)",
        "ours (sobol, postgresql x2)",
    ]
    for run in runs:  # two replicas on one PostgreSQL database among them
        check = run["check"]
        assert check["stored_trials"] == check["completed_stored"] == 8
        assert check["lost"] == check["duplicated"] == check["handed_to_two_workers"] == 0
        assert check["integrity_check"] == "ok"
        assert run["health"]["not_serving"] == 0 and run["server_alive_after"]
    assert runs[2]["replicas"] == 2 and runs[2]["storage"] == "postgresql"
    assert (tmp_path / "storage.png").stat().st_size > 0


def test_offered_load_workers_measure_each_trial_for_the_time_asked(tmp_path: Path) -> None:
    code = load_offered.main(
        ["--rounds", "1", "--think", "0.5", "--clients", "2", "--studies", "1",
         "--bo-cycles", "2", "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    [run] = json.loads((tmp_path / "offered.json").read_text())["runs"]
    assert run["think_s"] == 0.5 and run["check"]["completed_stored"] == 4
    # worker k sleeps its own seeded exponential draws: once before its first call, then
    # between each suggestion and its report
    slept = [sum(np.random.default_rng(k).exponential(0.5) for _ in range(3)) for k in (0, 1)]
    assert run["wall_s"] >= max(slept)
    assert load_offered.ratio(run) > 0 and (tmp_path / "offered.png").stat().st_size > 0


@pytest.mark.parametrize("text", ["-1", "x", "", "1,-2"])
def test_offered_load_rejects_a_bad_think_list(text: str) -> None:
    with pytest.raises(SystemExit):
        load_offered._parser().parse_args(["--think", text])
