"""Retried writes: a request id makes SuggestTrials and CompleteTrial safe to repeat, and
``TunerClient`` retries UNAVAILABLE with backoff, over a real server on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.app import build_server, stop_server
from server.client import TunerClient
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.errors import StateError, StorageError
from tuner.space import FloatKnob, SearchSpace
from tuner.study import DesignerSettings, Goal, Objective, StudySpec
from tuner.trial import Trial, TrialStatus

SPEC = StudySpec(
    name="retried",
    space=SearchSpace((FloatKnob("x", low=0.0, high=1.0, default=0.5),)),
    objectives=(Objective("y", Goal.MINIMIZE),),
    designer=DesignerSettings(algorithm="sobol", seed=1, start_with_default=False),
)


class LosesReplies(TuningService):
    """Stores each write, then fails the reply of the first ``lost`` calls with UNAVAILABLE:
    the client cannot know whether its write happened."""

    def __init__(self, storage: SQLiteStorage, lost: int) -> None:
        super().__init__(storage)
        self.lost = lost
        self.calls = 0

    def _maybe_lose(self) -> None:
        self.calls += 1
        if self.calls <= self.lost:
            raise StorageError("connection reset after commit")

    def suggest_trials(self, *args: Any, **kwargs: Any) -> list[Trial]:
        trials = super().suggest_trials(*args, **kwargs)
        self._maybe_lose()
        return trials

    def complete_trial(self, *args: Any, **kwargs: Any) -> Trial:
        trial = super().complete_trial(*args, **kwargs)
        self._maybe_lose()
        return trial


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[SQLiteStorage]:
    with SQLiteStorage(tmp_path / "tuner.db") as opened:
        yield opened


def serve(service: TuningService, port: int = 0) -> tuple[grpc.Server, str]:
    server, bound = build_server(service, "127.0.0.1", port)
    server.start()
    return server, f"127.0.0.1:{bound}"


def test_a_retried_request_is_answered_as_before_and_stores_nothing_twice(
    storage: SQLiteStorage,
) -> None:
    service = TuningService(storage)
    server, target = serve(service)
    try:
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.TunerServiceStub(channel)
            TunerClient(target).create_study(SPEC)
            ask = pb.SuggestTrialsRequest(study="retried", count=2, request_id="r-1")
            first = stub.SuggestTrials(ask)
            again = stub.SuggestTrials(ask)
            assert [t.id for t in again.trials] == [t.id for t in first.trials] == [1, 2]
            assert len(storage.list_trials("retried")) == 2
            tell = pb.CompleteTrialRequest(
                study="retried", trial_id=1, metrics={"y": 0.5},
                status=pb.TRIAL_OUTCOME_COMPLETED, request_id="r-2",
            )  # fmt: skip
            done = stub.CompleteTrial(tell)
            assert stub.CompleteTrial(tell) == done
            events = [e.event for e in storage.trial_events("retried", 1)]
            assert events == ["created", "status:COMPLETED"]
            # without a request id a repeat is refused: the trial is already finished
            tell.request_id = ""
            with pytest.raises(grpc.RpcError) as caught:
                stub.CompleteTrial(tell)
            assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            # an id reused for another request is named
            other = pb.CompleteTrialRequest(
                study="retried", trial_id=2, metrics={"y": 0.7},
                status=pb.TRIAL_OUTCOME_COMPLETED, request_id="r-2",
            )  # fmt: skip
            with pytest.raises(grpc.RpcError) as caught:
                stub.CompleteTrial(other)
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "request_id" in caught.value.details()
            assert storage.get_trial("retried", 2).status is TrialStatus.ACTIVE
    finally:
        stop_server(server, None).wait()


def test_the_client_retries_a_lost_reply_without_a_second_trial_or_a_second_result(
    storage: SQLiteStorage,
) -> None:
    service = LosesReplies(storage, lost=0)
    server, target = serve(service)
    try:
        with TunerClient(target, retry_for=10) as client:
            client.create_study(SPEC)
            service.calls, service.lost = 0, 1
            [trial] = client.suggest_trials("retried", 1)  # anonymous: no client id
            assert service.calls == 2 and len(storage.list_trials("retried")) == 1
            service.calls, service.lost = 0, 2
            done = client.complete_trial("retried", trial.id, {"y": 0.25})
            assert service.calls == 3 and done.status is TrialStatus.COMPLETED
            assert done.metrics == {"y": 0.25}
            with pytest.raises(StateError):  # a new request, not a retry
                client.complete_trial("retried", trial.id, {"y": 0.25})
    finally:
        stop_server(server, None).wait()


def test_the_client_waits_for_a_server_that_comes_up_late(storage: SQLiteStorage) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    service = TuningService(storage)
    started: list[grpc.Server] = []

    def start_later() -> None:
        time.sleep(1.0)
        started.append(serve(service, port)[0])

    thread = threading.Thread(target=start_later)
    thread.start()
    try:
        with TunerClient(f"127.0.0.1:{port}", retry_for=20) as client:
            begun = time.monotonic()
            _, created = client.create_study(SPEC)
            assert created and time.monotonic() - begun >= 0.9
    finally:
        thread.join()
        for server in started:
            stop_server(server, None).wait()


def test_the_client_gives_up_after_retry_for(storage: SQLiteStorage) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with TunerClient(f"127.0.0.1:{port}", retry_for=1.0) as client:
        begun = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            client.list_studies()
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        assert 0.5 <= time.monotonic() - begun < 5
