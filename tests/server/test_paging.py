"""Large studies over real gRPC on loopback, on both backends: listings page instead of
exceeding the 4 MiB a client accepts, every size is bounded, and the CLI's reading commands
work against a server whatever a study holds.

The audit's failures: two imports with a 2.5 MB ``source``, or two studies of 10,000
choices x 250 characters, made ``tuner studies/show/export --server`` fail for everyone
("Received message larger than max (5120316 vs. 4194304)").
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest

from cli.main import main
from server import convert, limits
from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.app import build_server, stop_server
from server.client import TunerClient
from server.records import ImportedTrial
from server.service import TuningService
from server.storage import SQLiteStorage, Storage
from server.storage.postgres import PostgresStorage
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, TrialStatus

KNOBS = 8
TRIALS = 1500  # of about 3.1 KB each on the wire: 4.6 MB, more than one reply carries
CHOICES = ["a" * 250, "b" * 250]


class Served:
    """A server on loopback over one backend, with a raw stub and a client."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.service = TuningService(storage)
        self.server, port = build_server(self.service)
        self.server.start()
        self.address = f"127.0.0.1:{port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.TunerServiceStub(self.channel)
        self.client = TunerClient(self.address, retry_for=0)

    def close(self) -> None:
        self.client.close()
        self.channel.close()
        stop_server(self.server, None).wait()
        self.service.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    if request.param == "sqlite":
        storage: Storage = SQLiteStorage(tmp_path_factory.mktemp("paging") / "tuner.db")
    else:
        base = request.getfixturevalue("postgres_server_url")
        schema = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        storage = PostgresStorage(f"{base}&options=-csearch_path%3D{schema}")
    running = Served(storage)
    yield running
    running.close()


def wide_spec(name: str, objectives: int = 1, choices: list[str] = CHOICES) -> StudySpec:
    """Knobs with 128-character names and 250-character choices: big trials."""
    goals = [{"name": f"m{i}", "goal": "minimize"} for i in range(objectives)]
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": [
                {"name": f"k{i}_" + "x" * 124, "kind": "categorical", "choices": choices}
                for i in range(KNOBS)
            ],
            "objectives": goals,
            "designer": {"algorithm": "sobol"},
        }
    )


def config(spec: StudySpec, j: int) -> dict[str, Any]:
    return {name: CHOICES[(j >> i) & 1] for i, name in enumerate(spec.space.names)}


def fill(served: Served, spec: StudySpec) -> None:
    """TRIALS imported trials, 500 a request; metrics m0 = j and m1 = -j, so that with
    two objectives every trial is on the Pareto front."""
    served.client.create_study(spec)
    for start in range(0, TRIALS, 500):
        items = [
            ImportedTrial(config(spec, j), metrics={"m0": float(j), "m1": float(-j)})
            for j in range(start, start + 500)
        ]
        served.client.import_trials(spec.name, items)


@pytest.fixture(scope="module")
def big(served: Served) -> Served:
    """A study of TRIALS big trials and 600 big measurements, and a Pareto front of TRIALS."""
    spec = wide_spec("big")
    fill(served, spec)
    fill(served, wide_spec("front", objectives=2))
    metrics = {f"metric_{i:02d}_" + "z" * 50: float(i) for i in range(100)}
    for kind in (MeasurementKind.CONTROL, MeasurementKind.CONFIRM):
        served.client.add_measurements("big", 1, [Measurement(metrics, kind)] * 300)
    return served


def pages(call: Any, request: Any, field: str) -> list[Any]:
    """Every page of a listing through the raw stub, each reply checked for its size."""
    request.page_size = 10_000
    replies = []
    while True:
        reply = call(request, timeout=60)
        assert reply.ByteSize() <= limits.REPLY_BYTES
        replies.append(reply)
        if not reply.next_page_token:
            break
        request.page_token = reply.next_page_token
    assert len(replies) > 1  # more than one reply carries
    return [item for reply in replies for item in getattr(reply, field)]


def unpaged_is_refused(call: Any, request: Any) -> None:
    """A client from before paging gets INVALID_ARGUMENT naming page_size, not a reply it
    cannot read (RESOURCE_EXHAUSTED on its side) or a partial list."""
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=60)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert (info.value.details() or "").startswith("page_size: unset, and ")


def test_trials_are_listed_page_by_page(big: Served) -> None:
    unpaged_is_refused(big.stub.ListTrials, pb.ListTrialsRequest(study="big"))
    trials = pages(big.stub.ListTrials, pb.ListTrialsRequest(study="big"), "trials")
    assert [t.id for t in trials] == list(range(1, TRIALS + 1))
    assert [t.id for t in big.client.list_trials("big")] == list(range(1, TRIALS + 1))
    done = big.client.list_trials("big", [TrialStatus.COMPLETED])
    assert len(done) == TRIALS and done[-1].config == config(wide_spec("big"), TRIALS - 1)
    assert big.client.list_trials("big", [TrialStatus.ACTIVE]) == []


