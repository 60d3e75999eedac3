"""Measurements over the wire: a trial's repeats (CompleteTrial), controls and confirmation
rounds (AddMeasurements) and ListMeasurements, through a real server on 127.0.0.1, port 0,
over a real SQLite file.

Wire-level checks go through the generated stub (so malformed messages reach the server);
the domain-level flow goes through ``TunerClient``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from server import convert
from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.app import build_server, stop_server
from server.client import TunerClient
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.errors import NotFoundError, StateError, StorageError, ValidationError
from tuner.space import FloatKnob, IntKnob, SearchSpace
from tuner.study import DesignerSettings, Goal, Objective, StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, Trial, TrialStatus

StatusCode = grpc.StatusCode
STUDY = "noisy"
REPEAT, CONTROL, CONFIRM = MeasurementKind.REPEAT, MeasurementKind.CONTROL, MeasurementKind.CONFIRM

SPEC = StudySpec(
    name=STUDY,
    space=SearchSpace(
        (
            FloatKnob("cache_frac", low=0.0, high=1.0, default=0.5),
            IntKnob("threads", low=1, high=64, default=4),
        )
    ),
    objectives=(Objective("tps", Goal.MAXIMIZE),),
    designer=DesignerSettings(algorithm="sobol", seed=3, start_with_default=True),
)


# -- fixtures ----------------------------------------------------------------------------


class LosesReplies(TuningService):
    """Stores measurements, then fails the reply of the first ``lost`` AddMeasurements and
    CompleteTrial calls with UNAVAILABLE: the client cannot know whether they were stored."""

    def __init__(self, storage: SQLiteStorage, lost: int = 0) -> None:
        super().__init__(storage)
        self.lost = lost
        self.calls = 0

    def _maybe_lose(self) -> None:
        self.calls += 1
        if self.calls <= self.lost:
            raise StorageError("connection reset after commit")

    def add_measurements(self, *args: Any, **kwargs: Any) -> list[Measurement]:
        stored = super().add_measurements(*args, **kwargs)
        self._maybe_lose()
        return stored

    def complete_trial(self, *args: Any, **kwargs: Any) -> Trial:
        trial = super().complete_trial(*args, **kwargs)
        self._maybe_lose()
        return trial


@pytest.fixture
def service(tmp_path: Path) -> Iterator[LosesReplies]:
    with SQLiteStorage(tmp_path / "tuner.db") as storage:
        service = LosesReplies(storage)
        yield service
        service.close()


@pytest.fixture
def target(service: LosesReplies) -> Iterator[str]:
    server, port = build_server(service)
    server.start()
    yield f"127.0.0.1:{port}"
    stop_server(server, None).wait()


@pytest.fixture
def stub(target: str) -> Iterator[pb_grpc.TunerServiceStub]:
    with grpc.insecure_channel(target) as channel:
        yield pb_grpc.TunerServiceStub(channel)


@pytest.fixture
def client(target: str) -> Iterator[TunerClient]:
    with TunerClient(target, timeout=30.0, retry_for=10.0) as opened:
        opened.create_study(SPEC)
        yield opened


def rpc_error(call: Callable[..., Any], request: Any, code: grpc.StatusCode) -> str:
    """Call, expect ``code``, and return the status message."""
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    error: Any = info.value
    assert error.code() is code, error.details()
    return str(error.details())


def finished_default(client: TunerClient) -> Trial:
    """The study's first trial, the default configuration, completed once."""
    (trial,) = client.suggest_trials(STUDY, 1, "w")
    assert trial.step is StepKind.DEFAULT
    return client.complete_trial(STUDY, trial.id, {"tps": 100.0})


def wire(*values: float, kind: int = pb.MEASUREMENT_KIND_UNSPECIFIED) -> list[pb.Measurement]:
    return [pb.Measurement(kind=kind, metrics={"tps": v}) for v in values]  # type: ignore[arg-type]


# -- a trial's repeats -------------------------------------------------------------------


