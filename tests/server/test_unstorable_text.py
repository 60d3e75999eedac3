"""Text no backend can store alike (a NUL character, an unpaired surrogate) is refused
before storage, with INVALID_ARGUMENT naming the field, the same on SQLite and PostgreSQL.

PostgreSQL's text cannot hold a NUL: before, SQLite stored it and PostgreSQL answered
UNAVAILABLE, a code the client retries for a minute. Over real gRPC on loopback, on both
backends; in process, unpaired surrogates too (an undecodable file name, a JSON ``\\ud800``),
which the wire cannot carry (protobuf strings are UTF-8).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from server import convert
from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.app import build_server, stop_server
from server.records import ImportedTrial
from server.service import TuningService
from server.storage import NewTrial, SQLiteStorage, Storage
from server.storage.postgres import PostgresStorage
from tuner.errors import ValidationError
from tuner.study import StudySpec
from tuner.trial import TrialStatus

BACKENDS = ["sqlite", "postgresql"]
NUL = "a\x00b"


def open_backend(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if kind == "sqlite":
        return SQLiteStorage(tmp_path / "tuner.db")
    return PostgresStorage(request.getfixturevalue("postgres_url"))


def make_spec(name: str = "text") -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": [
                {"name": "x", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5},
                {"name": "mode", "kind": "categorical", "choices": ["a", "b"], "default": "a"},
            ],
            "objectives": [{"name": "y", "goal": "minimize"}],
            "designer": {"algorithm": "sobol"},
        }
    )


@pytest.fixture(params=BACKENDS)
def served(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[pb_grpc.TunerServiceStub, Storage]]:
    storage = open_backend(request.param, request, tmp_path)
    service = TuningService(storage)
    server, port = build_server(service)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.TunerServiceStub(channel)
    stub.CreateStudy(pb.CreateStudyRequest(spec=convert.spec_to_proto(make_spec())), timeout=30)
    yield stub, storage
    channel.close()
    stop_server(server, None).wait()
    service.close()


def refused(call: Any, request: Any) -> str:
    """The message of a call that must fail INVALID_ARGUMENT (the raw stub: no retries)."""
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value.details() or ""


def test_a_nul_in_a_request_is_invalid_argument_naming_the_field_and_nothing_is_stored(
    served: tuple[pb_grpc.TunerServiceStub, Storage],
) -> None:
    stub, storage = served
    [trial] = stub.SuggestTrials(pb.SuggestTrialsRequest(study="text", count=1), timeout=30).trials
    cases = [
        (stub.SuggestTrials, pb.SuggestTrialsRequest(study="text", count=1, client_id=NUL),
         "client_id"),
        (stub.SuggestTrials, pb.SuggestTrialsRequest(study="text", count=1, request_id=NUL),
         "request_id"),
        (stub.CompleteTrial, pb.CompleteTrialRequest(
            study="text", trial_id=trial.id, status=pb.TRIAL_OUTCOME_FAILED, reason=NUL),
         "reason"),
        (stub.CompleteTrial, pb.CompleteTrialRequest(
            study="text", trial_id=trial.id, status=pb.TRIAL_OUTCOME_COMPLETED,
            metrics={"y": 1.0, "m\x00": 2.0}),
         "metrics['m\\x00']: invalid metric name"),
        (stub.Heartbeat, pb.HeartbeatRequest(study="text", trial_id=trial.id, client_id=NUL),
         "client_id"),
        (stub.ImportTrials, pb.ImportTrialsRequest(study="text", trials=[pb.ImportedTrial(
            config=convert.config_to_proto({"x": 0.1, "mode": "a"}),
            status=pb.TRIAL_OUTCOME_COMPLETED, metrics={"y": 1.0}, source="import:" + NUL)]),
         "trials[0].source"),
        (stub.ImportTrials, pb.ImportTrialsRequest(study="text", trials=[pb.ImportedTrial(
            config=convert.config_to_proto({"x": 0.1, "mode": "a"}),
            status=pb.TRIAL_OUTCOME_FAILED, reason=NUL)]),
         "trials[0].reason"),
        (stub.GetStudy, pb.GetStudyRequest(name=NUL), "study"),
        (stub.ListTrials, pb.ListTrialsRequest(study=NUL), "study"),
        (stub.GetTrial, pb.GetTrialRequest(study=NUL, trial_id=1), "study"),
        (stub.ListMeasurements, pb.ListMeasurementsRequest(study=NUL), "study"),
    ]  # fmt: skip
    for call, request, field in cases:
        message = refused(call, request)
        expected = field if ": " in field else f"{field}: holds a NUL character"
        assert message.startswith(expected), message
    assert [t.status for t in storage.list_trials("text")] == [TrialStatus.ACTIVE]
    assert storage.list_measurements("text") == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            lambda k: k.categorical.values[1].CopyFrom(pb.Value(text=NUL)),
            "spec.knobs[1].choices[1]",
        ),
        (lambda k: setattr(k, "description", NUL), "spec.knobs[1].description"),
        (lambda k: setattr(k, "unit", NUL), "spec.knobs[1].unit"),
    ],
    ids=["choice", "description", "unit"],
)
def test_a_nul_in_a_spec_is_invalid_argument_naming_the_field(
    served: tuple[pb_grpc.TunerServiceStub, Storage], change: Any, field: str
) -> None:
    stub, storage = served
    wire = convert.spec_to_proto(make_spec("other"))
    change(wire.knobs[1])
    message = refused(stub.CreateStudy, pb.CreateStudyRequest(spec=wire))
    assert message.startswith(f"{field}: holds a NUL character"), message
    assert [s.name for s in storage.list_studies()] == ["text"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_unpaired_surrogates_are_refused_in_process_on_both_backends(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A file name with bytes that are not UTF-8 decodes (``os.fsdecode``) to surrogates:
    ``tuner import`` on such a file made a source no backend could store."""
    storage = open_backend(backend, request, tmp_path)
    service = TuningService(storage)
    try:
        service.create_study(make_spec())
        bad = "import:runs-\udcff.csv"
        item = ImportedTrial({"x": 0.2, "mode": "b"}, metrics={"y": 1.0}, source=bad)
        with pytest.raises(ValidationError, match="unpaired surrogate") as info:
            service.import_trials("text", [item])
        assert info.value.field == "trials[0].source"
        with pytest.raises(ValidationError) as info:
            service.suggest_trials("text", 1, client_id="w\ud800")
        assert info.value.field == "client_id"
        [trial] = service.suggest_trials("text", 1)
        with pytest.raises(ValidationError) as info:
            service.complete_trial("text", trial.id, status=TrialStatus.FAILED, reason="\udc80")
        assert info.value.field == "reason"
        # the storage contract refuses it too, for callers other than the service
        with pytest.raises(ValidationError) as info:
            storage.add_trials("text", [NewTrial({"x": 0.3, "mode": "a"}, client_id=NUL)])
        assert info.value.field == "trial.client_id"
        with pytest.raises(ValidationError) as info:
            storage.get_study("\udc80")
        assert info.value.field == "study"
        assert [t.status for t in storage.list_trials("text")] == [TrialStatus.ACTIVE]
    finally:
        service.close()
