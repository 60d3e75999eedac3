"""Transfer sources over the wire: a study created with ``transfer_from`` through a real
server on 127.0.0.1 (port 0) over a real SQLite file learns from an earlier study stored
there, each model-based trial carries the sources' weights back, a source that is missing is
a warning on the trials (never an error), a source that gains trials is read again, and a
bad ``transfer_from`` is INVALID_ARGUMENT naming its field; ``tuner show`` prints the weights.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
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
from server.service import ImportedTrial, TuningService
from server.storage import SQLiteStorage
from tuner.study import StudySpec
from tuner.trial import StepKind

KNOBS: list[dict[str, Any]] = [
    {"name": f"x{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(3)
]


def _spec(name: str, **extra: Any) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": KNOBS,
            "objectives": [{"name": "y", "goal": "minimize"}],
            "designer": {"seed": 1, "start_with_default": False},
            **extra,
        }
    )


def _bowl(config: dict[str, Any]) -> float:
    return sum((float(config[f"x{i}"]) - 0.3) ** 2 for i in range(3))


def _measured(n: int, seed: int) -> list[ImportedTrial]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        config = {f"x{i}": rng.random() for i in range(3)}
        out.append(ImportedTrial(config, metrics={"y": _bowl(config)}))
    return out


@pytest.fixture
def target(tmp_path: Path) -> Iterator[str]:
    with SQLiteStorage(tmp_path / "tuner.db") as storage:
        service = TuningService(storage)
        server, port = build_server(service)
        server.start()
        yield f"127.0.0.1:{port}"
        stop_server(server, None).wait()
        service.close()


def test_a_study_learns_from_a_stored_study_and_reports_the_weights(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with TunerClient(target) as client:
        client.create_study(_spec("older"))
        client.import_trials("older", _measured(25, 1))
        spec = _spec("newer", transfer_from=["older", "never-made"])
        info, _ = client.create_study(spec)
        assert info.spec.transfer_from == spec.transfer_from  # the wire keeps the sources
        for _ in range(8):
            (trial,) = client.suggest_trials("newer", 1)
            assert "'never-made' not found" in trial.warning
            client.complete_trial("newer", trial.id, {"y": _bowl(trial.config)})
        trials = client.list_trials("newer")
        assert trials[0].step is StepKind.TRANSFER
        model_steps = [t for t in trials if t.step.model_based]
        assert model_steps
        for trial in model_steps:
            weights = dict(trial.transfer)
            assert weights.keys() == {"older", ""} and sum(weights.values()) == pytest.approx(1)
        # the source measures more: the next suggestion reads it again (a new digest)
        client.import_trials("older", _measured(5, 2))
        (trial,) = client.suggest_trials("newer", 1)
        assert dict(trial.transfer).keys() == {"older", ""}
    assert main(["show", "newer", "--server", target]) == 0
    assert "learned from: older" in capsys.readouterr().out


def test_a_bad_transfer_from_is_invalid_argument_naming_the_field(target: str) -> None:
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.TunerServiceStub(channel)
        message = convert.spec_to_proto(_spec("self"))
        message.transfer_from.append(pb.TransferSource(study="self"))
        with pytest.raises(grpc.RpcError) as raised:
            stub.CreateStudy(pb.CreateStudyRequest(spec=message))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "spec.transfer_from[0].study" in str(raised.value.details())
        message = convert.spec_to_proto(_spec("renames"))
        message.transfer_from.append(pb.TransferSource(study="a", knobs={"nope": "x"}))
        with pytest.raises(grpc.RpcError) as raised:
            stub.CreateStudy(pb.CreateStudyRequest(spec=message))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "spec.transfer_from[0].knobs.nope" in str(raised.value.details())
