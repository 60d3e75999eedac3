"""Hostile requests over real gRPC: generated (hypothesis) and hand-picked worst cases.

Whatever arrives, the server answers with a status that names the problem, never INTERNAL,
stores nothing for a rejected request, and keeps serving.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.app import build_server, stop_server
from server.service import TuningService
from server.storage import SQLiteStorage

OK_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.PERMISSION_DENIED}  # fmt: skip
# a message names a field of the request: `spec.knobs[2].float_range.high: ...`, or
# `metrics[':']: ...` (a bad metric name, quoted in its index, may itself hold a colon)
FIELD = re.compile(r"^(spec|study|name|count|client_id|request_id|trial_id|metrics|status|"
                   r"statuses|reason|request)\b(\[.*?\])?[^:]*: ")  # fmt: skip
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, SQLiteStorage, Any]]:
    storage = SQLiteStorage(Path(tmp_path_factory.mktemp("hostile")) / "tuner.db")
    service = TuningService(storage)
    server, port = build_server(service)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.TunerServiceStub(channel)
    stub.channel = channel  # for raw bytes
    good = pb.StudySpec(
        name="good",
        knobs=[pb.Knob(name="x", float_range=pb.FloatRange(low=0.0, high=1.0))],
        objectives=[pb.Objective(name="y", goal=pb.GOAL_MINIMIZE)],
        designer=pb.DesignerSettings(algorithm="sobol"),
    )
    stub.CreateStudy(pb.CreateStudyRequest(spec=good))
    yield stub, storage, health_pb2_grpc.HealthStub(channel)
    channel.close()
    stop_server(server, None).wait()
    storage.close()


def answer(call: Any, request: Any) -> tuple[grpc.StatusCode, str]:
    try:
        call(request, timeout=60)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def check(code: grpc.StatusCode, message: str) -> None:
    assert code in OK_CODES, (code, message[:500])
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        assert FIELD.match(message), message[:500]
        assert len(message) < 4096  # echoes of huge inputs are cut short


# -- generated requests ----------------------------------------------------------------------

texts = st.one_of(
    st.sampled_from(["x", "y", "tps", "x", "", " ", "a.b", "é", "名字", "x\x00y", "1x"]),
    st.text(max_size=40),
    st.text(alphabet="ab_.-", min_size=120, max_size=140),
)
floats = st.floats(allow_nan=True, allow_infinity=True, width=64)
values = st.one_of(
    st.builds(pb.Value, number=floats),
    st.builds(pb.Value, integer=st.integers(-(2**63), 2**63 - 1)),
    st.builds(pb.Value, text=texts),
    st.builds(pb.Value, flag=st.booleans()),
    st.just(pb.Value()),
)


@st.composite
def knobs(draw: st.DrawFn) -> Any:
    knob = pb.Knob(name=draw(texts))
    kind = draw(st.sampled_from(["float", "int", "categorical", "ordinal", "bool", "none"]))
    if kind == "float":
        knob.float_range.CopyFrom(
            pb.FloatRange(low=draw(floats), high=draw(floats), log=draw(st.booleans()))
        )
    elif kind == "int":
        big = st.integers(-(2**63), 2**63 - 1)
        knob.int_range.CopyFrom(pb.IntRange(low=draw(big), high=draw(big), log=draw(st.booleans())))
    elif kind in ("categorical", "ordinal"):
        getattr(knob, kind).values.extend(draw(st.lists(values, max_size=5)))
    elif kind == "bool":
        knob.bool_knob.CopyFrom(pb.BoolKnob())
    if draw(st.booleans()):
        knob.default_value.CopyFrom(draw(values))
    knob.special_values.extend(draw(st.lists(values, max_size=2)))
    knob.unsafe_values.extend(draw(st.lists(values, max_size=2)))
    return knob


@st.composite
def specs(draw: st.DrawFn) -> Any:
    spec = pb.StudySpec(name=draw(st.one_of(st.just("good"), st.just("fresh"), texts)))
    spec.knobs.extend(draw(st.lists(knobs(), max_size=4)))
    for _ in range(draw(st.integers(0, 3))):
        spec.objectives.append(
            pb.Objective(name=draw(texts), goal=draw(st.integers(-3, 5)))  # unknown enums too
        )
    spec.outcome_constraints.extend(
        draw(st.lists(st.one_of(st.sampled_from(["y <= 3", "nope >= 1", "y <= nan", "<= 2",
                                                 "y <= 0.9 * default"]), texts), max_size=2))
    )  # fmt: skip
    spec.parameter_constraints.extend(
        draw(st.lists(st.sampled_from(["x + y <= 1", "x <= 2", "q * 2 >= 1", "x +"]), max_size=2))
    )
    spec.designer.CopyFrom(
        pb.DesignerSettings(
            algorithm=draw(st.sampled_from(["", "bo", "sobol", "random", "gp-ucb", "BO"])),
            seed=draw(st.integers(-(2**31), 2**31 - 1)),
            random_fraction=draw(floats),
        )
    )
    if draw(st.booleans()):
        spec.designer.initial_trials = draw(st.integers(-(2**31), 2**31 - 1))
    return spec


@SETTINGS
@given(spec=specs())
def test_generated_study_specs_never_answer_internal(served: Any, spec: Any) -> None:
    stub, storage, _ = served
    before = [s.name for s in storage.list_studies()]
    code, message = answer(stub.CreateStudy, pb.CreateStudyRequest(spec=spec))
    check(code, message)
    if code is not grpc.StatusCode.OK:
        assert [s.name for s in storage.list_studies()] == before


@SETTINGS
@given(
    study=st.one_of(st.just("good"), texts),
    count=st.integers(-(2**31), 2**31 - 1),
    client=st.one_of(texts, st.text(min_size=250, max_size=300)),
    trial=st.integers(-(2**63), 2**63 - 1),
    metrics=st.dictionaries(texts, floats, max_size=3),
    status=st.integers(-2, 9),
    reason=st.one_of(texts, st.just("r" * 5000)),
)
def test_generated_trial_requests_never_answer_internal(
    served: Any, study: str, count: int, client: str, trial: int, metrics: dict[str, float],
    status: int, reason: str,
) -> None:  # fmt: skip
    stub, _, _ = served
    ask = pb.SuggestTrialsRequest(study=study, count=count, client_id=client)
    check(*answer(stub.SuggestTrials, ask))
    tell = pb.CompleteTrialRequest(
        study=study, trial_id=trial, metrics=metrics, status=status, reason=reason
    )
    check(*answer(stub.CompleteTrial, tell))
    check(*answer(stub.Heartbeat, pb.HeartbeatRequest(study=study, trial_id=trial)))
    check(*answer(stub.ListTrials, pb.ListTrialsRequest(study=study, statuses=[status])))
    check(*answer(stub.GetTrial, pb.GetTrialRequest(study=study, trial_id=trial)))


# -- hand-picked worst cases -------------------------------------------------------------------


def spec_with(knob_count: int, name: str = "wide", knob_name: str = "k{}") -> Any:
    return pb.StudySpec(
        name=name,
        knobs=[
            pb.Knob(name=knob_name.format(i), float_range=pb.FloatRange(low=0.0, high=1.0))
            for i in range(knob_count)
        ],
        objectives=[pb.Objective(name="y", goal=pb.GOAL_MINIMIZE)],
    )


def with_knob(**fields: Any) -> Any:
    return pb.StudySpec(
        name="one",
        knobs=[pb.Knob(name="k", **fields)],
        objectives=[pb.Objective(name="y", goal=pb.GOAL_MINIMIZE)],
    )


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (spec_with(0), "spec.knobs: needs at least one knob"),
        (spec_with(10_000), "spec.knobs: 10000 knobs"),
        (spec_with(2, knob_name="same"), "spec.knobs[1].name: duplicate knob name"),
        (spec_with(1, knob_name="größe{}"), "spec.knobs[0].name"),
        (spec_with(1, name="x" * 1_000_000), "spec.name"),
        (spec_with(1, knob_name="k" * 500_000 + "{}"), "spec.knobs[0].name"),
        (spec_with(1, name="good\n"), "spec.name"),
        (spec_with(1, knob_name="k{}\n"), "spec.knobs[0].name"),
        (with_knob(float_range=pb.FloatRange(low=-1e308, high=1e308)), "spec.knobs[0].high"),
        (
            with_knob(float_range=pb.FloatRange(low=0, high=1), description="d" * 5000),
            "spec.knobs[0].description",
        ),
        (
            with_knob(
                categorical=pb.Choices(values=[pb.Value(text="c" * 300), pb.Value(text="b")])
            ),
            "spec.knobs[0].choices",
        ),
    ],
    ids=[
        "empty",
        "10000-knobs",
        "duplicate",
        "unicode",
        "huge-name",
        "huge-knob-name",
        "name-newline",
        "knob-name-newline",
        "overflowing-width",
        "huge-description",
        "huge-choice",
    ],
)
def test_worst_case_specs_are_invalid_argument_naming_the_field(
    served: Any, spec: Any, fragment: str
) -> None:
    stub, _, _ = served
    code, message = answer(stub.CreateStudy, pb.CreateStudyRequest(spec=spec))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, message[:300]
    assert message.startswith(fragment), message[:300]
    check(code, message)


def test_nan_and_inf_metrics_and_huge_repeated_fields_are_rejected(served: Any) -> None:
    stub, storage, _ = served
    [trial] = stub.SuggestTrials(pb.SuggestTrialsRequest(study="good", count=1)).trials
    for bad in (math.nan, math.inf, -math.inf):
        tell = pb.CompleteTrialRequest(
            study="good", trial_id=trial.id, metrics={"y": bad}, status=pb.TRIAL_OUTCOME_COMPLETED
        )
        code, message = answer(stub.CompleteTrial, tell)
        assert code is grpc.StatusCode.INVALID_ARGUMENT and message.startswith("metrics.y")
    many = pb.ListTrialsRequest(study="good", statuses=[99] * 100_000)
    code, message = answer(stub.ListTrials, many)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and message.startswith("statuses[0]")
    assert storage.get_trial("good", trial.id).status.value == "ACTIVE"


def test_a_call_creates_at_most_50000_knob_values(served: Any) -> None:
    """5,000 knobs x 100 trials held a server thread for 32 s (stored and sent value by
    value): the count is capped per study, and the error says the study's own cap."""
    stub, storage, _ = served
    spec = spec_with(5000, name="many")
    spec.designer.CopyFrom(pb.DesignerSettings(algorithm="sobol"))
    stub.CreateStudy(pb.CreateStudyRequest(spec=spec))
    code, message = answer(stub.SuggestTrials, pb.SuggestTrialsRequest(study="many", count=11))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith("count: 11 trials of 5000 knobs"), message
    assert "at most 10 trials per call for this study" in message
    assert storage.list_trials("many") == []
    reply = stub.SuggestTrials(pb.SuggestTrialsRequest(study="many", count=10), timeout=60)
    assert len(reply.trials) == 10 and len(reply.trials[0].config) == 5000


