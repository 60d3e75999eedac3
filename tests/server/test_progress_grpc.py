"""Progress and early stopping over the wire: ReportProgress, ShouldStop and CompleteTrial
with EARLY_STOPPED, through a real server on 127.0.0.1, port 0, over a real SQLite file;
then ``tuner report`` and ``tuner tell --early-stopped`` as an ask/tell script runs them.

Wire-level checks go through the generated stub (so malformed requests reach the server),
the flow through ``TunerClient``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from cli.main import main
from server import convert
from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.app import build_server, stop_server
from server.client import TunerClient
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.errors import PermissionDeniedError, StateError, ValidationError
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, TrialStatus

StatusCode = grpc.StatusCode
STUDY = "stop"
SPEC = StudySpec.from_dict(
    {
        "name": STUDY,
        "knobs": [{"name": "x", "kind": "float", "low": 0, "high": 1, "default": 0.5}],
        "objectives": [{"name": "tps", "goal": "maximize"}],
        "outcome_constraints": ["p95_ms <= 5"],
        "designer": {"algorithm": "sobol", "seed": 3},
        "stopping": {"early_stop": True, "confidence": 0.99, "min_windows": 4},
    }
)


@pytest.fixture
def target(tmp_path: Path) -> Iterator[str]:
    with SQLiteStorage(tmp_path / "tuner.db") as storage:
        service = TuningService(storage)
        server, port = build_server(service)
        server.start()
        yield f"127.0.0.1:{port}"
        stop_server(server, None).wait()
        service.close()


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
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    error: Any = info.value
    assert error.code() is code, error.details()
    return str(error.details())


def with_incumbent(client: TunerClient) -> int:
    """Complete the default at 1000 tps and hand out the next trial to ``w``; its id."""
    (default,) = client.suggest_trials(STUDY, 1, "w")
    assert default.step is StepKind.DEFAULT
    client.complete_trial(STUDY, default.id, {"tps": 1000.0, "p95_ms": 2.0}, client_id="w")
    controls = [Measurement({"tps": v, "p95_ms": 2.0}, MeasurementKind.CONTROL)
                for v in (980.0, 1020.0, 1005.0)]  # fmt: skip
    client.add_measurements(STUDY, default.id, controls)  # the run-to-run noise
    (trial,) = client.suggest_trials(STUDY, 1, "w")
    return trial.id


def test_the_stopping_settings_travel_with_the_spec(client: TunerClient) -> None:
    assert convert.spec_from_proto(convert.spec_to_proto(SPEC)) == SPEC
    assert client.get_study(STUDY).spec.stopping == SPEC.stopping
    plain = StudySpec.from_dict({**SPEC.to_dict(), "name": "plain", "stopping": {}})
    assert not convert.spec_to_proto(plain).HasField("stopping")


def test_a_losing_trial_is_told_to_stop_and_ends_early_stopped(client: TunerClient) -> None:
    trial = with_incumbent(client)
    answers = [
        client.report_progress(STUDY, trial, {"tps": 500.0 + i, "p95_ms": 2.0}, "w")
        for i in range(5)
    ]
    assert [a.stop for a in answers] == [False, False, False, True, True]
    assert [a.windows for a in answers] == [1, 2, 3, 4, 5]
    assert "tps cannot beat trial 1's 1000" in answers[-1].reason
    assert client.should_stop(STUDY, trial).stop
    done = client.complete_trial(
        STUDY, trial, {"tps": 502.0, "p95_ms": 2.0}, TrialStatus.EARLY_STOPPED,
        answers[-1].reason, client_id="w",
    )  # fmt: skip
    assert done.status is TrialStatus.EARLY_STOPPED and done.metrics["tps"] == 502.0
    assert done.windows == 5  # its fidelity, which the model weighs
    assert client.get_trial(STUDY, trial).windows == 5
    windows = client.list_measurements(STUDY, trial, [MeasurementKind.PROGRESS])
    assert [(m.round, m.metrics["tps"]) for m in windows] == [(i + 1, 500.0 + i) for i in range(5)]
    with pytest.raises(StateError, match="not ACTIVE"):
        client.report_progress(STUDY, trial, {"tps": 1.0}, "w")


def test_a_winning_trial_and_the_default_go_on(client: TunerClient) -> None:
    (default,) = client.suggest_trials(STUDY, 1, "w")
    slow = [client.report_progress(STUDY, default.id, {"tps": 1.0, "p95_ms": 50.0}, "w")
            for _ in range(6)]  # fmt: skip
    assert not any(a.stop for a in slow)  # never the default, however it measures
    client.complete_trial(STUDY, default.id, {"tps": 1000.0, "p95_ms": 2.0}, client_id="w")
    (trial,) = client.suggest_trials(STUDY, 1, "w")
    ahead = [client.report_progress(STUDY, trial.id, {"tps": 1100.0 + 5 * i, "p95_ms": 2.0}, "w")
             for i in range(8)]  # fmt: skip
    assert not any(a.stop for a in ahead)


def test_only_the_holder_reports_and_bad_windows_name_the_field(
    client: TunerClient, stub: pb_grpc.TunerServiceStub
) -> None:
    trial = with_incumbent(client)
    with pytest.raises(PermissionDeniedError, match="handed to client 'w'"):
        client.report_progress(STUDY, trial, {"tps": 1.0}, "other")
    request = pb.ReportProgressRequest(study=STUDY, trial_id=trial, client_id="other",
                                       metrics={"tps": 1.0})  # fmt: skip
    rpc_error(stub.ReportProgress, request, StatusCode.PERMISSION_DENIED)
    bad = pb.ReportProgressRequest(study=STUDY, trial_id=trial, client_id="w",
                                   metrics={"tps": float("nan")})  # fmt: skip
    assert "metrics.tps" in rpc_error(stub.ReportProgress, bad, StatusCode.INVALID_ARGUMENT)
    with pytest.raises(ValidationError, match=r"metrics\.tps"):
        client.report_progress(STUDY, trial, {"tps": float("inf")}, "w")
    missing = pb.ShouldStopRequest(study="nope", trial_id=1)
    rpc_error(stub.ShouldStop, missing, StatusCode.NOT_FOUND)
    unknown = pb.ReportProgressRequest(study=STUDY, trial_id=99, client_id="w",
                                       metrics={"tps": 1.0})  # fmt: skip
    rpc_error(stub.ReportProgress, unknown, StatusCode.NOT_FOUND)
    assert client.list_measurements(STUDY, trial, [MeasurementKind.PROGRESS]) == []


def test_progress_windows_are_not_taken_by_add_measurements(
    client: TunerClient, stub: pb_grpc.TunerServiceStub
) -> None:
    trial = with_incumbent(client)
    request = pb.AddMeasurementsRequest(
        study=STUDY, trial_id=trial,
        measurements=[pb.Measurement(kind=pb.MEASUREMENT_KIND_PROGRESS, metrics={"tps": 1.0})],
    )  # fmt: skip
    message = rpc_error(stub.AddMeasurements, request, StatusCode.INVALID_ARGUMENT)
    assert "ReportProgress" in message


def test_an_ask_tell_script_reports_windows_and_tells_an_early_stop(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tuner report`` prints the answer per window; ``tuner tell --early-stopped`` ends
    the trial with the metrics of the part that ran."""

    def tuner(*args: str) -> str:
        code = main([*args, "--server", target])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        return captured.out.strip()

    with TunerClient(target, timeout=30.0) as client:
        client.create_study(SPEC)
        trial = with_incumbent(client)
    window = ["--metric", "p95_ms=2", "--client-id", "w"]
    lines = [tuner("report", STUDY, str(trial), "--metric", f"tps={400 + i}", *window)
             for i in range(4)]  # fmt: skip
    assert lines[0] == "go on (1 windows reported)" and lines[-1].startswith("stop: ")
    answer = json.loads(tuner("report", STUDY, str(trial), "--metric", "tps=401", *window,
                              "--json"))  # fmt: skip
    assert answer["stop"] is True and answer["windows"] == 5
    told = tuner("tell", STUDY, str(trial), "--early-stopped", answer["reason"], "--metric",
                 "tps=402", *window)  # fmt: skip
    assert told == f"trial {trial} EARLY_STOPPED"


def test_a_numbered_window_sent_twice_is_stored_once_and_a_gap_is_refused(
    client: TunerClient, stub: pb_grpc.TunerServiceStub
) -> None:
    trial = with_incumbent(client)
    first = client.report_progress(STUDY, trial, {"tps": 900.0}, "w", window=1)
    again = client.report_progress(STUDY, trial, {"tps": 900.0}, "w", window=1)  # a retry
    assert (first.windows, again.windows) == (1, 1)
    gap = pb.ReportProgressRequest(study=STUDY, trial_id=trial, client_id="w", window=3,
                                   metrics={"tps": 1.0})  # fmt: skip
    message = rpc_error(stub.ReportProgress, gap, StatusCode.INVALID_ARGUMENT)
    assert "window 3 after 1 reported windows" in message and "1 to 2" in message
    assert client.report_progress(STUDY, trial, {"tps": 910.0}, "w", window=2).windows == 2
    assert client.report_progress(STUDY, trial, {"tps": 905.0}, "w").windows == 3  # 0: next
    stored = client.list_measurements(STUDY, trial, [MeasurementKind.PROGRESS])
    assert [(m.round, m.metrics["tps"]) for m in stored] == [(1, 900.0), (2, 910.0), (3, 905.0)]
