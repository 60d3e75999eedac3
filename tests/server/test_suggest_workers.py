"""The designer apart from the API: worker processes, one run per study for concurrent
callers, RESOURCE_EXHAUSTED when too many wait, and time judged at arrival.

``Gate`` runs the real designer (in the calling thread) but holds each run until the test
lets it go, so a test can arrange what arrives while a fit is in progress.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server.app import build_server, max_waiting, stop_server
from server.client import TunerClient
from server.service import ImportedTrial, LeasePolicy, TuningService
from server.storage import SQLiteStorage
from server.suggest import InlineDesigner, WorkerPool
from tuner.designer import FitCache, Suggestion
from tuner.errors import OverloadedError, TunerError
from tuner.space import FloatKnob, IntKnob, SearchSpace
from tuner.study import DesignerSettings, Goal, Objective, StudySpec
from tuner.transfer import SourceStudy
from tuner.trial import StepKind, Trial, TrialStatus


def spec(name: str = "s", algorithm: str = "sobol") -> StudySpec:
    return StudySpec(
        name=name,
        space=SearchSpace(
            (FloatKnob("x", low=0.0, high=1.0, default=0.5), IntKnob("n", low=1, high=64))
        ),
        objectives=(Objective("y", Goal.MAXIMIZE),),
        designer=DesignerSettings(algorithm=algorithm, seed=3, initial_trials=4),
    )


def history(count: int) -> list[ImportedTrial]:
    """Measured trials of ``spec()``: y peaks at x = 0.3."""
    return [
        ImportedTrial({"x": i / count, "n": 1 + i}, metrics={"y": -((i / count - 0.3) ** 2)})
        for i in range(count)
    ]


class Gate(InlineDesigner):
    """The real designer, each run held until ``release`` (and recorded)."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, list[int]]] = []  # (count, ids of the trials it saw)
        self.started = threading.Semaphore(0)
        self._open = threading.Event()

    def propose(
        self,
        spec: StudySpec,
        trials: Sequence[Trial],
        count: int,
        cache: FitCache,
        salt: int = 0,
        sources: Sequence[SourceStudy] = (),
    ) -> list[Suggestion]:
        self.runs.append((count, [t.id for t in trials]))
        self.started.release()
        assert self._open.wait(30), "the test never released the designer"
        return super().propose(spec, trials, count, cache, salt, sources)

    def release(self) -> None:
        self._open.set()

    def retry_after(self) -> float:
        return 0.3