def test_undeclared_metrics_are_bounded_in_count_and_name(served: Any) -> None:
    stub, storage, _ = served
    [trial] = stub.SuggestTrials(pb.SuggestTrialsRequest(study="good", count=1)).trials
    for metrics, fragment in (
        ({"y": 1.0, "n" * 2_500_000: 1.0}, "metrics['nnnn"),
        ({"y": 1.0, "bad\n": 1.0}, "metrics['bad\\n']"),
        ({"y": 1.0, **{f"m{i}": 1.0 for i in range(300)}}, "metrics: has 301 metrics"),
    ):
        tell = pb.CompleteTrialRequest(
            study="good", trial_id=trial.id, metrics=metrics, status=pb.TRIAL_OUTCOME_COMPLETED
        )
        code, message = answer(stub.CompleteTrial, tell)
        assert code is grpc.StatusCode.INVALID_ARGUMENT, message[:300]
        assert message.startswith(fragment), message[:300]
        check(code, message)
    assert storage.get_trial("good", trial.id).status.value == "ACTIVE"


GARBAGE = {
    "truncated varint": b"\x08\xff",
    "bad wire type": b"\x0f\x01",
    "length past the end": b"\x0a\x7fabc",
    "group never closed": b"\x0b",
    "random megabytes": random.Random(7).randbytes(3_000_000),
}


@pytest.mark.parametrize("method", [m.name for m in pb.DESCRIPTOR.services_by_name[
    "TunerService"].methods])  # fmt: skip
def test_undecodable_requests_are_invalid_argument_for_every_method(
    served: Any, method: str
) -> None:
    stub, storage, _ = served
    raw = stub.channel.unary_unary(f"/tuner.v1.TunerService/{method}")
    before = len(storage.list_trials("good"))
    for name, data in GARBAGE.items():
        code, message = answer(raw, data)
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (name, code, message[:300])
        assert message.startswith("request: cannot be decoded as a tuner.v1."), message[:300]
        check(code, message)
    assert len(storage.list_trials("good")) == before


@given(data=st.binary(max_size=200))
@SETTINGS
def test_generated_bytes_never_answer_internal(served: Any, data: bytes) -> None:
    stub, _, _ = served
    channel = stub.channel
    for method in ("CreateStudy", "SuggestTrials", "CompleteTrial", "ImportTrials"):
        check(*answer(channel.unary_unary(f"/tuner.v1.TunerService/{method}"), data))


def test_the_server_is_still_serving_after_all_of_it(served: Any) -> None:
    _, _, health = served
    reply = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