def test_completing_with_repeats_stores_their_mean_spread_and_number(client: TunerClient) -> None:
    (trial,) = client.suggest_trials(STUDY, 1, "w")
    values = [100.0, 110.0, 96.0]
    repeats = [
        Measurement({"tps": values[0]}, at=1_700_000_000.25),
        Measurement({"tps": values[1]}, at=1_700_000_060.5),
        Measurement({"tps": values[2]}),  # unset: stamped by the server
    ]
    before = time.time()
    done = client.complete_trial(STUDY, trial.id, measurements=repeats)
    assert done.status is TrialStatus.COMPLETED
    assert done.metrics == pytest.approx({"tps": statistics.fmean(values)})
    assert done.repeats == 3
    assert done.spread == pytest.approx({"tps": statistics.stdev(values)})
    assert client.get_trial(STUDY, trial.id) == done

    listed = client.list_measurements(STUDY, trial.id)
    assert [m.metrics for m in listed] == [{"tps": v} for v in values]
    assert {m.kind for m in listed} == {REPEAT}
    assert {m.trial_id for m in listed} == {trial.id}
    assert [m.at for m in listed[:2]] == [1_700_000_000.25, 1_700_000_060.5]
    assert before - 1 <= listed[2].at <= time.time() + 1
    assert client.list_measurements(STUDY) == listed
    assert client.list_measurements(STUDY, kinds=[CONTROL, CONFIRM]) == []


def test_a_trial_measured_once_has_one_repeat_and_no_spread(client: TunerClient) -> None:
    default = finished_default(client)
    assert (default.repeats, default.spread) == (1, {})
    assert client.list_measurements(STUDY, default.id) == []
    (trial,) = client.suggest_trials(STUDY, 1, "w")
    single = client.complete_trial(STUDY, trial.id, measurements=[Measurement({"tps": 5.0})])
    assert (single.metrics, single.repeats, single.spread) == ({"tps": 5.0}, 1, {})


def test_an_unset_kind_in_complete_trial_means_repeat(
    stub: pb_grpc.TunerServiceStub, client: TunerClient
) -> None:
    (trial,) = client.suggest_trials(STUDY, 1, "w")
    request = pb.CompleteTrialRequest(
        study=STUDY,
        trial_id=trial.id,
        status=pb.TRIAL_OUTCOME_COMPLETED,
        measurements=wire(1.0, 3.0) + wire(2.0, kind=pb.MEASUREMENT_KIND_REPEAT),
        client_id="w",
    )
    reply = stub.CompleteTrial(request, timeout=30)
    assert (reply.metrics["tps"], reply.repeats) == (2.0, 3)
    assert reply.spread["tps"] == pytest.approx(statistics.stdev([1.0, 3.0, 2.0]))
    listed = stub.ListMeasurements(pb.ListMeasurementsRequest(study=STUDY), timeout=30)
    assert [m.kind for m in listed.measurements] == [pb.MEASUREMENT_KIND_REPEAT] * 3
    assert all(m.HasField("at") and m.trial_id == trial.id for m in listed.measurements)


def test_a_retried_complete_trial_stores_its_repeats_once(
    service: LosesReplies, client: TunerClient
) -> None:
    (trial,) = client.suggest_trials(STUDY, 1, "w")
    service.lost = 1  # the first reply is lost after the repeats were stored
    done = client.complete_trial(
        STUDY, trial.id, measurements=[Measurement({"tps": 1.0}), Measurement({"tps": 2.0})]
    )
    assert service.calls == 2
    assert (done.metrics, done.repeats) == ({"tps": 1.5}, 2)
    assert len(client.list_measurements(STUDY, trial.id)) == 2


# -- controls and confirmation rounds ----------------------------------------------------