def in_thread(call: Callable[..., Any], *args: object) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call(*args))
        except Exception as error:  # the test inspects it
            out.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def waiting(service: TuningService, study: str, calls: int) -> None:
    """Wait until ``calls`` calls are queued for the study's next designer run."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        with service._asking:
            queue = service._queues.get(study)
            if queue is not None and len(queue.waiting) >= calls:
                return
        time.sleep(0.01)
    raise AssertionError(f"{calls} calls never queued")


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[TuningService, Gate]]:
    gate = Gate()
    service = TuningService(SQLiteStorage(tmp_path / "t.db"), designer=gate, max_waiting=4)
    service.create_study(spec())
    yield service, gate
    gate.release()
    service.close()


def test_concurrent_callers_share_one_designer_run(gated: tuple[TuningService, Gate]) -> None:
    service, gate = gated
    first, first_out = in_thread(service.suggest_trials, "s", 1, "a")
    assert gate.started.acquire(timeout=10)
    others = [in_thread(service.suggest_trials, "s", 2, c) for c in ("b", "c", "d")]
    waiting(service, "s", 3)
    gate.release()
    for thread, _ in [(first, first_out), *others]:
        thread.join(30)
    assert [count for count, _ in gate.runs] == [1, 6], "the three waiting calls share one run"
    (a,) = first_out[0]
    assert gate.runs[1][1] == [a.id], "the second run saw the first run's trial as pending"
    got = {c: out[0] for c, (_, out) in zip("bcd", others, strict=True)}
    assert all(len(trials) == 2 for trials in got.values())
    ids = [t.id for trials in got.values() for t in trials] + [a.id]
    assert len(set(ids)) == 7
    stored = service.list_trials("s")
    assert {t.id: t.client_id for t in stored} == {
        t.id: c for c, trials in [("a", [a]), *got.items()] for t in trials
    }
    assert len({tuple(sorted(t.config.items())) for t in stored}) == 7


def test_a_clients_second_call_waits_for_its_first_and_gets_the_same_trial(
    gated: tuple[TuningService, Gate],
) -> None:
    service, gate = gated
    first, first_out = in_thread(service.suggest_trials, "s", 1, "a")
    assert gate.started.acquire(timeout=10)
    second, second_out = in_thread(service.suggest_trials, "s", 1, "a")
    time.sleep(0.2)
    gate.release()
    first.join(30)
    second.join(30)
    assert [t.id for t in first_out[0]] == [t.id for t in second_out[0]]
    assert len(gate.runs) == 1 and len(service.list_trials("s")) == 1


def test_too_many_waiting_calls_are_refused_with_a_retry_delay(
    gated: tuple[TuningService, Gate],
) -> None:
    service, gate = gated
    threads = [in_thread(service.suggest_trials, "s", 1, f"w{i}") for i in range(4)]
    waiting(service, "s", 3)  # one leads the run, three wait for the next
    with pytest.raises(OverloadedError, match="at most 4") as refused:
        service.suggest_trials("s", 1, "late")
    assert refused.value.retry_after_s == pytest.approx(0.3)
    assert len(service.list_trials("s")) == 0, "the refused call did nothing"
    gate.release()
    for thread, _ in threads:
        thread.join(30)
    assert len(service.suggest_trials("s", 1, "late")) == 1


def test_completions_are_not_queued_behind_a_fit_and_leases_count_from_arrival(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    gate = Gate()
    service = TuningService(
        SQLiteStorage(tmp_path / "t.db"),
        designer=gate,
        leases=LeasePolicy(ttl_s=10),
        clock=lambda: now[0],
    )
    service.create_study(spec())
    try:
        gate.release()
        (held,) = service.suggest_trials("s", 1, "a")  # lease until 1010
        gate._open.clear()
        busy, _ = in_thread(service.suggest_trials, "s", 1, "b")
        assert gate.started.acquire(timeout=10) and gate.started.acquire(timeout=10)
        begun = time.monotonic()
        done = service.complete_trial("s", held.id, {"y": 1.0})
        assert time.monotonic() - begun < 1.0, "CompleteTrial waited for the fit"
        assert done.status is TrialStatus.COMPLETED and not done.reported_late

        # A completion that arrived in time but waited for the study: judged at arrival.
        gate.release()
        busy.join(30)
        (trial,) = service.suggest_trials("s", 1, "c")
        lock = service._lock("s")
        lock.acquire()
        finishing, out = in_thread(service.complete_trial, "s", trial.id, {"y": 2.0})
        time.sleep(0.2)  # it arrived at 1000, well within its lease
        now[0] = 2000.0  # the lease ran out while it waited
        lock.release()
        finishing.join(30)
        assert out[0].status is TrialStatus.COMPLETED
        assert not out[0].reported_late
    finally:
        gate.release()
        service.close()


@pytest.fixture
def served_gate(tmp_path: Path) -> Iterator[tuple[str, TuningService, Gate]]:
    gate = Gate()
    service = TuningService(SQLiteStorage(tmp_path / "t.db"), designer=gate, max_waiting=1)
    service.create_study(spec())
    server, port = build_server(service)
    server.start()
    yield f"127.0.0.1:{port}", service, gate
    gate.release()
    stop_server(server, None).wait()
    service.close()


def test_over_grpc_a_refused_call_is_resource_exhausted_and_the_client_waits_and_retries(
    served_gate: tuple[str, TuningService, Gate],
) -> None:
    target, service, gate = served_gate
    with (
        TunerClient(target, timeout=30, retry_for=0) as impatient,
        TunerClient(target, timeout=30, retry_for=30) as patient,
    ):
        first, first_out = in_thread(impatient.suggest_trials, "s", 1, "a")
        assert gate.started.acquire(timeout=10)
        with pytest.raises(OverloadedError) as refused:
            impatient.suggest_trials("s", 1, "b")
        assert refused.value.retry_after_s == pytest.approx(0.3)
        assert isinstance(refused.value.__cause__, grpc.RpcError)
        assert refused.value.__cause__.code() is grpc.StatusCode.RESOURCE_EXHAUSTED

        # Health and reads answer while the fit runs and every suggestion slot is taken.
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(target))
        begun = time.monotonic()
        reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert patient.list_trials("s") == []
        assert time.monotonic() - begun < 1.0

        second, second_out = in_thread(patient.suggest_trials, "s", 1, "b")
        time.sleep(1.0)  # refused at least once, waiting to retry
        gate.release()
        first.join(30)
        second.join(30)
    assert len(first_out[0]) == 1 and len(second_out[0]) == 1
    assert len(service.list_trials("s")) == 2


def test_the_clients_timeout_is_honoured_as_given(
    served_gate: tuple[str, TuningService, Gate],
) -> None:
    target, _, gate = served_gate
    threading.Timer(2.0, gate.release).start()
    with TunerClient(target, timeout=20, retry_for=0.5) as client:
        begun = time.monotonic()
        (trial,) = client.suggest_trials("s", 1, "a")
    assert time.monotonic() - begun >= 1.9  # it waited past retry_for, up to its timeout
    assert trial.status is TrialStatus.ACTIVE


def test_max_waiting_leaves_threads_for_everything_else() -> None:
    assert max_waiting(64) == 48
    assert max_waiting(8) == 6
    assert max_waiting(2) == 1


# -- the worker processes ------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    workers = WorkerPool(1)
    workers.warm()
    yield workers
    workers.close()


def test_a_worker_process_suggests_what_the_calling_thread_would(
    tmp_path: Path, pool: WorkerPool
) -> None:
    answers = []
    for designer, where in ((InlineDesigner(), "inline"), (pool, "pool")):
        service = TuningService(SQLiteStorage(tmp_path / f"{where}.db"), designer=designer)
        service.create_study(spec(algorithm="bo"))
        service.import_trials("s", history(8))
        answers.append([t.config for t in service.suggest_trials("s", 2, "w")])
        service.complete_trial("s", 9, {"y": -0.01})
        answers.append([t.config for t in service.suggest_trials("s", 1, "w")])
        assert service.fit_cache.export("s"), "the fitted hyperparameters came back"
        service.storage.close()
    assert answers[:2] == answers[2:]


def test_a_dead_worker_is_replaced_and_the_request_answered(
    tmp_path: Path, pool: WorkerPool
) -> None:
    service = TuningService(SQLiteStorage(tmp_path / "t.db"), designer=pool)
    service.create_study(spec(algorithm="bo"))
    service.import_trials("s", history(6))
    pid = pool._executor.submit(os.getpid).result(timeout=60)
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    (trial,) = service.suggest_trials("s", 1, "w")
    assert trial.status is TrialStatus.ACTIVE
    assert pool._executor.submit(os.getpid).result(timeout=60) != pid
    service.storage.close()


def test_quasi_random_studies_never_wait_for_the_workers(tmp_path: Path) -> None:
    """Sobol points are computed in the calling thread: a study that never fits a model
    is answered even when no worker can run (here: the pool is shut down; in a server that
    just started, its workers are still importing torch), while a BO study needs one."""
    workers = WorkerPool(1)
    workers.close()
    service = TuningService(SQLiteStorage(tmp_path / "t.db"), designer=workers)
    service.create_study(spec("quasi", algorithm="sobol"))
    service.create_study(spec("model", algorithm="bo"))
    service.import_trials("model", history(6))
    trials = service.suggest_trials("quasi", 3, "w")
    assert [t.step for t in trials] == [StepKind.SOBOL] * 3
    with pytest.raises(TunerError, match="shut down"):
        service.suggest_trials("model", 1, "w")
    service.storage.close()


def test_closing_the_service_ends_a_waiting_suggestion_with_an_error(tmp_path: Path) -> None:
    workers = WorkerPool(1)
    service = TuningService(SQLiteStorage(tmp_path / "t.db"), designer=workers)
    service.create_study(spec(algorithm="bo"))
    service.import_trials("s", history(6))
    call, out = in_thread(service.suggest_trials, "s", 1, "w")
    time.sleep(0.5)  # the worker is starting or fitting
    begun = time.monotonic()
    service.close()
    call.join(30)
    assert time.monotonic() - begun < 6
    assert isinstance(out[0], TunerError)
    assert "shut down" in str(out[0]) or "terminated" in str(out[0]).lower()


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def test_the_workers_of_a_killed_server_end_with_it(tmp_path: Path) -> None:
    """SIGKILL gives the server no chance to stop its workers: they watch for it."""
    import subprocess
    import sys

    tuner = Path(sys.executable).with_name("tuner")
    server = subprocess.Popen(
        [str(tuner), "serve", "--db", str(tmp_path / "t.db"), "--port", "0",
         "--suggest-workers", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        end = time.monotonic() + 60
        while len(children := _children(server.pid)) < 2:  # the workers (and a tracker)
            assert time.monotonic() < end, "the server never started its workers"
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        server.kill()
        server.wait(30)
    end = time.monotonic() + 20
    while alive := [c for c in children if Path(f"/proc/{c}").exists()]:
        assert time.monotonic() < end, f"workers outlived their server: {alive}"
        time.sleep(0.2)