def test_a_page_holds_page_size_items_and_its_token_continues_it(big: Served) -> None:
    first = big.stub.ListTrials(pb.ListTrialsRequest(study="big", page_size=7), timeout=60)
    assert [t.id for t in first.trials] == list(range(1, 8)) and first.next_page_token
    second = big.stub.ListTrials(
        pb.ListTrialsRequest(study="big", page_size=7, page_token=first.next_page_token),
        timeout=60,
    )
    assert [t.id for t in second.trials] == list(range(8, 15))
    last = big.stub.ListTrials(
        pb.ListTrialsRequest(study="front", page_size=TRIALS), timeout=60
    )  # all of them asked for, fewer given: the reply's size ends the page first
    assert 0 < len(last.trials) < TRIALS and last.next_page_token


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (pb.ListTrialsRequest(study="big", page_token="garbage!"), "is not a page token"),
        (pb.ListTrialsRequest(study="big", page_size=-1), "page_size: got -1"),
        (pb.ListMeasurementsRequest(study="big", page_token="e30"), "is not a page token"),
    ],
    ids=["garbage", "negative", "no-cursor"],
)
def test_a_bad_page_request_is_invalid_argument(big: Served, request_: Any, fragment: str) -> None:
    call = (
        big.stub.ListTrials
        if isinstance(request_, pb.ListTrialsRequest)
        else (big.stub.ListMeasurements)
    )
    with pytest.raises(grpc.RpcError) as info:
        call(request_, timeout=60)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in (info.value.details() or "")


def test_a_token_continues_only_its_own_listing(big: Served) -> None:
    token = big.stub.ListTrials(
        pb.ListTrialsRequest(study="big", page_size=2), timeout=60
    ).next_page_token
    for other in (
        pb.ListTrialsRequest(study="front", page_size=2, page_token=token),
        pb.ListTrialsRequest(study="big", page_size=2, page_token=token,
                             statuses=[pb.TRIAL_STATUS_COMPLETED]),
    ):  # fmt: skip
        with pytest.raises(grpc.RpcError) as info:
            big.stub.ListTrials(other, timeout=60)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith("page_token: continues another listing")


def test_measurements_are_listed_page_by_page(big: Served) -> None:
    unpaged_is_refused(big.stub.ListMeasurements, pb.ListMeasurementsRequest(study="big"))
    found = pages(big.stub.ListMeasurements, pb.ListMeasurementsRequest(study="big"),
                  "measurements")  # fmt: skip
    assert len(found) == 600
    assert [m.kind for m in found] == [pb.MEASUREMENT_KIND_CONTROL] * 300 + [
        pb.MEASUREMENT_KIND_CONFIRM
    ] * 300
    assert len(big.client.list_measurements("big")) == 600
    controls = big.client.list_measurements("big", 1, [MeasurementKind.CONTROL])
    assert len(controls) == 300 and {m.kind for m in controls} == {MeasurementKind.CONTROL}


def test_the_pareto_front_is_listed_page_by_page(big: Served) -> None:
    unpaged_is_refused(big.stub.GetParetoFront, pb.GetParetoFrontRequest(study="front"))
    front = pages(big.stub.GetParetoFront, pb.GetParetoFrontRequest(study="front"), "trials")
    assert [t.id for t in front] == list(range(1, TRIALS + 1))
    assert len(big.client.get_pareto_front("front")) == TRIALS


def test_studies_are_listed_page_by_page_and_a_spec_has_a_bound(served: Served) -> None:
    """Five specs of 0.9 MB: each fits a reply, all five do not. The audit's spec of
    10,000 choices x 250 characters is refused, naming the limit."""
    choices = [f"{i:04d}" + "c" * 246 for i in range(3500)]
    for i in range(5):
        served.client.create_study(menu_spec(f"menu-{i}", choices))
    unpaged_is_refused(served.stub.ListStudies, pb.ListStudiesRequest())
    listed = pages(served.stub.ListStudies, pb.ListStudiesRequest(), "studies")
    names = [s.spec.name for s in listed]
    assert [n for n in names if n.startswith("menu-")] == [f"menu-{i}" for i in range(5)]
    assert [s.spec.name for s in served.client.list_studies()] == names
    huge = menu_spec("huge", [f"{i:05d}" + "c" * 245 for i in range(10_000)])
    with pytest.raises(grpc.RpcError) as info:
        served.stub.CreateStudy(pb.CreateStudyRequest(spec=convert.spec_to_proto(huge)))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    message = info.value.details() or ""
    assert message.startswith("spec: takes 2,5") and "at most 1,048,576" in message, message
    assert "huge" not in [s.name for s in served.storage.list_studies()]


def menu_spec(name: str, choices: list[str]) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": [{"name": "menu", "kind": "categorical", "choices": choices}],
            "objectives": [{"name": "y", "goal": "minimize"}],
        }
    )


def test_an_import_source_has_a_bound(served: Served) -> None:
    """The audit's import of a 2.5 MB source (twice made every listing too big to read)."""
    spec = wide_spec("sourced")
    served.client.create_study(spec)
    trial = pb.ImportedTrial(
        config=convert.config_to_proto(config(spec, 0)),
        status=pb.TRIAL_OUTCOME_COMPLETED,
        metrics={"m0": 1.0},
        source="import:" + "s" * 2_500_000,
    )
    with pytest.raises(grpc.RpcError) as info:
        served.stub.ImportTrials(pb.ImportTrialsRequest(study="sourced", trials=[trial]))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(
        "trials[0].source: is 2500007 characters long (allowed: at most 1024)"
    )
    assert served.storage.list_trials("sourced") == []


def test_reading_commands_work_against_a_server_on_big_studies(
    big: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tuner studies/show/export/measurements/front --server`` on studies whose listings
    take several replies."""
    server = ["--server", big.address]
    capsys.readouterr()
    assert main(["studies", *server, "--json"]) == 0
    studies = json.loads(capsys.readouterr().out)
    assert {"big", "front"} <= {s["study"] for s in studies}
    assert main(["show", "big", *server, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["trials"]) == TRIALS
    assert main(["export", "big", *server, "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert len(exported["trials"]) == TRIALS and len(exported["measurements"]) == 600
    assert main(["measurements", "big", *server, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 600
    assert main(["front", "front", *server, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == TRIALS
