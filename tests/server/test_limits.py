"""A study's total size and every reply's size are bounded (``server.limits``), over real
gRPC on loopback, on both backends: a request that would pass a bound is INVALID_ARGUMENT
naming the field and the limit, and nothing of it is stored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest

from server import convert, limits
from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.app import build_server, stop_server
from server.service import TuningService
from server.storage import SQLiteStorage, Storage
from server.storage.postgres import PostgresStorage
from tuner.study import StudySpec


@pytest.fixture(params=["sqlite", "postgresql"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[pb_grpc.TunerServiceStub, Storage]]:
    if request.param == "sqlite":
        storage: Storage = SQLiteStorage(tmp_path_factory.mktemp("limits") / "tuner.db")
    else:
        base = request.getfixturevalue("postgres_server_url")
        schema = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        storage = PostgresStorage(f"{base}&options=-csearch_path%3D{schema}")
    service = TuningService(storage)
    server, port = build_server(service)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield pb_grpc.TunerServiceStub(channel), storage
    channel.close()
    stop_server(server, None).wait()
    service.close()


def create(stub: pb_grpc.TunerServiceStub, spec: StudySpec) -> None:
    stub.CreateStudy(pb.CreateStudyRequest(spec=convert.spec_to_proto(spec)), timeout=60)


def refused(call: Any, request: Any) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=120)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value.details() or ""


def small_spec(name: str) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": [{"name": "x", "kind": "float", "low": 0.0, "high": 1.0}],
            "objectives": [{"name": "y", "goal": "minimize"}],
            "designer": {"algorithm": "sobol"},
        }
    )


def imported(x: float) -> Any:
    return pb.ImportedTrial(
        config=convert.config_to_proto({"x": x}),
        status=pb.TRIAL_OUTCOME_COMPLETED,
        metrics={"y": x},
    )


def test_a_full_study_refuses_growth_but_hands_back_and_finishes_its_trials(
    served: tuple[pb_grpc.TunerServiceStub, Storage], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the study at its limit (here lowered to what it holds, so the test need not
    store 64 Mi characters): new trials, imports and measurements are refused naming the
    field; a worker still gets its trial back and reports it (its result fits the room
    its trial kept), but not a result larger than that room."""
    stub, storage = served
    create(stub, small_spec("full"))
    stub.ImportTrials(pb.ImportTrialsRequest(study="full", trials=[imported(0.5)]), timeout=60)
    ask = pb.SuggestTrialsRequest(study="full", count=1, client_id="w")
    [held] = stub.SuggestTrials(ask, timeout=60).trials
    [other] = stub.SuggestTrials(
        pb.SuggestTrialsRequest(study="full", count=1, client_id="v"), timeout=60
    ).trials
    size = storage.stored_size("full")
    assert size.unfinished == 2
    monkeypatch.setattr(
        limits, "MAX_STUDY_CHARS", size.chars + size.unfinished * limits.RESULT_RESERVE
    )
    before = (len(storage.list_trials("full")), len(storage.list_measurements("full")))

    message = refused(stub.SuggestTrials, pb.SuggestTrialsRequest(study="full", count=1))
    assert message.startswith("count: 1 new trial would add about"), message
    assert f"past a study's limit of {limits.MAX_STUDY_CHARS:,} characters" in message
    assert "a new study for further trials" in message
    message = refused(
        stub.ImportTrials, pb.ImportTrialsRequest(study="full", trials=[imported(0.25)])
    )
    assert message.startswith("trials: 1 trial would add about"), message
    control = pb.Measurement(kind=pb.MEASUREMENT_KIND_CONTROL, metrics={"y": 1.0})
    message = refused(
        stub.AddMeasurements,
        pb.AddMeasurementsRequest(study="full", trial_id=1, measurements=[control]),
    )
    assert message.startswith("measurements: 1 measurement would add about"), message
    assert (len(storage.list_trials("full")), len(storage.list_measurements("full"))) == before

    # the study being full takes nothing from a worker: its trial comes back, and its result
    # is stored, within the room the trial kept for it
    assert [t.id for t in stub.SuggestTrials(ask, timeout=60).trials] == [held.id]
    done = stub.CompleteTrial(
        pb.CompleteTrialRequest(
            study="full",
            trial_id=held.id,
            client_id="w",
            status=pb.TRIAL_OUTCOME_COMPLETED,
            metrics={"y": 0.1},
        ),
        timeout=60,
    )
    assert done.status == pb.TRIAL_STATUS_COMPLETED
    repeats = [
        pb.Measurement(metrics={f"reading_{i:03d}_{'r' * 40}": 1.0 for i in range(60)} | {"y": 1.0})
        for _ in range(3)
    ]  # about 3 x 60 x 50 characters: more than a trial keeps for its result
    big = pb.CompleteTrialRequest(
        study="full",
        trial_id=other.id,
        client_id="v",
        status=pb.TRIAL_OUTCOME_COMPLETED,
        measurements=repeats,
    )
    message = refused(stub.CompleteTrial, big)
    assert message.startswith("measurements: this result would add about"), message
    assert storage.get_trial("full", other.id).status.value == "ACTIVE"
    small = pb.CompleteTrialRequest(
        study="full",
        trial_id=other.id,
        client_id="v",
        status=pb.TRIAL_OUTCOME_COMPLETED,
        metrics={"y": 0.2},
    )
    assert stub.CompleteTrial(small, timeout=60).status == pb.TRIAL_STATUS_COMPLETED


