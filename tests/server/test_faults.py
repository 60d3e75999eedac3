"""Faults: SIGKILL at random moments under load, and a database that cannot be written.

The kill test runs the real ``tuner serve`` on a fixed loopback port, drives a Bayesian
optimization study (every suggestion after the first four a GP fit, in the server's
designer workers) with sixteen worker threads (``TunerClient`` with retries), one of which
takes a trial and vanishes, kills the server with SIGKILL twice at random moments,
restarts it on the same database each time, and then checks the database: every
completion a worker saw acknowledged is stored once with its value, no trial was handed to
two workers, and every trial that was in flight was either completed once or given up by
its lease and re-offered (and, for SQLite, its integrity check passes). It runs twice: one
server on a SQLite file, and two replicas on one PostgreSQL database, half the workers on
each, the kills falling on each in turn.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from server.app import build_server, stop_server
from server.client import TunerClient
from server.service import LeasePolicy, TuningService
from server.storage import SQLiteStorage, open_storage
from tuner.errors import StorageError
from tuner.study import StudySpec
from tuner.trial import TrialStatus

SPEC = StudySpec.from_dict(
    {
        "name": "faults",
        "knobs": [
            {"name": "x", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5},
            {"name": "n", "kind": "int", "low": 1, "high": 1000, "default": 4},
        ],
        "objectives": [{"name": "y", "goal": "minimize"}],
        "designer": {
            "algorithm": "bo", "seed": 5, "start_with_default": False, "initial_trials": 4,
        },
    }
)  # fmt: skip
LEASE_S = 3.0
WORKERS = 16
CYCLES = 4  # worker 0 vanishes in its third cycle
KILLS = 2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """``tuner serve`` on a fixed port, restartable on the same database."""

    def __init__(self, db: str, port: int, log: Path) -> None:
        self.db, self.port, self.log = db, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # one designer process: a server runs at most one designer run per study at a time
        # (server.service), so with the one study a second process would only import torch
        # beside the first after every restart, on a 2-CPU machine slowing both
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "serve", "--db", str(self.db),
                 "--port", str(self.port), "--lease-ttl", str(LEASE_S),
                 "--suggest-workers", "1"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_sigkill_under_load_loses_nothing_and_leaves_no_trial_behind(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        db = str(tmp_path / "faults.db")
        servers = [Server(db, free_port(), tmp_path / "server.log")]
    else:  # two replicas on one database
        db = request.getfixturevalue("postgres_url")
        servers = [Server(db, free_port(), tmp_path / f"server-{i}.log") for i in range(2)]
    addresses = [f"127.0.0.1:{server.port}" for server in servers]
    for server in servers:
        server.start()
    acknowledged: dict[int, float] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    vanished: list[int] = []

    def worker(k: int) -> None:
        try:
            # 30 s per attempt: a restarted server's first suggestion waits for its designer
            # workers to import torch (8 s on a 2-CPU VM, more with two servers restarting)
            with TunerClient(addresses[k % len(addresses)], timeout=30, retry_for=120) as client:
                for i in range(CYCLES):
                    (trial,) = client.suggest_trials("faults", 1, client_id=f"w{k}")
                    if k == 0 and i == 2:
                        vanished.append(trial.id)  # takes a trial and is never heard of again
                        return
                    value = float(trial.config["x"]) + k
                    done = client.complete_trial("faults", trial.id, {"y": value})
                    assert done.status is TrialStatus.COMPLETED
                    with lock:
                        assert trial.id not in acknowledged, "one trial completed twice"
                        acknowledged[trial.id] = value
                    time.sleep(0.02)
        except BaseException as exc:
            errors.append(exc)

    try:
        with TunerClient(addresses[0], retry_for=120) as client:
            client.wait_ready(60)
            client.create_study(SPEC)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(WORKERS)]
        for thread in threads:
            thread.start()
        chance = random.Random(11)
        for kill in range(KILLS):
            # the replicas in turn: each kill lands soon after its victim (re)started, while
            # its workers' calls are in flight, and never on a replica whose workers are done
            victim = servers[kill % len(servers)]
            with TunerClient(f"127.0.0.1:{victim.port}") as watcher:
                watcher.wait_ready(60)  # kill under load, not while the server starts
                time.sleep(chance.uniform(0.2, 1.5))
                victim.kill()
                time.sleep(chance.uniform(0.0, 0.5))
                victim.start()
        for thread in threads:
            thread.join(timeout=300)
        assert not errors, errors
        # the vanished worker's trial: its lease runs out and it is re-offered (perhaps
        # already during the run); whatever is still queued is drained here. Every trial
        # still ACTIVE now was handed to a worker that is gone (no heartbeats here), so
        # wait until each lease has run out (reading the trials expires them), as long as
        # it takes but no longer
        with TunerClient(addresses[-1], retry_for=60) as client:
            deadline = time.monotonic() + LEASE_S + 60
            while client.list_trials("faults", [TrialStatus.ACTIVE]):
                assert time.monotonic() < deadline, "a lease never ran out"
                time.sleep(0.2)
            lost = client.get_trial("faults", vanished[0])
            assert lost.status is TrialStatus.ABANDONED and lost.reoffered_as is not None
            for queued in client.list_trials("faults", [TrialStatus.PENDING]):
                (again,) = client.suggest_trials("faults", 1, client_id="cleanup")
                assert again.id == queued.id
                client.complete_trial("faults", again.id, {"y": 0.0})
                acknowledged[again.id] = 0.0
            copy = client.get_trial("faults", lost.reoffered_as)
            assert copy.config == lost.config and copy.status is TrialStatus.COMPLETED
    finally:
        for server in servers:
            server.stop()

    with open_storage(db, read_only=True) as storage:
        if isinstance(storage, SQLiteStorage):
            assert storage.integrity_check() == "ok"
        trials = {t.id: t for t in storage.list_trials("faults")}
        for trial_id, value in acknowledged.items():
            assert trials[trial_id].status is TrialStatus.COMPLETED
            assert trials[trial_id].metrics == {"y": value}
        completed = [t for t in trials.values() if t.status is TrialStatus.COMPLETED]
        # no completion the workers were not told about; worker 0 completed two trials
        assert len(completed) == len(acknowledged) >= (WORKERS - 1) * CYCLES + 2
        for trial in trials.values():
            history = storage.trial_events("faults", trial.id)
            events = [e.event for e in history]
            assert events.count("status:COMPLETED") <= 1
            handed_out = events.count("status:ACTIVE") + sum(
                e.event == "created" and e.detail.startswith("ACTIVE") for e in history
            )
            assert handed_out <= 1, history  # never handed to two workers
            if trial.status is TrialStatus.COMPLETED:
                continue
            assert trial.status is TrialStatus.ABANDONED, trial
            if trial.expired_at is not None:  # in flight when its worker went away
                assert trials[trial.reoffered_as or 0].config == trial.config
            else:  # a re-offer made unnecessary by the original's late result
                assert "reported its result late" in trial.reason
    logs = "".join(log.read_text() for log in sorted(tmp_path.glob("server*.log")))
    assert "lease expired" in logs
    assert logs.count("tuner serving") == len(servers) + KILLS  # started, and after each kill


# -- a database that cannot be written --------------------------------------------------------


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[tuple[str, SQLiteStorage, Path]]:
    db = tmp_path / "tuner.db"
    storage = SQLiteStorage(db)
    service = TuningService(storage, leases=LeasePolicy(600))
    server, port = build_server(service, "127.0.0.1", 0)
    server.start()
    yield f"127.0.0.1:{port}", storage, db
    stop_server(server, None).wait()
    storage.close()


@pytest.mark.parametrize(
    "failure", ["database or disk is full", "attempt to write a readonly database"]
)
def test_a_write_that_fails_is_unavailable_with_a_log_line_and_the_server_keeps_serving(
    serving: tuple[str, SQLiteStorage, Path],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    failure: str,
) -> None:
    address, storage, _ = serving
    with TunerClient(address, retry_for=0) as client:
        client.create_study(SPEC)
        (trial,) = client.suggest_trials("faults", 1, client_id="w1")
        # the disk fills up or turns read-only: SQLite's own error, raised where it writes
        real = storage._db

        class FullDisk:
            def __getattr__(self, name: str) -> object:
                return getattr(real, name)

            def execute(self, sql: str, *args: object) -> object:
                if sql.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE")):
                    raise sqlite3.OperationalError(failure)
                return real.execute(sql, *args)

        monkeypatch.setattr(storage, "_db", FullDisk())
        with caplog.at_level(logging.WARNING), pytest.raises(StorageError, match=failure):
            client.complete_trial("faults", trial.id, {"y": 1.0})
        logged = [r for r in caplog.records if failure in r.getMessage()]
        assert logged and logged[0].levelno == logging.ERROR
        monkeypatch.undo()
        # nothing was half-written, the server still answers, and the retry succeeds
        assert client.get_trial("faults", trial.id).status is TrialStatus.ACTIVE
        assert client.complete_trial("faults", trial.id, {"y": 1.0}).metrics == {"y": 1.0}
        assert storage.integrity_check() == "ok"


def test_grpc_status_of_a_storage_error_is_unavailable(
    serving: tuple[str, SQLiteStorage, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, storage, _ = serving

    def broken(*args: object, **kwargs: object) -> None:
        raise StorageError("cannot list studies in tuner.db: disk I/O error")

    monkeypatch.setattr(storage, "list_studies", broken)
    channel = grpc.insecure_channel(address)
    from server.api.v1 import tuner_pb2 as pb
    from server.api.v1 import tuner_pb2_grpc as pb_grpc

    with pytest.raises(grpc.RpcError) as caught:
        pb_grpc.TunerServiceStub(channel).ListStudies(pb.ListStudiesRequest())
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "disk I/O error" in caught.value.details()
    channel.close()
