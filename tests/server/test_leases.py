"""Trial leases: heartbeats keep a trial, silence gives it up, a late result is stored once.

The service runs over a real SQLite file with a controllable clock; the gRPC checks go
through a real server on 127.0.0.1 and ``TunerClient``; the session checks run a slow
target with a short lease on the real clock.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from unittest.mock import patch

import grpc
import pytest

from runner.session import run_session
from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.app import build_server, stop_server
from server.client import TunerClient
from server.service import LeasePolicy, TuningService
from server.storage import SQLiteStorage
from targets.base import Target
from tuner.errors import StateError, ValidationError
from tuner.space import FloatKnob, IntKnob, Knob, SearchSpace
from tuner.study import DesignerSettings, Goal, Objective, StudySpec
from tuner.trial import StepKind, Trial, TrialStatus

TTL = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_spec(name: str = "leased") -> StudySpec:
    return StudySpec(
        name=name,
        space=SearchSpace(
            (
                FloatKnob("x", low=0.0, high=1.0, default=0.5),
                IntKnob("n", low=1, high=64, default=4),
            )
        ),
        objectives=(Objective("y", Goal.MINIMIZE),),
        designer=DesignerSettings(algorithm="sobol", seed=3, start_with_default=False),
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "tuner.db"


def service_on(db: Path, clock: Clock, on_expiry: str = "reoffer") -> TuningService:
    storage = SQLiteStorage(db, clock=clock)
    return TuningService(storage, leases=LeasePolicy(TTL, on_expiry), clock=clock)


@pytest.fixture
def service(db: Path, clock: Clock) -> Iterator[TuningService]:
    service = service_on(db, clock)
    service.create_study(make_spec())
    yield service
    service.close()


def by_status(service: TuningService, status: TrialStatus) -> list[Trial]:
    return service.list_trials("leased", [status])


def test_a_handed_out_trial_holds_a_lease_that_heartbeats_renew(
    service: TuningService, clock: Clock
) -> None:
    [trial] = service.suggest_trials("leased", 1, "w1")
    assert trial.lease_expires_at == clock.now + TTL
    for _ in range(5):  # 5 x 40 s: far past one TTL, but never 60 s of silence
        clock.advance(40)
        renewed = service.heartbeat("leased", trial.id)
        assert renewed.status is TrialStatus.ACTIVE
        assert renewed.lease_expires_at == clock.now + TTL
    clock.advance(59)
    assert service.get_trial("leased", trial.id).status is TrialStatus.ACTIVE
    # asking again with the same client id is a sign of life too
    [again] = service.suggest_trials("leased", 1, "w1")
    assert again.id == trial.id and again.lease_expires_at == clock.now + TTL


def test_an_expired_trial_is_abandoned_and_its_configuration_goes_to_the_next_worker(
    service: TuningService, clock: Clock
) -> None:
    [lost] = service.suggest_trials("leased", 1, "w1")
    clock.advance(TTL + 1)
    [gone] = by_status(service, TrialStatus.ABANDONED)
    assert gone.id == lost.id and gone.expired_at == clock.now
    assert "lease expired" in gone.reason and "'w1'" in gone.reason
    [queued] = by_status(service, TrialStatus.PENDING)
    assert gone.reoffered_as == queued.id and queued.config == lost.config
    # the re-offer goes out before anything new, to whoever asks next, with a lease
    [handed] = service.suggest_trials("leased", 1, "w2")
    assert handed.id == queued.id and handed.client_id == "w2"
    assert handed.status is TrialStatus.ACTIVE and handed.lease_expires_at == clock.now + TTL
    [fresh] = service.suggest_trials("leased", 1, "w3")
    assert fresh.config != lost.config
    events = [e.event for e in service.storage.trial_events("leased", lost.id)]
    assert events == ["created", "lease_expired", "reoffered"]


def test_a_heartbeat_after_expiry_is_refused_with_the_re_offer_named(
    service: TuningService, clock: Clock
) -> None:
    [trial] = service.suggest_trials("leased", 1, "w1")
    clock.advance(TTL + 1)
    with pytest.raises(StateError) as caught:
        service.heartbeat("leased", trial.id)
    message = str(caught.value)
    assert "lease expired" in message and f"re-offered as trial {trial.id + 1}" in message
    assert "CompleteTrial" in message


def test_a_late_result_is_stored_once_and_drops_the_untaken_re_offer(
    service: TuningService, clock: Clock
) -> None:
    [trial] = service.suggest_trials("leased", 1, "w1")
    clock.advance(TTL + 1)
    stored = service.complete_trial("leased", trial.id, {"y": 0.25})
    assert stored.status is TrialStatus.COMPLETED and stored.reported_late
    assert stored.metrics == {"y": 0.25} and stored.expired_at is not None
    with pytest.raises(StateError, match="COMPLETED"):
        service.complete_trial("leased", trial.id, {"y": 0.5})
    assert service.get_trial("leased", trial.id).metrics == {"y": 0.25}
    [dropped] = by_status(service, TrialStatus.ABANDONED)
    assert dropped.id == trial.reoffered_as or dropped.id == stored.reoffered_as
    assert "reported its result late" in dropped.reason
    assert not by_status(service, TrialStatus.PENDING)
    # the next worker gets a new configuration, not the one just measured
    [fresh] = service.suggest_trials("leased", 1, "w2")
    assert fresh.config != trial.config and fresh.id == dropped.id + 1


def test_a_late_result_leaves_a_re_offer_that_another_worker_already_runs(
    service: TuningService, clock: Clock
) -> None:
    [trial] = service.suggest_trials("leased", 1, "w1")
    clock.advance(TTL + 1)
    [copy] = service.suggest_trials("leased", 1, "w2")
    assert copy.config == trial.config
    assert service.complete_trial("leased", trial.id, {"y": 1.0}).reported_late
    assert service.get_trial("leased", copy.id).status is TrialStatus.ACTIVE
    done = service.complete_trial("leased", copy.id, {"y": 1.1})
    assert done.status is TrialStatus.COMPLETED and not done.reported_late
    assert len(by_status(service, TrialStatus.COMPLETED)) == 2


def test_with_on_expiry_fail_the_trial_fails_and_is_not_re_offered(db: Path, clock: Clock) -> None:
    service = service_on(db, clock, on_expiry="fail")
    try:
        service.create_study(make_spec())
        [trial] = service.suggest_trials("leased", 1, "w1")
        clock.advance(TTL + 1)
        [failed] = by_status(service, TrialStatus.FAILED)
        assert failed.id == trial.id and failed.reoffered_as is None
        assert not by_status(service, TrialStatus.PENDING)
        [fresh] = service.suggest_trials("leased", 1, "w2")
        assert fresh.id == trial.id + 1 and fresh.step is StepKind.SOBOL  # designed, not queued
        late = service.complete_trial("leased", trial.id, {"y": 2.0})
        assert late.status is TrialStatus.COMPLETED and late.reported_late
    finally:
        service.close()


def test_leases_survive_a_restart_of_the_service(db: Path, clock: Clock) -> None:
    first = service_on(db, clock)
    first.create_study(make_spec())
    [trial] = first.suggest_trials("leased", 1, "w1")
    first.close()
    clock.advance(TTL + 1)
    second = service_on(db, clock)
    try:
        assert second.get_trial("leased", trial.id).status is TrialStatus.ABANDONED
        [copy] = second.suggest_trials("leased", 1, "w2")
        assert copy.config == trial.config
        assert SQLiteStorage(db).integrity_check() == "ok"
    finally:
        second.close()


def test_without_leases_nothing_expires_and_heartbeats_change_nothing(
    db: Path, clock: Clock
) -> None:
    service = TuningService(SQLiteStorage(db, clock=clock), clock=clock)
    try:
        service.create_study(make_spec())
        [trial] = service.suggest_trials("leased", 1, "w1")
        assert trial.lease_expires_at is None
        clock.advance(10 * TTL)
        assert service.heartbeat("leased", trial.id).status is TrialStatus.ACTIVE
        assert service.get_trial("leased", trial.id).status is TrialStatus.ACTIVE
        service.complete_trial("leased", trial.id, {"y": 1.0})
        with pytest.raises(StateError, match="not ACTIVE"):
            service.heartbeat("leased", trial.id)
    finally:
        service.close()


@pytest.mark.parametrize(
    ("ttl", "on_expiry", "field"),
    [(0, "reoffer", "lease_ttl"), (-5, "reoffer", "lease_ttl"), (30, "retry", "on_expiry")],
)
def test_a_bad_lease_policy_is_named(ttl: float, on_expiry: str, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        LeasePolicy(ttl, on_expiry)
    assert caught.value.field == field


# -- over gRPC -----------------------------------------------------------------------------


def test_heartbeat_and_late_completion_over_grpc(db: Path, clock: Clock) -> None:
    service = service_on(db, clock)
    server, port = build_server(service)
    server.start()
    try:
        with TunerClient(f"127.0.0.1:{port}") as client:
            client.wait_ready(10)
            client.create_study(make_spec())
            [trial] = client.suggest_trials("leased", 1, "w1")
            assert trial.lease_expires_at == pytest.approx(clock.now + TTL)
            clock.advance(30)
            assert client.heartbeat("leased", trial.id).lease_expires_at == pytest.approx(
                clock.now + TTL
            )
            clock.advance(TTL + 1)
            stub = pb_grpc.TunerServiceStub(client._channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.Heartbeat(
                    pb.HeartbeatRequest(study="leased", trial_id=trial.id, client_id="w1")
                )
            assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert f"re-offered as trial {trial.id + 1}" in caught.value.details()
            with pytest.raises(grpc.RpcError) as caught:
                stub.Heartbeat(pb.HeartbeatRequest(study="leased", trial_id=99, client_id="w1"))
            assert caught.value.code() is grpc.StatusCode.NOT_FOUND
            late = client.complete_trial("leased", trial.id, {"y": 0.5})
            assert late.reported_late and late.status is TrialStatus.COMPLETED
            assert late.reoffered_as == trial.id + 1 and late.expired_at is not None
            with pytest.raises(StateError):
                client.complete_trial("leased", trial.id, {"y": 0.5})
    finally:
        stop_server(server, None).wait()
        service.close()


# -- sessions keep their trials alive -------------------------------------------------------


class SlowTarget(Target):
    """Takes ``seconds`` per measurement: longer than the lease."""

    kind = "slow"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def describe_knobs(self) -> tuple[Knob, ...]:
        return tuple(make_spec().space)

    def describe_metrics(self) -> dict[str, str]:
        return {"y": "lower is better"}

    def apply(self, config: dict[str, object]) -> None:
        self.config = config

    def measure(self) -> dict[str, float]:
        time.sleep(self.seconds)
        return {"y": float(self.config["x"])}  # type: ignore[arg-type]

    def restore(self) -> None:
        pass


@pytest.mark.parametrize("over_grpc", [False, True])
def test_a_session_heartbeats_while_a_trial_runs_longer_than_its_lease(
    db: Path, over_grpc: bool
) -> None:
    service = TuningService(SQLiteStorage(db), leases=LeasePolicy(0.4, "reoffer"))
    server, port = build_server(service)
    server.start()
    try:
        if over_grpc:
            with TunerClient(f"127.0.0.1:{port}") as client:
                client.wait_ready(10)
                result = run_session(client, SlowTarget(1.0), make_spec(), trials=2)
        else:
            result = run_session(service, SlowTarget(1.0), make_spec(), trials=2)
    finally:
        stop_server(server, None).wait()
    try:
        statuses = [t.status for t in result.trials]
        assert statuses == [TrialStatus.COMPLETED, TrialStatus.COMPLETED]
        assert not any(t.reported_late or t.expired_at for t in result.trials)
    finally:
        service.close()


def test_two_sessions_on_one_study_share_its_budget_and_never_a_trial(db: Path) -> None:
    """Two `tuner tune` processes on one study, as Optuna workers on one storage: each gets
    its own trials, and together they stop at the study's budget."""
    service = TuningService(SQLiteStorage(db), leases=LeasePolicy(60, "reoffer"))
    errors: list[BaseException] = []

    def session() -> None:
        try:
            run_session(service, SlowTarget(0.05), make_spec(), trials=12)
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=session) for _ in range(2)]
        # two processes, played by two threads: each its own session id
        per_thread = lambda spec: f"session:h:{threading.get_ident()}:{spec.name}"  # noqa: E731
        with patch("runner.session.client_id_for", side_effect=per_thread):
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
        assert not errors, errors
        trials = service.list_trials(make_spec().name)
        assert len(trials) == 12 and all(t.status is TrialStatus.COMPLETED for t in trials)
        holders = {t.client_id for t in trials if t.step is not StepKind.DEFAULT}
        assert len(holders) == 2, "both sessions measured trials"
    finally:
        service.close()


def test_a_session_finishes_the_trial_a_killed_session_of_this_host_left(db: Path) -> None:
    service = TuningService(SQLiteStorage(db), leases=LeasePolicy(60, "reoffer"))
    try:
        spec = make_spec()
        service.create_study(spec)
        probe = [sys.executable, "-c", "import os; print(os.getpid())"]
        dead = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
        left = f"session:{socket.gethostname()}:{dead}:{spec.name}"
        (trial,) = service.suggest_trials(spec.name, 1, client_id=left)
        result = run_session(service, SlowTarget(0.01), spec, trials=2)
        assert [t.id for t in result.trials] == [trial.id, trial.id + 1]
        assert all(t.status is TrialStatus.COMPLETED for t in result.trials)
        assert result.trials[0].client_id == left
    finally:
        service.close()