def test_controls_and_confirmations_of_the_finished_default(client: TunerClient) -> None:
    default = finished_default(client)
    (other,) = client.suggest_trials(STUDY, 1, "w")
    client.complete_trial(STUDY, other.id, measurements=[Measurement({"tps": 7.0})] * 2)

    controls = client.add_measurements(
        STUDY,
        default.id,
        [
            Measurement({"tps": 98.0}, CONTROL, at=1_700_000_100.0),
            Measurement({"tps": 91.0}, CONTROL),
        ],
    )
    assert [m.metrics for m in controls] == [{"tps": 98.0}, {"tps": 91.0}]
    assert [(m.kind, m.trial_id) for m in controls] == [(CONTROL, default.id)] * 2
    assert controls[0].at == 1_700_000_100.0
    assert controls[1].at > 0  # stamped by the server
    confirms = client.add_measurements(
        STUDY,
        default.id,
        [
            Measurement({"tps": 97.0}, CONFIRM, round=1),
            Measurement({"tps": 99.0}, CONFIRM, round=2),
        ],
    )
    assert [(m.kind, m.round) for m in confirms] == [(CONFIRM, 1), (CONFIRM, 2)]

    assert client.list_measurements(STUDY, default.id) == controls + confirms
    assert client.list_measurements(STUDY, kinds=[CONTROL]) == controls
    assert client.list_measurements(STUDY, default.id, kinds={CONFIRM}) == confirms
    everything = client.list_measurements(STUDY)
    assert [m.kind for m in everything] == [REPEAT, REPEAT, CONTROL, CONTROL, CONFIRM, CONFIRM]
    assert [m.trial_id for m in everything[:2]] == [other.id, other.id]
    # the trial itself does not change
    assert client.get_trial(STUDY, default.id) == default


def test_a_retried_add_measurements_stores_them_once_and_answers_as_before(
    service: LosesReplies, client: TunerClient
) -> None:
    default = finished_default(client)
    service.calls, service.lost = 0, 1  # stored, but the reply is lost
    added = client.add_measurements(
        STUDY, default.id, [Measurement({"tps": 1.0}, CONTROL), Measurement({"tps": 2.0}, CONTROL)]
    )
    assert service.calls == 2  # the client retried with the same request id
    assert [m.metrics for m in added] == [{"tps": 1.0}, {"tps": 2.0}]
    assert client.list_measurements(STUDY, default.id, [CONTROL]) == added


def test_an_add_measurements_request_id_used_for_other_measurements_is_refused(
    service: LosesReplies,
) -> None:
    service.create_study(SPEC)
    (trial,) = service.suggest_trials(STUDY, 1, "w")
    service.complete_trial(STUDY, trial.id, {"tps": 1.0})
    first = service.add_measurements(STUDY, trial.id, [Measurement({"tps": 3.0}, CONTROL)], "m-1")
    again = service.add_measurements(STUDY, trial.id, [Measurement({"tps": 3.0}, CONTROL)], "m-1")
    assert again == first
    with pytest.raises(ValidationError) as caught:
        service.add_measurements(STUDY, trial.id, [Measurement({"tps": 4.0}, CONTROL)], "m-1")
    assert caught.value.field == "request_id"
    assert service.list_measurements(STUDY, trial.id, [CONTROL]) == first


def test_list_measurements_over_the_wire_filters_by_kind(
    stub: pb_grpc.TunerServiceStub, client: TunerClient
) -> None:
    default = finished_default(client)
    client.add_measurements(STUDY, default.id, [Measurement({"tps": 1.0}, CONTROL)])
    client.add_measurements(STUDY, default.id, [Measurement({"tps": 2.0}, CONFIRM, round=1)])
    request = pb.ListMeasurementsRequest(study=STUDY, kinds=[pb.MEASUREMENT_KIND_CONFIRM])
    reply = stub.ListMeasurements(request, timeout=30)
    assert [(m.kind, m.round, dict(m.metrics)) for m in reply.measurements] == [
        (pb.MEASUREMENT_KIND_CONFIRM, 1, {"tps": 2.0})
    ]
    request = pb.ListMeasurementsRequest(study=STUDY, kinds=[pb.MEASUREMENT_KIND_UNSPECIFIED])
    message = rpc_error(stub.ListMeasurements, request, StatusCode.INVALID_ARGUMENT)
    assert message.startswith("kinds[0]: is required")
    request = pb.ListMeasurementsRequest(study=STUDY, kinds=[42])  # type: ignore[list-item]
    message = rpc_error(stub.ListMeasurements, request, StatusCode.INVALID_ARGUMENT)
    assert message.startswith("kinds[0]: unknown value 42")


