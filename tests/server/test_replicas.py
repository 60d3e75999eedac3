"""Two tuner servers on one PostgreSQL database, as replicas behind one client.

Real gRPC on 127.0.0.1, two ``TuningService`` instances, each on its own
``PostgresStorage`` of one database. Workers talk to both through one ``TunerClient``
given both addresses; one replica is stopped in the middle of the run. Every trial goes
to one worker, every acknowledged completion is stored once with its value, and a request
retried on the other replica is answered as the first time. (The SIGKILL variant with
``tuner serve`` processes is in ``test_faults.py``.)
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server.app import build_server, stop_server
from server.client import TunerClient
from server.service import LeasePolicy, TuningService
from server.storage.postgres import PostgresStorage
from server.suggest import InlineDesigner
from tuner.designer import Suggestion
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

SPEC = StudySpec.from_dict(
    {
        "name": "replicas",
        "knobs": [
            {"name": "x", "kind": "float", "low": 0.0, "high": 1.0},
            {"name": "n", "kind": "int", "low": 1, "high": 1000},
        ],
        "objectives": [{"name": "y", "goal": "minimize"}],
        "designer": {"algorithm": "sobol", "seed": 4, "start_with_default": False},
    }
)
WORKERS = 6
CYCLES = 10


class Replica:
    """A tuner server in this process over its own connections to the shared database."""

    def __init__(self, url: str) -> None:
        self.service = TuningService(PostgresStorage(url), leases=LeasePolicy(60, "reoffer"))
        self.server, port = build_server(self.service, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{port}"
        self.server.start()
        self.stopped = False

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            stop_server(self.server, 2).wait()
            self.service.close()
            self.service.storage.close()


@pytest.fixture
def replicas(postgres_url: str) -> Iterator[list[Replica]]:
    pair = [Replica(postgres_url), Replica(postgres_url)]
    try:
        yield pair
    finally:
        for replica in pair:
            replica.stop()


def test_workers_on_two_replicas_get_distinct_trials_and_lose_no_completion(
    replicas: list[Replica],
) -> None:
    both = ",".join(r.address for r in replicas)
    acknowledged: dict[int, float] = {}
    guard = threading.Lock()
    errors: list[BaseException] = []
    halfway = threading.Barrier(WORKERS + 1)

    def worker(k: int) -> None:
        try:
            with TunerClient(both, timeout=30, retry_for=60) as client:
                for i in range(CYCLES):
                    if i == CYCLES // 2:
                        halfway.wait(timeout=120)  # one replica goes away here
                        halfway.wait(timeout=120)
                    (trial,) = client.suggest_trials("replicas", 1, client_id=f"w{k}")
                    value = float(trial.config["x"]) + k
                    done = client.complete_trial("replicas", trial.id, {"y": value})
                    assert done.status is TrialStatus.COMPLETED
                    with guard:
                        assert trial.id not in acknowledged, "one trial handed out twice"
                        acknowledged[trial.id] = value
        except BaseException as exc:
            errors.append(exc)
            halfway.abort()

    with TunerClient(replicas[0].address) as client:
        client.wait_ready(30)
        client.create_study(SPEC)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(WORKERS)]
    for thread in threads:
        thread.start()
    halfway.wait(timeout=120)
    first_half = dict(acknowledged)
    replicas[0].stop()
    halfway.wait(timeout=120)
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors

    trials = replicas[1].service.list_trials("replicas")
    assert len(trials) == len(acknowledged) == WORKERS * CYCLES
    assert sorted(t.id for t in trials) == list(range(1, WORKERS * CYCLES + 1))
    for trial in trials:
        assert trial.status is TrialStatus.COMPLETED
        assert trial.metrics == {"y": acknowledged[trial.id]}
    holders = Counter(t.client_id for t in trials)
    assert holders == {f"w{k}": CYCLES for k in range(WORKERS)}
    assert len(first_half) >= WORKERS * (CYCLES // 2 - 1)  # before the stop


def test_a_request_retried_on_the_other_replica_is_answered_as_the_first_time(
    replicas: list[Replica],
) -> None:
    a, b = (r.service for r in replicas)
    a.create_study(SPEC)
    (first,) = a.suggest_trials("replicas", 1, client_id="w", request_id="ask-1")
    (again,) = b.suggest_trials("replicas", 1, client_id="w", request_id="ask-1")
    assert again.id == first.id and again.config == first.config
    done = a.complete_trial("replicas", first.id, {"y": 1.0}, request_id="tell-1", client_id="w")
    retried = b.complete_trial("replicas", first.id, {"y": 1.0}, request_id="tell-1", client_id="w")
    assert retried.status is done.status is TrialStatus.COMPLETED
    assert retried.metrics == {"y": 1.0}
    assert len(b.list_trials("replicas")) == 1


class GatedDesigner(InlineDesigner):
    """Suggests as usual once ``go`` is set; ``entered`` tells that a call is waiting."""

    def __init__(self) -> None:
        self.entered, self.go = threading.Event(), threading.Event()

    def propose(self, *args: Any, **kwargs: Any) -> list[Suggestion]:
        self.entered.set()
        assert self.go.wait(30)
        return super().propose(*args, **kwargs)


def test_a_request_retried_while_the_first_replica_still_suggests_gets_one_answer(
    postgres_url: str,
) -> None:
    """The client gave up on replica A (its designer is slow) and asked B with the same
    request id; B answers first. A's late suggestion is dropped and its call answers what
    B answered: one trial, whoever asked."""
    gated = GatedDesigner()
    slow = TuningService(PostgresStorage(postgres_url), designer=gated)
    fast = TuningService(PostgresStorage(postgres_url))
    try:
        fast.create_study(SPEC)
        answers: list[list[Trial]] = []
        first = threading.Thread(
            target=lambda: answers.append(
                slow.suggest_trials("replicas", 2, client_id="w", request_id="ask-1")
            )
        )
        first.start()
        assert gated.entered.wait(30)
        retried = fast.suggest_trials("replicas", 2, client_id="w", request_id="ask-1")
        gated.go.set()
        first.join(30)
        assert [t.id for t in answers[0]] == [t.id for t in retried] == [1, 2]
        assert [t.id for t in fast.list_trials("replicas")] == [1, 2]
    finally:
        gated.go.set()
        for service in (slow, fast):
            service.close()
            service.storage.close()


@pytest.fixture
def serve_replicas(postgres_url: str, tmp_path: Path) -> Iterator[list[str]]:
    """Two ``tuner serve`` processes on one PostgreSQL database; their addresses."""
    procs, files = [], [tmp_path / f"port-{i}" for i in range(2)]
    for i, port_file in enumerate(files):
        argv = [sys.executable, "-m", "cli.main", "serve", "--db", postgres_url, "--port", "0",
                "--port-file", str(port_file), "--suggest-workers", "0"]  # fmt: skip
        with (tmp_path / f"serve-{i}.log").open("wb") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
    try:
        end = time.monotonic() + 120
        while not all(f.exists() for f in files):
            assert all(p.poll() is None for p in procs), "a replica exited at start"
            assert time.monotonic() < end, "the replicas did not start"
            time.sleep(0.1)
        yield [f"127.0.0.1:{f.read_text().strip()}" for f in files]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


@pytest.mark.parametrize("algorithm", ["sobol", "random"])
def test_workers_on_two_serve_processes_never_measure_one_configuration_twice(
    serve_replicas: list[str], algorithm: str
) -> None:
    """Each replica computes the next Sobol point or random draw from the trials it reads;
    two reading at once compute the same one. Storage refuses the second copy and that
    replica suggests again (before: 47 distinct configurations of 64 Sobol trials)."""
    spec = StudySpec.from_dict({**SPEC.to_dict(), "designer": {
        "algorithm": algorithm, "seed": 4, "start_with_default": True}})  # fmt: skip
    workers, cycles, errors = 16, 4, []

    def worker(k: int) -> None:
        try:
            with TunerClient(serve_replicas[k % 2], timeout=30, retry_for=60) as client:
                for _ in range(cycles):
                    (trial,) = client.suggest_trials("replicas", 1, client_id=f"w{k}")
                    client.complete_trial("replicas", trial.id, {"y": float(trial.config["x"])})
        except BaseException as exc:
            errors.append(exc)

    with TunerClient(serve_replicas[0]) as client:
        client.wait_ready(60)
        client.create_study(spec)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert not errors, errors
        trials = client.list_trials("replicas")
    assert len(trials) == workers * cycles
    configs = Counter(tuple(sorted(t.config.items())) for t in trials)
    assert [c for c, n in configs.items() if n > 1] == []
