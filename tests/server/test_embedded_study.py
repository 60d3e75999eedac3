"""LlamaTune studies through the service, the SQLite file and gRPC: points stored, replayed."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from server.app import build_server, stop_server
from server.client import TunerClient
from server.service import TuningService
from server.storage import SQLiteStorage, migrations
from server.storage.base import NewTrial
from tuner.embedding import HeSBOEmbedding
from tuner.errors import ValidationError
from tuner.study import StudySpec
from tuner.trial import StepKind, TrialStatus

KNOBS: list[dict[str, Any]] = [
    {"name": f"k{i}", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5} for i in range(8)
] + [
    {"name": "vacuum", "kind": "int", "low": -1, "high": 100000, "default": -1,
     "special_values": [-1]},
    {"name": "mode", "kind": "categorical", "choices": ["a", "b"], "default": "a"},
]  # fmt: skip


def make_spec(name: str = "llama", **embedding: Any) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": KNOBS,
            "objectives": [{"name": "tps", "goal": "maximize"}],
            "outcome_constraints": ["p95_ms <= 0.9"],
            "designer": {"seed": 11, "initial_trials": 6},
            "embedding": {"kind": "llamatune", "dims": 3, **embedding},
        }
    )


def measure(config: dict[str, Any]) -> dict[str, float]:
    return {"tps": 100 * config["k0"] + 10 * (config["mode"] == "b"), "p95_ms": config["k1"]}


def step(service: TuningService, study: str, count: int = 1) -> list[Any]:
    trials = service.suggest_trials(study, count, client_id="w")
    for trial in trials:
        service.complete_trial(study, trial.id, measure(trial.config))
    return trials


@pytest.fixture
def service(tmp_path: Path) -> Iterator[TuningService]:
    opened = TuningService(SQLiteStorage(tmp_path / "tuner.db"))
    yield opened
    opened.close()


def test_trials_store_their_low_dimensional_point(service: TuningService) -> None:
    spec = make_spec()
    service.create_study(spec)
    trials = step(service, "llama", 1) + step(service, "llama", 3)
    assert trials[0].step is StepKind.DEFAULT and trials[0].embedded == ()
    assert spec.embedding is not None
    embedding = HeSBOEmbedding(spec.space, spec.embedding)
    for trial in service.list_trials("llama")[1:]:
        assert len(trial.embedded) == 3
        assert embedding.project(trial.embedded) == trial.config


def test_a_restarted_server_rebuilds_the_embedding_and_continues_identically(
    tmp_path: Path,
) -> None:
    db, copy = tmp_path / "tuner.db", tmp_path / "copy.db"
    with closing(TuningService(SQLiteStorage(db))) as first:
        first.create_study(make_spec())
        for _ in range(4):
            step(first, "llama")
    shutil.copy(db, copy)  # a closed file: the WAL has been checkpointed into it
    results = []
    for path in (db, copy):
        with closing(TuningService(SQLiteStorage(path))) as service:
            assert service.get_study("llama").spec == make_spec()  # dims and seed stored
            results.append([(t.config, t.embedded, t.step) for t in step(service, "llama", 4)])
    assert results[0] == results[1]
    assert [step for _, _, step in results[0]] == [StepKind.SOBOL] * 3 + [StepKind.GLOBAL]


def test_a_stalled_study_grows_its_embedding_and_a_restart_resumes_at_that_level(
    tmp_path: Path,
) -> None:
    """tps stops improving after the design: every 2 trials without progress the embedding
    doubles (3 -> 6 -> 10 coordinates); the level is rebuilt from the stored trials."""
    spec = make_spec(grow_after=2)
    assert spec.embedding is not None

    def flat(config: dict[str, Any]) -> dict[str, float]:
        return {"tps": 50.0, "p95_ms": 0.5}

    db, copy = tmp_path / "tuner.db", tmp_path / "copy.db"
    with closing(TuningService(SQLiteStorage(db))) as service:
        service.create_study(spec)
        for _ in range(11):
            (trial,) = service.suggest_trials("llama", 1, client_id="w")
            service.complete_trial("llama", trial.id, flat(trial.config))
        stored = service.list_trials("llama")
    # default, 6 design points, then 2 trials per level: 3, 3, 6, 6, then 10
    assert [len(t.embedded) for t in stored] == [0] + [3] * 8 + [6, 6]
    for trial in stored[1:]:
        level = (3, 6, 10).index(len(trial.embedded))
        embedding = HeSBOEmbedding(spec.space, spec.embedding, level)
        assert embedding.project(trial.embedded) == trial.config
    shutil.copy(db, copy)
    results = []
    for path in (db, copy):
        with closing(TuningService(SQLiteStorage(path))) as service:
            (trial,) = service.suggest_trials("llama", 1, client_id="w")
            results.append((trial.config, trial.embedded))
    assert results[0] == results[1] and len(results[0][1]) == 10


def test_embedded_points_are_validated_before_they_are_stored(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as err:
        NewTrial({"k0": 0.1}, embedded=(0.1, math.nan))
    assert err.value.field == "trial.embedded[1]"
    with SQLiteStorage(tmp_path / "t.db") as storage:
        storage.create_study(make_spec())
        (trial,) = storage.add_trials("llama", [NewTrial({"k0": 0.1}, embedded=(0.5, -1.0, 1.0))])
        assert storage.get_trial("llama", trial.id).embedded == (0.5, -1.0, 1.0)


def test_a_version_1_file_is_upgraded_and_its_trials_have_no_point(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with Database(path) as db:
        migrations.migrate(db, [migrations.v1_initial_schema])
        spec = make_spec().to_dict()
        db.execute(
            "INSERT INTO studies (id, name, spec_json, fingerprint, created_at) "
            "VALUES (1, 'llama', ?, ?, 0)",
            [json.dumps(spec), make_spec().fingerprint()],
        )
        db.execute(
            "INSERT INTO trials (study_id, trial_id, status, created_at, updated_at) "
            "VALUES (1, 1, 'ACTIVE', 0, 0)"
        )
        db.execute("INSERT INTO parameters VALUES (1, 1, 'k0', '0.25')")
    with SQLiteStorage(path) as storage:
        assert storage.schema_version() == migrations.LATEST_VERSION
        (trial,) = storage.list_trials("llama")
        assert trial.embedded == () and trial.config == {"k0": 0.25}
    with sqlite3.connect(path) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(trials)")]
    assert "embedded_json" in columns


def test_grpc_carries_the_embedding_and_the_points(tmp_path: Path) -> None:
    with closing(TuningService(SQLiteStorage(tmp_path / "tuner.db"))) as service:
        server, port = build_server(service)
        server.start()
        try:
            with TunerClient(f"127.0.0.1:{port}") as client:
                info, created = client.create_study(make_spec(grow_after=7))
                assert created and info.spec == make_spec(grow_after=7)
                (default,) = client.suggest_trials("llama", 1, "w")
                client.complete_trial("llama", default.id, {"tps": 1.0, "p95_ms": 0.5})
                (second,) = client.suggest_trials("llama", 1, "w")
                assert default.embedded == ()
                assert len(second.embedded) == 3
                assert client.get_trial("llama", second.id).embedded == second.embedded
                assert client.get_trial("llama", second.id).status is TrialStatus.ACTIVE
        finally:
            stop_server(server, None).wait()