# -- errors ------------------------------------------------------------------------------


def _both(request: pb.CompleteTrialRequest) -> None:
    request.metrics["tps"] = 1.0


def _mismatched(request: pb.CompleteTrialRequest) -> None:
    request.measurements[1].metrics["p95_ms"] = 3.0


def _nan(request: pb.CompleteTrialRequest) -> None:
    request.measurements[2].metrics["tps"] = math.nan


def _control(request: pb.CompleteTrialRequest) -> None:
    request.measurements[0].kind = pb.MEASUREMENT_KIND_CONTROL


def _unknown_kind(request: pb.CompleteTrialRequest) -> None:
    request.measurements[1].kind = 42  # type: ignore[assignment]


def _other_trial(request: pb.CompleteTrialRequest) -> None:
    request.measurements[0].trial_id = request.trial_id + 1


def _negative_round(request: pb.CompleteTrialRequest) -> None:
    request.measurements[2].round = -1


def _before_1970(request: pb.CompleteTrialRequest) -> None:
    request.measurements[1].at.FromSeconds(-5)


def _failed(request: pb.CompleteTrialRequest) -> None:
    request.status = pb.TRIAL_OUTCOME_FAILED
    request.reason = "crashed"


@pytest.mark.parametrize(
    ("corrupt", "field_"),
    [
        (_both, "metrics"),
        (_mismatched, "measurements[1].metrics"),
        (_nan, "measurements[2].metrics.tps"),
        (_control, "measurements[0].kind"),
        (_unknown_kind, "measurements[1].kind"),
        (_other_trial, "measurements[0].trial_id"),
        (_negative_round, "measurements[2].round"),
        (_before_1970, "measurements[1].at"),
        (_failed, "measurements"),
    ],
    ids=lambda value: getattr(value, "__name__", value).strip("_"),
)
def test_bad_repeats_are_invalid_argument_naming_the_field(
    stub: pb_grpc.TunerServiceStub,
    client: TunerClient,
    corrupt: Callable[[pb.CompleteTrialRequest], None],
    field_: str,
) -> None:
    (trial,) = client.suggest_trials(STUDY, 1, "w")
    request = pb.CompleteTrialRequest(
        study=STUDY,
        trial_id=trial.id,
        status=pb.TRIAL_OUTCOME_COMPLETED,
        measurements=wire(1.0, 2.0, 3.0),
        request_id="complete-once",
    )
    corrupt(request)
    message = rpc_error(stub.CompleteTrial, request, StatusCode.INVALID_ARGUMENT)
    assert message.startswith(f"{field_}: "), message
    assert client.get_trial(STUDY, trial.id).status is TrialStatus.ACTIVE
    assert client.list_measurements(STUDY) == []


def test_the_client_raises_the_field_of_a_bad_repeat(client: TunerClient) -> None:
    (trial,) = client.suggest_trials(STUDY, 1, "w")
    repeats = [Measurement({"tps": 1.0}), Measurement({"tps": 2.0, "p95_ms": 3.0})]
    with pytest.raises(ValidationError) as info:
        client.complete_trial(STUDY, trial.id, measurements=repeats)
    assert info.value.field == "measurements[1].metrics"
    with pytest.raises(ValidationError) as info:
        client.complete_trial(STUDY, trial.id, {"tps": 1.0}, measurements=repeats[:1])
    assert info.value.field == "metrics"
    with pytest.raises(ValidationError) as info:  # checked before any call
        client.complete_trial(STUDY, trial.id, measurements=[Measurement({}, "often")])  # type: ignore[arg-type]
    assert info.value.field == "measurements[0].kind"