def test_a_study_holds_the_limit_and_not_more(
    served: tuple[pb_grpc.TunerServiceStub, Storage], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Imports fill a study up to the limit, the one that would pass it is refused, and what
    the study holds then is under the limit (counted as ``stored_size`` counts)."""
    stub, storage = served
    create(stub, small_spec("filled"))
    monkeypatch.setattr(limits, "MAX_STUDY_CHARS", storage.stored_size("filled").chars + 20_000)
    batch = pb.ImportTrialsRequest(study="filled", trials=[imported(i / 100) for i in range(50)])
    imports = 0
    with pytest.raises(grpc.RpcError) as info:
        for _ in range(100):
            stub.ImportTrials(batch, timeout=60)
            imports += 1
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert imports >= 1
    assert len(storage.list_trials("filled")) == 50 * imports
    assert storage.stored_size("filled").chars <= limits.MAX_STUDY_CHARS


def test_a_suggestion_whose_reply_would_not_fit_is_refused_saying_how_many_fit(
    served: tuple[pb_grpc.TunerServiceStub, Storage],
) -> None:
    """400 knobs of 128-character names and 250-character choices: 100 trials are 15 MB,
    though only 40,000 knob values (under the 50,000 a call may create). Before, the server
    created the 100 trials and the client could not read the reply."""
    stub, storage = served
    spec = StudySpec.from_dict(
        {
            "name": "wide",
            "knobs": [
                {
                    "name": f"k{i:03d}_" + "x" * 123,
                    "kind": "categorical",
                    "choices": ["a" * 250, "b" * 250],
                }
                for i in range(400)
            ],
            "objectives": [{"name": "y", "goal": "minimize"}],
            "designer": {"algorithm": "random"},
        }
    )
    create(stub, spec)
    message = refused(stub.SuggestTrials, pb.SuggestTrialsRequest(study="wide", count=100))
    assert message.startswith("count: 100 trials of study 'wide' may take"), message
    assert storage.list_trials("wide") == []
    fits = int(message.split("at most ")[1].split(" trials per call")[0])
    assert 1 < fits < 100
    reply = stub.SuggestTrials(pb.SuggestTrialsRequest(study="wide", count=fits), timeout=120)
    assert len(reply.trials) == fits and reply.ByteSize() <= limits.REPLY_BYTES


def test_a_write_whose_reply_would_not_fit_is_refused_and_stores_nothing(
    served: tuple[pb_grpc.TunerServiceStub, Storage],
) -> None:
    """An import of 10,000 trials in a 3.9 MB request made a 4.5 MB reply: stored, and the
    client could not read the answer (a retry would import it all again). The same for
    1,000 measurements whose reply is the request and their times."""
    stub, storage = served
    spec = StudySpec.from_dict(
        {
            "name": "echo",
            "knobs": [
                {"name": name, "kind": "categorical", "choices": ["a" * 170, "b"]}
                for name in ("p", "q")
            ],
            "objectives": [{"name": "y", "goal": "minimize"}],
        }
    )
    create(stub, spec)
    trial = pb.ImportedTrial(
        config=convert.config_to_proto({"p": "a" * 170, "q": "a" * 170}),
        status=pb.TRIAL_OUTCOME_COMPLETED,
        metrics={"y": 1.0},
    )
    request = pb.ImportTrialsRequest(study="echo", trials=[trial] * 10_000)
    assert 3_700_000 < request.ByteSize() < 4 * 2**20  # the server takes the request
    message = refused(stub.ImportTrials, request)
    assert message.startswith("trials: 10000 trials would make a reply of about"), message
    assert storage.list_trials("echo") == []
    stub.ImportTrials(pb.ImportTrialsRequest(study="echo", trials=[trial]), timeout=60)

    metrics = {f"m{i:03d}_" + "v" * 98: 1.0 for i in range(36)}
    controls = [pb.Measurement(kind=pb.MEASUREMENT_KIND_CONTROL, metrics=metrics)] * 1000
    request_ = pb.AddMeasurementsRequest(study="echo", trial_id=1, measurements=controls)
    assert 4 * 2**20 - 20_000 < request_.ByteSize() < 4 * 2**20, request_.ByteSize()
    message = refused(stub.AddMeasurements, request_)
    assert message.startswith("measurements: 1000 measurements would make a reply"), message
    assert storage.list_measurements("echo") == []


def test_the_largest_spec_fits_a_reply(served: tuple[pb_grpc.TunerServiceStub, Storage]) -> None:
    """Numbers are longer on the wire than in JSON (0.5 is 3 characters, a double 9 bytes):
    a spec of short float candidates near MAX_SPEC_CHARS is still at most twice its JSON on
    the wire, so GetStudy and ListStudies answer it."""
    stub, _ = served
    levels = [0.0, 0.25, 0.5, 0.75, 1.0]
    names = "abcdef"
    candidates = [
        {n: levels[(i // 5**k) % 5] for k, n in enumerate(names)} for i in range(5 ** len(names))
    ]
    spec = StudySpec.from_dict(
        {
            "name": "dense",
            "knobs": [{"name": n, "kind": "float", "low": 0.0, "high": 1.0} for n in names],
            "objectives": [{"name": "y", "goal": "minimize"}],
            "designer": {"start_with_default": False},
            "candidates": candidates,
        }
    )
    chars = len(json.dumps(spec.to_dict(), allow_nan=False))
    assert 0.8 * limits.MAX_SPEC_CHARS < chars <= limits.MAX_SPEC_CHARS
    create(stub, spec)
    study = stub.GetStudy(pb.GetStudyRequest(name="dense"), timeout=60)
    assert len(study.spec.candidates) == 5**6
    assert chars < study.ByteSize() <= 2 * chars < limits.REPLY_BYTES
