"""Scale-out on Ray Tune: a real local Ray instance runs trials the tuner server proposes.

``tuner ray`` runs in its own process: Ray starts first (before any gRPC server of the
process: see ``runner.raytune.local_ray``), then a tuner server on 127.0.0.1; trials run
``examples/ray_sort.py`` through the command target, two at a time.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from runner.config import load_config
from runner.raytune import TunerSearch, outcome_of
from server.app import build_server, stop_server
from server.service import LeasePolicy, TuningService
from server.storage import SQLiteStorage
from tuner.trial import TrialStatus

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, SQLiteStorage]]:
    storage = SQLiteStorage(tmp_path / "tuner.db")
    service = TuningService(storage, leases=LeasePolicy(600))
    grpc_server, port = build_server(service)
    grpc_server.start()
    yield f"127.0.0.1:{port}", storage
    stop_server(grpc_server, None).wait()
    storage.close()


def example(tmp_path: Path) -> Any:
    return load_config(REPO / "examples" / "ray_sort.toml", {"db": tmp_path / "x.db"})


@pytest.mark.slow
def test_tuner_ray_runs_the_studys_trials_in_parallel(tmp_path: Path) -> None:
    """``tuner ray`` as a user runs it: its own process, so Ray's daemons never fork from a
    process that already runs gRPC threads (pytest's, after the server tests), and all of
    them are gone when the command exits."""
    text = (REPO / "examples" / "ray_sort.toml").read_text()
    config = tmp_path / "ray_sort.toml"
    config.write_text(text.replace('db = "runs/tuner.db"', f'db = "{tmp_path / "tuner.db"}"'))
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "ray", str(config), "--parallel", "2",
         "--trials", "4"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    storage = SQLiteStorage(tmp_path / "tuner.db")
    try:
        trials = storage.list_trials("ray-sort")
    finally:
        storage.close()
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 4
    assert all(t.metrics["mb_per_s"] > 0 for t in trials)
    assert len({t.client_id for t in trials}) == 4
    assert all(t.client_id.startswith("ray:") for t in trials)
    assert len({(t.config["kind"], t.config["block_kb"]) for t in trials}) == 4
    assert (tmp_path / "ray").is_dir()  # Ray's own results, beside the study's database


def test_the_searcher_pickles_and_restores_from_its_checkpoint(
    server: tuple[str, SQLiteStorage], tmp_path: Path
) -> None:
    address, storage = server
    search = TunerSearch(address, example(tmp_path).spec)
    assert (search.metric, search.mode) == ("mb_per_s", "max")
    assert search.set_search_properties("mb_per_s", "max", {})
    assert not search.set_search_properties("latency", "min", {})
    config = search.suggest("abc")
    assert config is not None and set(config) == {"kind", "block_kb"}
    again = search.suggest("abc")  # a retried suggestion gets the same trial
    assert again == config
    copy = pickle.loads(pickle.dumps(search))  # what Ray does with a searcher
    search.save(str(tmp_path / "ckpt"))
    search.close()
    restored = copy
    restored.restore(str(tmp_path / "ckpt"))
    restored.on_trial_result("abc", {"mb_per_s": 1.0})  # renews the lease
    restored.on_trial_complete("abc", {"mb_per_s": 123.0, "tuner_status": "COMPLETED"})
    [trial] = storage.list_trials("ray-sort")
    assert trial.status is TrialStatus.COMPLETED and trial.metrics == {"mb_per_s": 123.0}
    assert trial.client_id == "ray:abc"
    restored.on_trial_complete("never-suggested", {"mb_per_s": 1.0})  # ignored
    restored.close()


@pytest.mark.parametrize(
    ("result", "error", "status", "words"),
    [
        ({"mb_per_s": 5.0}, False, TrialStatus.COMPLETED, ""),
        ({"mb_per_s": 5.0}, True, TrialStatus.FAILED, "raised"),
        (None, False, TrialStatus.FAILED, "raised"),
        ({"other": 1.0}, False, TrialStatus.FAILED, "reported no 'mb_per_s'"),
        ({"tuner_status": "INFEASIBLE", "tuner_reason": "exit 3"}, False,
         TrialStatus.INFEASIBLE, "exit 3"),
    ],
)  # fmt: skip
def test_a_finished_ray_trial_is_reported_with_the_right_status(
    result: dict[str, Any] | None, error: bool, status: TrialStatus, words: str
) -> None:
    got, reason, _ = outcome_of(result, error, ("mb_per_s",), "t1")
    assert got is status and words in reason