@pytest.mark.parametrize(
    ("measurements", "field_", "allowed"),
    [
        (wire(1.0, kind=pb.MEASUREMENT_KIND_REPEAT), "measurements[0].kind", "CompleteTrial"),
        (wire(1.0, 2.0), "measurements[0].kind", "MEASUREMENT_KIND_CONFIRM"),
        (
            wire(1.0, 2.0, kind=pb.MEASUREMENT_KIND_CONTROL)
            + wire(math.inf, kind=pb.MEASUREMENT_KIND_CONTROL),
            "measurements[2].metrics.tps",
            "finite",
        ),
        ([], "measurements", "1 to 1000"),
    ],
    ids=["repeat", "unset-kind", "infinite", "none"],
)
def test_bad_added_measurements_are_invalid_argument_naming_the_field(
    stub: pb_grpc.TunerServiceStub,
    client: TunerClient,
    measurements: list[pb.Measurement],
    field_: str,
    allowed: str,
) -> None:
    default = finished_default(client)
    request = pb.AddMeasurementsRequest(study=STUDY, trial_id=default.id, measurements=measurements)
    message = rpc_error(stub.AddMeasurements, request, StatusCode.INVALID_ARGUMENT)
    assert message.startswith(f"{field_}: "), message
    assert allowed in message
    assert client.list_measurements(STUDY) == []


def test_the_client_raises_the_field_of_a_bad_added_measurement(client: TunerClient) -> None:
    default = finished_default(client)
    with pytest.raises(ValidationError, match="CompleteTrial") as info:
        client.add_measurements(STUDY, default.id, [Measurement({"tps": 1.0}, REPEAT)])
    assert info.value.field == "measurements[0].kind"
    assert "MEASUREMENT_KIND_CONTROL" in str(info.value)


def test_adding_to_an_active_trial_is_failed_precondition(
    stub: pb_grpc.TunerServiceStub, client: TunerClient
) -> None:
    (trial,) = client.suggest_trials(STUDY, 1, "w")
    request = pb.AddMeasurementsRequest(
        study=STUDY, trial_id=trial.id, measurements=wire(1.0, kind=pb.MEASUREMENT_KIND_CONTROL)
    )
    assert "ACTIVE" in rpc_error(stub.AddMeasurements, request, StatusCode.FAILED_PRECONDITION)
    with pytest.raises(StateError, match="ACTIVE"):
        client.add_measurements(STUDY, trial.id, [Measurement({"tps": 1.0}, CONTROL)])
    assert client.list_measurements(STUDY) == []


def test_an_unknown_trial_or_study_is_not_found(
    stub: pb_grpc.TunerServiceStub, client: TunerClient
) -> None:
    control = wire(1.0, kind=pb.MEASUREMENT_KIND_CONTROL)
    request = pb.AddMeasurementsRequest(study=STUDY, trial_id=999, measurements=control)
    assert "999" in rpc_error(stub.AddMeasurements, request, StatusCode.NOT_FOUND)
    request = pb.ListMeasurementsRequest(study=STUDY, trial_id=999)
    rpc_error(stub.ListMeasurements, request, StatusCode.NOT_FOUND)
    request = pb.ListMeasurementsRequest(study="no-such-study")
    rpc_error(stub.ListMeasurements, request, StatusCode.NOT_FOUND)
    with pytest.raises(NotFoundError):
        client.add_measurements(STUDY, 999, [Measurement({"tps": 1.0}, CONTROL)])
    with pytest.raises(NotFoundError):
        client.list_measurements(STUDY, 999)
    with pytest.raises(NotFoundError):
        client.list_measurements("no-such-study")


def test_measurements_round_trip_through_the_client_converters(client: TunerClient) -> None:
    default = finished_default(client)
    sent = [Measurement({"tps": 1.5, "p95_ms": 2.25}, CONFIRM, at=1_700_000_000.123456, round=3)]
    (stored,) = client.add_measurements(STUDY, default.id, sent)
    assert stored == Measurement(
        {"tps": 1.5, "p95_ms": 2.25}, CONFIRM, at=stored.at, round=3, trial_id=default.id
    )
    assert stored.at == pytest.approx(1_700_000_000.123456, abs=1e-6)
    assert convert.measurement_from_proto(convert.measurement_to_proto(stored), "m") == stored
