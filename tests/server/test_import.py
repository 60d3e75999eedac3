"""Warm start: ImportTrials / ``tuner import`` add measured configurations the model uses
from the next suggestion on; a bad trial rejects the whole request, naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from cli.main import main
from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.app import build_server, stop_server
from server.client import TunerClient
from server.service import ImportedTrial, TuningService
from server.storage import NewTrial, SQLiteStorage
from tuner.errors import ValidationError
from tuner.study import StudySpec
from tuner.trial import TrialStatus


def make_spec(name: str = "warm", **extra: Any) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": [
                {"name": "x", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.1},
                {"name": "mode", "kind": "categorical", "choices": ["a", "b"], "default": "a"},
            ],
            "objectives": [{"name": "y", "goal": "minimize"}],
            "designer": {"seed": 2, "initial_trials": 5, "start_with_default": False},
            **extra,
        }
    )


def y(x: float, mode: str) -> float:
    return (x - 0.7) ** 2 + (0.0 if mode == "b" else 0.3)


def measured(count: int) -> list[ImportedTrial]:
    points = [(i / (count - 1), "ab"[i % 2]) for i in range(count)]
    return [ImportedTrial({"x": x, "mode": m}, metrics={"y": y(x, m)}) for x, m in points]


@pytest.fixture
def service(tmp_path: Path) -> Any:
    service = TuningService(SQLiteStorage(tmp_path / "tuner.db"))
    service.create_study(make_spec())
    yield service
    service.close()


def test_imported_trials_drive_the_model_from_the_next_suggestion(service: Any) -> None:
    stored = service.import_trials("warm", measured(21))
    assert [t.status for t in stored] == [TrialStatus.COMPLETED] * 21
    assert {t.source for t in stored} == {"import"} and stored[0].id == 1
    events = service.storage.trial_events("warm", 1)
    assert [e.event for e in events] == ["created"] and "imported" in events[0].detail
    [next_trial] = service.suggest_trials("warm", 1, "w1")
    assert next_trial.step.model_based  # no Sobol design: the imports are the design
    assert next_trial.config["mode"] == "b" and abs(next_trial.config["x"] - 0.7) < 0.15


def test_one_bad_trial_rejects_the_request_and_stores_nothing(service: Any) -> None:
    trials = measured(5)
    trials[3] = ImportedTrial({"x": 1.5, "mode": "a"}, metrics={"y": 1.0})
    with pytest.raises(ValidationError) as caught:
        service.import_trials("warm", trials)
    assert caught.value.field == "trials[3].config.x"
    no_metric = [ImportedTrial({"x": 0.5, "mode": "a"})]
    with pytest.raises(ValidationError) as caught:
        service.import_trials("warm", no_metric)
    assert caught.value.field == "trials[0].metrics.y"
    no_reason = [ImportedTrial({"x": 0.5, "mode": "a"}, TrialStatus.INFEASIBLE)]
    with pytest.raises(ValidationError) as caught:
        service.import_trials("warm", no_reason)
    assert caught.value.field == "trials[0].reason"
    with pytest.raises(ValidationError) as caught:
        service.import_trials("warm", [])
    assert caught.value.field == "trials"
    assert service.list_trials("warm") == []


def test_a_study_in_an_embedding_refuses_imports(tmp_path: Path) -> None:
    service = TuningService(SQLiteStorage(tmp_path / "e.db"))
    try:
        knobs = [{"name": f"k{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(6)]
        spec = StudySpec.from_dict(
            {"name": "emb", "knobs": knobs, "objectives": [{"name": "y", "goal": "minimize"}],
             "embedding": {"kind": "llamatune", "dims": 2}}
        )  # fmt: skip
        service.create_study(spec)
        with pytest.raises(ValidationError, match="embedding") as caught:
            service.import_trials("emb", [ImportedTrial({f"k{i}": 0.5 for i in range(6)},
                                                        metrics={"y": 1.0})])  # fmt: skip
        assert caught.value.field == "trials"
    finally:
        service.close()


def test_import_over_grpc_is_safe_to_retry_and_names_bad_fields(service: Any) -> None:
    server, port = build_server(service)
    server.start()
    try:
        with TunerClient(f"127.0.0.1:{port}") as client:
            stored = client.import_trials("warm", measured(3))
            assert [t.id for t in stored] == [1, 2, 3]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.TunerServiceStub(channel)
            request = pb.ImportTrialsRequest(
                study="warm",
                trials=[pb.ImportedTrial(
                    config=[pb.Parameter(name="x", value=pb.Value(number=0.2)),
                            pb.Parameter(name="mode", value=pb.Value(text="b"))],
                    status=pb.TRIAL_OUTCOME_COMPLETED, metrics={"y": 0.25},
                )],
                request_id="import-1",
            )  # fmt: skip
            first = stub.ImportTrials(request)
            assert stub.ImportTrials(request) == first
            request.trials[0].status = 0
            request.request_id = ""
            with pytest.raises(grpc.RpcError) as caught:
                stub.ImportTrials(request)
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details().startswith("trials[0].status")
        assert len(service.list_trials("warm")) == 4
    finally:
        stop_server(server, None).wait()


CSV = """x,mode,y,status,reason,when
0.2,a,0.55,,,monday
0.7,b,0.0,COMPLETED,,tuesday
0.9,b,,INFEASIBLE,crashed,wednesday
"""


def test_tuner_import_reads_a_csv_and_copies_another_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "cli.db"
    study = tmp_path / "study.toml"
    study.write_text(
        '[study]\nname = "warm"\nobjectives = [{ name = "y", goal = "minimize" }]\n'
        '[[study.knobs]]\nname = "x"\nkind = "float"\nlow = 0.0\nhigh = 1.0\n'
        '[[study.knobs]]\nname = "mode"\nkind = "categorical"\nchoices = ["a", "b"]\n'
    )
    table = tmp_path / "old.csv"
    table.write_text(CSV)
    assert main(["create", str(study), "--db", str(db)]) == 0
    assert main(["import", "warm", "--csv", str(table), "--db", str(db)]) == 0
    out = capsys.readouterr()
    assert "imported 3 trials into warm (2 COMPLETED, 1 INFEASIBLE): ids 1-3" in out.out
    assert "ignoring columns when" in out.err
    assert main(["create", str(study), "--name", "warm2", "--db", str(db)]) == 0
    assert main(["import", "warm2", "--from-study", "warm", "--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["show", "warm2", "--json", "--db", str(db)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [t["status"] for t in shown["trials"]] == ["COMPLETED", "COMPLETED", "INFEASIBLE"]
    assert shown["trials"][2]["reason"] == "crashed"
    assert {t["source"] for t in shown["trials"]} == {"import:warm"}
    table.write_text("x,mode,y\n0.2,a,0.5\n0.3,c,0.1\n")
    assert main(["import", "warm", "--csv", str(table), "--db", str(db)]) == 1
    assert "csv line 3, column mode" in capsys.readouterr().err


def test_tuner_import_makes_a_transfer_source_of_an_exported_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An export from another machine (another database) becomes a study here, without its
    embedding, that a new study names in ``transfer_from``; a file that is no export is an
    error naming ``--export``."""
    there, here = tmp_path / "there.db", tmp_path / "here.db"
    study = tmp_path / "study.toml"
    study.write_text(
        '[study]\nname = "old"\nobjectives = [{ name = "y", goal = "minimize" }]\n'
        'embedding = { kind = "llamatune", dims = 1 }\n'
        '[[study.knobs]]\nname = "x"\nkind = "float"\nlow = 0.0\nhigh = 1.0\n'
        '[[study.knobs]]\nname = "z"\nkind = "float"\nlow = 0.0\nhigh = 1.0\n'
    )
    assert main(["create", str(study), "--db", str(there)]) == 0
    with SQLiteStorage(there) as storage:  # an embedded study refuses imports: fill it directly
        for x, z, y in ((0.1, 0.5, 3.0), (0.4, 0.5, 1.0), (0.8, 0.1, 2.0)):
            (trial,) = storage.add_trials("old", [NewTrial({"x": x, "z": z})])
            storage.finish_trial("old", trial.id, TrialStatus.COMPLETED, {"y": y})
    exported = tmp_path / "old.json"
    exporting = ["export", "old", "--format", "json", "--out", str(exported), "--db", str(there)]
    assert main(exporting) == 0
    assert main(["import", "tpcc", "--export", str(exported), "--db", str(here)]) == 0
    assert "imported 3 trials into tpcc (3 COMPLETED)" in capsys.readouterr().out
    with SQLiteStorage(here) as storage:
        made = storage.get_study("tpcc").spec
        assert made.embedding is None and made.space.names == ("x", "z")
        assert {t.source for t in storage.list_trials("tpcc")} == {"import:old"}
    table = tmp_path / "old.csv"
    table.write_text("not json")
    assert main(["import", "tpcc", "--export", str(table), "--db", str(here)]) == 1
    assert "--export" in capsys.readouterr().err
