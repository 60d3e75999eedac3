"""The gRPC API end to end: a real server on 127.0.0.1, port 0, over a real SQLite file.

Wire-level checks go through the generated stub (so malformed messages reach the server);
the domain-level flow goes through ``TunerClient``, which also checks the inverse error table.
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from server import convert
from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.app import build_server, stop_server
from server.client import TunerClient
from server.errors import INTERNAL_MESSAGE
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.constraints import OutcomeConstraint
from tuner.errors import (
    NotFoundError,
    PermissionDeniedError,
    StateError,
    StorageError,
    TunerError,
    ValidationError,
)
from tuner.space import CategoricalKnob, FloatKnob, IntKnob, SearchSpace
from tuner.study import DesignerSettings, Goal, Objective, StudySpec
from tuner.trial import StepKind, TrialStatus

REPO = Path(__file__).resolve().parents[2]
StatusCode = grpc.StatusCode


def make_spec(
    name: str = "sqlite-tps", seed: int = 7, constraints: tuple[str, ...] = ()
) -> StudySpec:
    return StudySpec(
        name=name,
        space=SearchSpace(
            (
                FloatKnob("cache_frac", low=0.0, high=1.0, default=0.5),
                IntKnob("threads", low=1, high=64, default=4),
                CategoricalKnob("journal", choices=("wal", "delete", "truncate"), default="wal"),
            )
        ),
        objectives=(Objective("tps", Goal.MAXIMIZE),),
        outcome_constraints=tuple(OutcomeConstraint.parse(c) for c in constraints),
        designer=DesignerSettings(algorithm="sobol", seed=seed, start_with_default=False),
    )


# -- fixtures ----------------------------------------------------------------------------


class _Server:
    """A running server and how to reach it."""

    def __init__(self, service: TuningService) -> None:
        self.server, self.port = build_server(service)
        self.target = f"127.0.0.1:{self.port}"
        self.server.start()

    def stop(self) -> None:
        stop_server(self.server, None).wait()


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[SQLiteStorage]:
    with SQLiteStorage(tmp_path / "tuner.db") as opened:
        yield opened


@pytest.fixture
def running(storage: SQLiteStorage) -> Iterator[_Server]:
    service = TuningService(storage)
    server = _Server(service)
    yield server
    server.stop()
    service.close()


@pytest.fixture
def channel(running: _Server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(running.target) as opened:
        yield opened


@pytest.fixture
def stub(channel: grpc.Channel) -> pb_grpc.TunerServiceStub:
    return pb_grpc.TunerServiceStub(channel)


@pytest.fixture
def client(running: _Server) -> Iterator[TunerClient]:
    with TunerClient(running.target, timeout=30.0) as opened:
        yield opened


def rpc_error(call: Callable[..., Any], request: Any, code: grpc.StatusCode) -> str:
    """Call, expect ``code``, and return the status message."""
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    error: Any = info.value
    assert error.code() is code, error.details()
    return str(error.details())


def create(stub: pb_grpc.TunerServiceStub, spec: StudySpec) -> pb.CreateStudyResponse:
    return stub.CreateStudy(pb.CreateStudyRequest(spec=convert.spec_to_proto(spec)), timeout=30)


# -- studies -----------------------------------------------------------------------------


def test_create_study_creates_then_loads(stub: pb_grpc.TunerServiceStub) -> None:
    first = create(stub, make_spec())
    second = create(stub, make_spec())
    assert first.created is True
    assert second.created is False
    assert convert.spec_from_proto(second.study.spec) == make_spec()
    assert second.study.created_at == first.study.created_at


def test_same_name_different_spec_is_already_exists(stub: pb_grpc.TunerServiceStub) -> None:
    create(stub, make_spec(seed=1))
    request = pb.CreateStudyRequest(spec=convert.spec_to_proto(make_spec(seed=2)))
    message = rpc_error(stub.CreateStudy, request, StatusCode.ALREADY_EXISTS)
    assert "sqlite-tps" in message


def test_get_and_list_studies(stub: pb_grpc.TunerServiceStub) -> None:
    create(stub, make_spec("b-study"))
    create(stub, make_spec("a-study"))
    study = stub.GetStudy(pb.GetStudyRequest(name="b-study"), timeout=30)
    assert study.spec.name == "b-study"
    assert not study.HasField("best_trial_id")
    listed = stub.ListStudies(pb.ListStudiesRequest(), timeout=30).studies
    assert sorted(s.spec.name for s in listed) == ["a-study", "b-study"]


def test_get_unknown_study_is_not_found(stub: pb_grpc.TunerServiceStub) -> None:
    message = rpc_error(stub.GetStudy, pb.GetStudyRequest(name="nope"), StatusCode.NOT_FOUND)
    assert "nope" in message


def _no_kind(wire: pb.StudySpec) -> None:
    wire.knobs[1].ClearField("kind")


def _nan_bound(wire: pb.StudySpec) -> None:
    wire.knobs[0].float_range.high = math.nan


def _reversed_bounds(wire: pb.StudySpec) -> None:
    wire.knobs[1].int_range.low, wire.knobs[1].int_range.high = 64, 1


def _duplicate_names(wire: pb.StudySpec) -> None:
    wire.knobs[2].name = "cache_frac"


def _unset_goal(wire: pb.StudySpec) -> None:
    wire.objectives[0].goal = pb.GOAL_UNSPECIFIED


def _unknown_goal(wire: pb.StudySpec) -> None:
    wire.objectives[0].goal = 17  # type: ignore[assignment]


def _no_knobs(wire: pb.StudySpec) -> None:
    del wire.knobs[:]


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (_no_kind, "spec.knobs[1].kind: no knob kind set"),
        (_nan_bound, "spec.knobs[0].float_range.high: must be finite"),
        (
            _reversed_bounds,
            "spec.knobs[1].high: knob 'threads': high (1) must be greater than low (64)",
        ),
        (_duplicate_names, "spec.knobs[2].name: duplicate knob name 'cache_frac'"),
        (_unset_goal, "spec.objectives[0].goal: is required"),
        (_unknown_goal, "spec.objectives[0].goal: unknown value 17"),
        (_no_knobs, "spec.knobs: needs at least one knob"),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else "",
)
def test_malformed_spec_is_invalid_argument(
    stub: pb_grpc.TunerServiceStub, mutate: Callable[[pb.StudySpec], None], fragment: str
) -> None:
    wire = convert.spec_to_proto(make_spec())
    mutate(wire)
    request = pb.CreateStudyRequest(spec=wire)
    assert fragment in rpc_error(stub.CreateStudy, request, StatusCode.INVALID_ARGUMENT)
    assert stub.ListStudies(pb.ListStudiesRequest(), timeout=30).studies == []


def test_missing_spec_is_invalid_argument(stub: pb_grpc.TunerServiceStub) -> None:
    message = rpc_error(stub.CreateStudy, pb.CreateStudyRequest(), StatusCode.INVALID_ARGUMENT)
    assert "spec: is required" in message


# -- trials ------------------------------------------------------------------------------


def test_suggest_is_idempotent_per_client(client: TunerClient) -> None:
    client.create_study(make_spec())
    (first,) = client.suggest_trials("sqlite-tps", 1, "worker-1")
    (again,) = client.suggest_trials("sqlite-tps", 1, "worker-1")
    (other,) = client.suggest_trials("sqlite-tps", 1, "worker-2")
    assert again.id == first.id
    assert again.config == first.config
    assert first.status is TrialStatus.ACTIVE
    assert first.client_id == "worker-1"
    assert other.id != first.id
    assert other.config != first.config
    assert type(first.config["threads"]) is int
    assert type(first.config["cache_frac"]) is float


def test_suggest_count_out_of_range_is_invalid_argument(stub: pb_grpc.TunerServiceStub) -> None:
    create(stub, make_spec())
    request = pb.SuggestTrialsRequest(study="sqlite-tps", count=0, client_id="w")
    assert "count" in rpc_error(stub.SuggestTrials, request, StatusCode.INVALID_ARGUMENT)


def test_complete_with_nan_metric_is_invalid_argument(
    stub: pb_grpc.TunerServiceStub, client: TunerClient
) -> None:
    client.create_study(make_spec())
    (trial,) = client.suggest_trials("sqlite-tps", 1, "w")
    request = pb.CompleteTrialRequest(
        study="sqlite-tps",
        trial_id=trial.id,
        metrics={"tps": math.nan},
        status=pb.TRIAL_OUTCOME_COMPLETED,
    )
    assert "metrics.tps" in rpc_error(stub.CompleteTrial, request, StatusCode.INVALID_ARGUMENT)
    assert client.get_trial("sqlite-tps", trial.id).status is TrialStatus.ACTIVE


@pytest.mark.parametrize("status", [pb.TRIAL_OUTCOME_UNSPECIFIED, 99])
def test_complete_with_unset_or_unknown_status_is_invalid_argument(
    stub: pb_grpc.TunerServiceStub, client: TunerClient, status: int
) -> None:
    client.create_study(make_spec())
    (trial,) = client.suggest_trials("sqlite-tps", 1, "w")
    request = pb.CompleteTrialRequest(
        study="sqlite-tps",
        trial_id=trial.id,
        metrics={"tps": 1.0},
        status=status,  # type: ignore[arg-type]
    )
    message = rpc_error(stub.CompleteTrial, request, StatusCode.INVALID_ARGUMENT)
    assert message.startswith("status: ")
    assert "TRIAL_OUTCOME_COMPLETED" in message


def test_completing_a_finished_trial_is_failed_precondition(
    stub: pb_grpc.TunerServiceStub, client: TunerClient
) -> None:
    client.create_study(make_spec())
    (trial,) = client.suggest_trials("sqlite-tps", 1, "w")
    done = client.complete_trial("sqlite-tps", trial.id, {"tps": 10.0})
    assert done.status is TrialStatus.COMPLETED
    assert done.metrics == {"tps": 10.0}
    request = pb.CompleteTrialRequest(
        study="sqlite-tps",
        trial_id=trial.id,
        metrics={"tps": 11.0},
        status=pb.TRIAL_OUTCOME_COMPLETED,
        client_id="w",
    )
    message = rpc_error(stub.CompleteTrial, request, StatusCode.FAILED_PRECONDITION)
    assert "COMPLETED" in message
    with pytest.raises(StateError, match="COMPLETED"):
        client.complete_trial("sqlite-tps", trial.id, {"tps": 11.0})


def test_infeasible_and_failed_need_a_reason(client: TunerClient) -> None:
    client.create_study(make_spec())
    first, second = client.suggest_trials("sqlite-tps", 2, "w")
    with pytest.raises(ValidationError, match="reason") as info:
        client.complete_trial("sqlite-tps", first.id, status=TrialStatus.INFEASIBLE)
    assert info.value.field == "reason"
    infeasible = client.complete_trial(
        "sqlite-tps", first.id, status=TrialStatus.INFEASIBLE, reason="OOM at startup"
    )
    failed = client.complete_trial(
        "sqlite-tps", second.id, status=TrialStatus.FAILED, reason="disk unplugged"
    )
    assert (infeasible.status, infeasible.reason) == (TrialStatus.INFEASIBLE, "OOM at startup")
    assert (failed.status, failed.reason) == (TrialStatus.FAILED, "disk unplugged")


def test_list_trials_filters_by_status(stub: pb_grpc.TunerServiceStub, client: TunerClient) -> None:
    client.create_study(make_spec())
    trials = client.suggest_trials("sqlite-tps", 3, "w")
    client.complete_trial("sqlite-tps", trials[0].id, {"tps": 5.0})
    client.complete_trial("sqlite-tps", trials[1].id, status=TrialStatus.FAILED, reason="x")
    everything = client.list_trials("sqlite-tps")
    assert [t.id for t in everything] == [t.id for t in trials]
    completed = client.list_trials("sqlite-tps", [TrialStatus.COMPLETED])
    assert [t.id for t in completed] == [trials[0].id]
    unfinished = client.list_trials("sqlite-tps", {TrialStatus.ACTIVE, TrialStatus.FAILED})
    assert [t.id for t in unfinished] == [trials[1].id, trials[2].id]
    request = pb.ListTrialsRequest(study="sqlite-tps", statuses=[pb.TRIAL_STATUS_UNSPECIFIED])
    message = rpc_error(stub.ListTrials, request, StatusCode.INVALID_ARGUMENT)
    assert "statuses[0]: is required" in message


def test_get_best_trial_before_and_after_a_feasible_trial(client: TunerClient) -> None:
    spec = make_spec("constrained", constraints=("p95_ms <= 20",))
    client.create_study(spec)
    with pytest.raises(NotFoundError):
        client.get_best_trial(spec.name)
    slow, good, better_but_infeasible = client.suggest_trials(spec.name, 3, "w")
    client.complete_trial(spec.name, slow.id, {"tps": 100.0, "p95_ms": 30.0})
    with pytest.raises(NotFoundError):
        client.get_best_trial(spec.name)
    client.complete_trial(spec.name, good.id, {"tps": 50.0, "p95_ms": 10.0})
    client.complete_trial(
        spec.name, better_but_infeasible.id, status=TrialStatus.INFEASIBLE, reason="crashed"
    )
    best = client.get_best_trial(spec.name)
    assert best.id == good.id
    assert best.metrics == {"tps": 50.0, "p95_ms": 10.0}
    info = client.get_study(spec.name)
    assert info.best_trial_id == good.id
    assert info.trial_counts[TrialStatus.COMPLETED.value] == 2


def test_pareto_front_of_a_study_with_two_objectives(
    client: TunerClient, stub: pb_grpc.TunerServiceStub
) -> None:
    spec = replace(
        make_spec("energy-latency", constraints=("p99_ms <= 100",)),
        objectives=(
            Objective("joules", Goal.MINIMIZE, reference=50.0),
            Objective("p99_ms", Goal.MINIMIZE),
        ),
    )
    info, _ = client.create_study(spec)
    assert info.spec == spec and info.spec.objectives[0].reference == 50.0
    assert client.get_pareto_front(spec.name) == []
    measured = [(10.0, 80.0), (20.0, 40.0), (25.0, 45.0), (5.0, 150.0)]  # 3: dominated; 4: slow
    trials = client.suggest_trials(spec.name, 4, "w")
    for t, (joules, p99) in zip(trials, measured, strict=True):
        client.complete_trial(spec.name, t.id, {"joules": joules, "p99_ms": p99})
    front = client.get_pareto_front(spec.name)
    assert [t.id for t in front] == [trials[0].id, trials[1].id]
    assert front[1].metrics == {"joules": 20.0, "p99_ms": 40.0}
    assert client.get_study(spec.name).best_trial_id is None
    message = rpc_error(
        stub.GetBestTrial, pb.GetBestTrialRequest(study=spec.name), StatusCode.FAILED_PRECONDITION
    )
    assert "2 objectives (joules, p99_ms)" in message and "GetParetoFront" in message
    rpc_error(stub.GetParetoFront, pb.GetParetoFrontRequest(study="nope"), StatusCode.NOT_FOUND)


def test_a_bound_relative_to_the_default_resolves_once_the_default_is_measured(
    client: TunerClient,
) -> None:
    spec = replace(
        make_spec("envpipe"),
        objectives=(Objective("joules", Goal.MINIMIZE),),
        outcome_constraints=(OutcomeConstraint.parse("tps >= 0.95 * default"),),
        designer=DesignerSettings(algorithm="bo", seed=3, initial_trials=3),
    )
    info, _ = client.create_study(spec)
    assert info.spec == spec
    assert [str(c) for c in info.spec.outcome_constraints] == ["tps >= 0.95 * default"]
    (default,) = client.suggest_trials(spec.name, 1, "w")
    assert default.step is StepKind.DEFAULT
    cheaper_but_slow, cheaper = client.suggest_trials(spec.name, 2, "w2")
    client.complete_trial(spec.name, cheaper_but_slow.id, {"joules": 5.0, "tps": 90.0})
    client.complete_trial(spec.name, cheaper.id, {"joules": 8.0, "tps": 96.0})
    with pytest.raises(NotFoundError):  # nothing can be judged before the default's tps
        client.get_best_trial(spec.name)
    client.complete_trial(spec.name, default.id, {"joules": 10.0, "tps": 100.0})
    assert client.get_best_trial(spec.name).id == cheaper.id  # 96 >= 95; 90 is too slow
    # the designer models the resolved bound (and keeps suggesting new configurations)
    after = client.suggest_trials(spec.name, 2, "w3")
    assert len({tuple(sorted(t.config.items())) for t in after}) == 2


def test_bad_reference_point_over_the_wire_names_the_field(
    stub: pb_grpc.TunerServiceStub,
) -> None:
    message = convert.spec_to_proto(make_spec("ref"))
    message.objectives[0].reference = 3.0
    request = pb.CreateStudyRequest(spec=message)
    detail = rpc_error(stub.CreateStudy, request, StatusCode.INVALID_ARGUMENT)
    assert "objectives.tps.reference" in detail and "several objectives" in detail
    message.objectives.add(name="tps", goal=pb.GOAL_MINIMIZE)
    request = pb.CreateStudyRequest(spec=message)
    detail = rpc_error(stub.CreateStudy, request, StatusCode.INVALID_ARGUMENT)
    assert "objectives[1].name" in detail


def test_get_unknown_trial_is_not_found(client: TunerClient) -> None:
    client.create_study(make_spec())
    with pytest.raises(NotFoundError):
        client.get_trial("sqlite-tps", 999)


# -- the client --------------------------------------------------------------------------


def test_client_round_trips_domain_types(client: TunerClient) -> None:
    client.wait_ready(10)
    info, created = client.create_study(make_spec())
    assert created
    assert info.spec == make_spec()
    assert info.trial_counts.get(TrialStatus.ACTIVE.value, 0) == 0
    assert [s.spec for s in client.list_studies()] == [make_spec()]
    assert client.get_study("sqlite-tps") == info
    with pytest.raises(ValidationError, match="cannot be completed as PENDING"):
        client.complete_trial("sqlite-tps", 1, status=TrialStatus.PENDING)


def test_client_keeps_transport_errors_as_rpc_errors(tmp_path: Path) -> None:
    storage = SQLiteStorage(tmp_path / "gone.db")
    service = TuningService(storage)
    gone = _Server(service)
    gone.stop()
    service.close()
    storage.close()
    # an UNAVAILABLE call is retried for retry_for seconds, then raised as gRPC raised it
    with TunerClient(gone.target, timeout=2.0, retry_for=1.0) as client:
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            client.get_study("x")
        assert time.monotonic() - start >= 1.0
        assert info.value.code() is StatusCode.UNAVAILABLE
        assert not isinstance(info.value, TunerError)
        with pytest.raises(TimeoutError, match="not ready"):
            client.wait_ready(0.5)


# -- errors the service did not mean -----------------------------------------------------


class _BrokenService(TuningService):
    def get_study(self, name: str) -> Any:
        raise RuntimeError(f"secret internals of {name}")

    def list_studies(self, offset: int = 0, limit: int | None = None) -> Any:
        raise StorageError("database is locked")


def test_unexpected_error_is_internal_with_a_generic_message(
    storage: SQLiteStorage, caplog: pytest.LogCaptureFixture
) -> None:
    service = _BrokenService(storage)
    server = _Server(service)
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.TunerServiceStub(channel)
            with caplog.at_level(logging.ERROR, logger="server.errors"):
                message = rpc_error(
                    stub.GetStudy, pb.GetStudyRequest(name="x"), StatusCode.INTERNAL
                )
            assert message == INTERNAL_MESSAGE
            assert "secret" not in message
            logged = [r for r in caplog.records if r.name == "server.errors"]
            assert logged and logged[0].exc_info is not None
            assert "secret internals of x" in caplog.text
            message = rpc_error(stub.ListStudies, pb.ListStudiesRequest(), StatusCode.UNAVAILABLE)
            assert "database is locked" in message
        with TunerClient(server.target, retry_for=0) as client:
            with pytest.raises(StorageError, match="database is locked"):
                client.list_studies()
            with pytest.raises(TunerError, match="internal error") as info:
                client.get_study("x")
            assert type(info.value) is TunerError
    finally:
        server.stop()
        service.close()


# -- health, reflection, shutdown --------------------------------------------------------


@pytest.mark.parametrize("service_name", ["", "tuner.v1.TunerService"])
def test_health_reports_serving(channel: grpc.Channel, service_name: str) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service=service_name), timeout=30)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_service(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = database.get_services()
    assert "tuner.v1.TunerService" in services
    assert "grpc.health.v1.Health" in services
    described = database.FindFileContainingSymbol("tuner.v1.TunerService")
    assert described.name == "tuner/v1/tuner.proto"


def test_shutdown_turns_health_not_serving(storage: SQLiteStorage) -> None:
    service = TuningService(storage)
    server = _Server(service)
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        stopped = stop_server(server.server, grace=2.0)
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        stopped.wait()
    service.close()


def test_serve_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
        "from server.app import serve\n"
        "serve(sys.argv[1], port=0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "served.db")],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    try:
        lines = []
        match = None
        for line in process.stderr:
            lines.append(line)
            match = re.search(r"on (127\.0\.0\.1:\d+) ", line)
            if match:
                break
        assert match, "".join(lines)
        with TunerClient(match.group(1)) as client:
            client.wait_ready(30)
            assert client.create_study(make_spec())[1] is True
        process.send_signal(signal.SIGTERM)
        rest = process.stderr.read()
        assert process.wait(timeout=60) == 0, rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()
    assert "received SIGTERM" in rest
    assert "tuner server stopped" in rest
    assert (tmp_path / "served.db").exists()


# -- candidate lists ---------------------------------------------------------------------


def _cloud_spec() -> StudySpec:
    from knobs.cloud import load_cloud_catalog

    catalog = load_cloud_catalog()
    return StudySpec(
        name="cloud",
        space=SearchSpace(catalog.knobs()),
        objectives=(Objective("cost_usd", Goal.MINIMIZE),),
        designer=DesignerSettings(seed=3, initial_trials=2),
        candidates=catalog.candidates(),
        candidate_features=tuple(catalog.resources(c) for c in catalog.candidates()),
    )


def test_a_candidate_study_round_trips_and_suggests_only_candidates(
    stub: pb_grpc.TunerServiceStub, client: TunerClient
) -> None:
    spec = _cloud_spec()
    response = create(stub, spec)
    assert convert.spec_from_proto(response.study.spec) == spec
    allowed = {tuple(c.values()) for c in spec.candidates}
    seen = []
    for round_ in range(3):
        for trial in client.suggest_trials("cloud", 3, f"worker-{round_}"):
            assert tuple(trial.config.values()) in allowed
            seen.append(tuple(trial.config.values()))
            cost = 0.1 * int(trial.config["nodes"]) * (1 + (trial.config["family"] == "r4"))
            client.complete_trial("cloud", trial.id, {"cost_usd": cost})
    assert len(set(seen)) == len(seen) == 9


def _off_list(wire: pb.StudySpec) -> None:
    wire.candidates[5].config[2].value.integer = 64  # above the knob's range


def _repeated(wire: pb.StudySpec) -> None:
    wire.candidates[7].CopyFrom(wire.candidates[6])


def _features_missing(wire: pb.StudySpec) -> None:
    wire.candidates[4].features.clear()


def _feature_nan(wire: pb.StudySpec) -> None:
    wire.candidates[2].features["vcpus"] = math.nan


def _feature_renamed(wire: pb.StudySpec) -> None:
    del wire.candidates[9].features["memory_gib"]
    wire.candidates[9].features["memory"] = 64.0


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (_off_list, "spec.candidates[5].nodes"),
        (_repeated, "spec.candidates[7]: repeats candidates[6]"),
        (_features_missing, "spec.candidates[4].features: must be a non-empty table"),
        (_feature_nan, "spec.candidates[2].features.vcpus: got nan"),
        (_feature_renamed, "spec.candidates[9].features: has features ['memory', 'vcpus']"),
    ],
    ids=["out-of-range", "repeated", "features-missing", "feature-nan", "feature-renamed"],
)
def test_a_bad_candidate_is_invalid_argument(
    stub: pb_grpc.TunerServiceStub, mutate: Callable[[pb.StudySpec], None], fragment: str
) -> None:
    wire = convert.spec_to_proto(_cloud_spec())
    mutate(wire)
    message = rpc_error(
        stub.CreateStudy, pb.CreateStudyRequest(spec=wire), StatusCode.INVALID_ARGUMENT
    )
    assert fragment in message
    assert stub.ListStudies(pb.ListStudiesRequest(), timeout=30).studies == []


def test_only_the_client_holding_a_trial_may_finish_or_renew_it(client: TunerClient) -> None:
    client.create_study(make_spec())
    (held,) = client.suggest_trials("sqlite-tps", 1, client_id="worker-a")
    (anonymous,) = client.suggest_trials("sqlite-tps", 1)
    for other in ("worker-b", ""):
        with pytest.raises(PermissionDeniedError, match="handed to client 'worker-a'") as denied:
            client.complete_trial("sqlite-tps", held.id, {"tps": 1.0}, client_id=other)
        assert denied.value.__cause__.code() is StatusCode.PERMISSION_DENIED  # type: ignore[union-attr]
        with pytest.raises(PermissionDeniedError):
            client.heartbeat("sqlite-tps", held.id, client_id=other)
    assert client.get_trial("sqlite-tps", held.id).status is TrialStatus.ACTIVE
    assert client.heartbeat("sqlite-tps", held.id, client_id="worker-a").id == held.id
    done = client.complete_trial("sqlite-tps", held.id, {"tps": 1.0}, client_id="worker-a")
    assert done.status is TrialStatus.COMPLETED
    # a trial handed out anonymously is anyone's; an operator may override a holder
    client.complete_trial("sqlite-tps", anonymous.id, {"tps": 2.0}, client_id="anyone")
    (third,) = client.suggest_trials("sqlite-tps", 1, client_id="worker-c")
    fixed = client.complete_trial(
        "sqlite-tps", third.id, status=TrialStatus.FAILED, reason="operator: host died",
        override_holder=True,
    )  # fmt: skip
    assert fixed.status is TrialStatus.FAILED
