"""SQLite-specific behaviour of ``SQLiteStorage``: the file, its pragmas, migrations, failures.

Behaviour every backend shares (ids, life cycle, metric validation, thread safety) is in
``test_storage_contract.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from server.storage import LATEST_VERSION, NewTrial, SQLiteStorage, migrations
from tuner.errors import StorageError, ValidationError
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, TrialStatus

CONFIG: dict[str, Any] = {"workers": 4, "ratio": 0.25, "fsync": False, "mode": "fast"}


def make_spec(name: str = "sqlite-bench") -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": [
                {"name": "workers", "kind": "int", "low": 1, "high": 64},
                {"name": "ratio", "kind": "float", "low": 0.0, "high": 1.0},
                {"name": "fsync", "kind": "bool"},
                {"name": "mode", "kind": "categorical", "choices": ["fast", "safe"]},
            ],
            "objectives": [{"name": "qps", "goal": "maximize"}],
        }
    )


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "tuner.db"


@pytest.fixture
def storage(db_path: Path) -> Iterator[SQLiteStorage]:
    store = SQLiteStorage(db_path)
    store.create_study(make_spec())
    yield store
    store.close()


@contextlib.contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain autocommit connection beside the storage's own, as another process would open."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def populate(store: SQLiteStorage) -> None:
    store.add_trials("sqlite-bench", [NewTrial(dict(CONFIG), client_id="w") for _ in range(3)])
    store.finish_trial("sqlite-bench", 1, TrialStatus.COMPLETED, {"qps": 812.5}, "ok")
    store.finish_trial("sqlite-bench", 2, TrialStatus.INFEASIBLE, {}, "crashed on start")
    store.add_trial_event("sqlite-bench", 3, "reoffered", "to 'w'")


# -- the file and the connection ------------------------------------------------------
def test_database_uses_wal_and_full_sync(storage: SQLiteStorage, db_path: Path) -> None:
    with raw(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # Per-connection settings are only visible on the storage's own connection.
    conn = storage._db
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000


def test_database_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with SQLiteStorage(path) as store:
        store.create_study(make_spec())
        wal = Path(f"{path}-wal")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(wal.stat().st_mode) == 0o600


def test_busy_timeout_waits_for_another_writer(storage: SQLiteStorage, db_path: Path) -> None:
    locked, release = threading.Event(), threading.Event()

    def hold_write_lock() -> None:
        with raw(db_path) as conn:
            conn.execute("BEGIN IMMEDIATE")
            locked.set()
            release.wait(timeout=30)
            conn.execute("COMMIT")

    holder = threading.Thread(target=hold_write_lock)
    holder.start()
    locked.wait(timeout=30)
    with (
        SQLiteStorage(db_path, busy_timeout_s=0) as impatient,
        pytest.raises(StorageError, match="database is locked"),
    ):
        impatient.add_trials("sqlite-bench", [NewTrial(dict(CONFIG))])
    threading.Timer(0.2, release.set).start()
    added = storage.add_trials("sqlite-bench", [NewTrial(dict(CONFIG))])
    holder.join()
    assert [t.id for t in added] == [1]


def test_two_connections_on_one_file_never_duplicate_ids(
    storage: SQLiteStorage, db_path: Path
) -> None:
    other = SQLiteStorage(db_path)
    stores = [storage, other] * 4

    def add_batches(store: SQLiteStorage) -> list[int]:
        return [
            t.id
            for _ in range(5)
            for t in store.add_trials("sqlite-bench", [NewTrial(dict(CONFIG))] * 2)
        ]

    with ThreadPoolExecutor(8) as pool:
        ids = [i for batch in pool.map(add_batches, stores) for i in batch]
    other.close()
    assert sorted(ids) == list(range(1, 81))


# -- persistence and schema versions --------------------------------------------------
def test_reopening_keeps_everything(storage: SQLiteStorage, db_path: Path) -> None:
    populate(storage)
    before = (storage.list_studies(), storage.list_trials("sqlite-bench"))
    events = [storage.trial_events("sqlite-bench", i) for i in (1, 2, 3)]
    storage.close()
    with SQLiteStorage(db_path) as again:
        assert (again.list_studies(), again.list_trials("sqlite-bench")) == before
        assert [again.trial_events("sqlite-bench", i) for i in (1, 2, 3)] == events
        config = again.get_trial("sqlite-bench", 1).config
        assert {k: type(v) for k, v in config.items()} == {
            "workers": int,
            "ratio": float,
            "fsync": bool,
            "mode": str,
        }
        assert again.get_trial("sqlite-bench", 2).reason == "crashed on start"
        assert again.integrity_check() == "ok"


def test_schema_version_is_recorded(storage: SQLiteStorage, db_path: Path) -> None:
    assert storage.schema_version() == LATEST_VERSION == len(migrations.MIGRATIONS)
    with raw(db_path) as conn:
        rows = conn.execute("SELECT version, name FROM schema_version ORDER BY version").fetchall()
    assert rows == [(i + 1, m.__name__) for i, m in enumerate(migrations.MIGRATIONS)]


def test_empty_file_is_migrated_from_version_0(db_path: Path) -> None:
    db_path.touch()
    with Database(db_path) as db:
        assert migrations.current_version(db) == 0
    with SQLiteStorage(db_path) as store:
        assert store.schema_version() == LATEST_VERSION
        store.create_study(make_spec())
        assert store.list_trials("sqlite-bench") == []
    with Database(db_path) as db:
        assert {"studies", "trials", "parameters", "metrics", "trial_events"} <= set(
            db.table_names()
        )
        assert {"idx_trials_study_status", "idx_trials_study_client_status"} <= {
            index.name for index in db.table("trials").indexes
        }


def test_newer_schema_version_is_refused(storage: SQLiteStorage, db_path: Path) -> None:
    storage.close()
    with raw(db_path) as conn:
        conn.execute(
            "INSERT INTO schema_version (version, name, applied_at) VALUES (?, 'future', 0)",
            [LATEST_VERSION + 1],
        )
    for read_only in (False, True):
        with pytest.raises(StorageError, match=f"version {LATEST_VERSION + 1} is newer"):
            SQLiteStorage(db_path, read_only=read_only)


def test_migrate_applies_only_pending_migrations(tmp_path: Path) -> None:
    def v2_add_notes(db: Database) -> None:
        db.execute("ALTER TABLE studies ADD COLUMN notes TEXT NOT NULL DEFAULT ''")

    with Database(tmp_path / "m.db") as db:
        assert migrations.migrate(db, [migrations.v1_initial_schema]) == 1
        assert migrations.migrate(db, [migrations.v1_initial_schema, v2_add_notes]) == 2
        assert migrations.migrate(db, [migrations.v1_initial_schema, v2_add_notes]) == 2
        assert "notes" in db.table("studies").columns_dict
        assert migrations.current_version(db) == 2


def test_failed_migration_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    def v2_broken(db: Database) -> None:
        db.execute("CREATE TABLE half_done (x INTEGER)")
        db.execute("INSERT INTO no_such_table VALUES (1)")

    with Database(tmp_path / "m.db") as db:
        migrations.migrate(db, [migrations.v1_initial_schema])
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            migrations.migrate(db, [migrations.v1_initial_schema, v2_broken])
        assert migrations.current_version(db) == 1
        assert "half_done" not in db.table_names()


# -- failures become StorageError ------------------------------------------------------
def test_file_that_is_not_a_database_raises_storage_error(db_path: Path) -> None:
    db_path.write_bytes(b"these are not the pages you are looking for\n" * 200)
    with pytest.raises(StorageError, match="file is not a database"):
        SQLiteStorage(db_path)


def test_missing_directory_raises_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="cannot create database file"):
        SQLiteStorage(tmp_path / "missing" / "tuner.db")
    with pytest.raises(StorageError, match="no such database file"):
        SQLiteStorage(tmp_path / "absent.db", read_only=True)


def test_read_only_open_reads_but_refuses_writes(storage: SQLiteStorage, db_path: Path) -> None:
    populate(storage)
    before = storage.list_trials("sqlite-bench")
    storage.close()
    with SQLiteStorage(db_path, read_only=True) as reader:
        assert reader.list_trials("sqlite-bench") == before
        with pytest.raises(StorageError, match="readonly database"):
            reader.add_trials("sqlite-bench", [NewTrial(dict(CONFIG))])
        with pytest.raises(StorageError, match=r"finish trial 3 .*readonly database"):
            reader.finish_trial("sqlite-bench", 3, TrialStatus.COMPLETED, {"qps": 1.0})
        with pytest.raises(StorageError, match="readonly database"):
            reader.create_study(make_spec("other"))
    with SQLiteStorage(db_path) as writer:
        assert writer.list_trials("sqlite-bench") == before
        assert [s.name for s in writer.list_studies()] == ["sqlite-bench"]


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root ignores file permissions; the mode=ro test covers this"
)
def test_unwritable_file_raises_storage_error(storage: SQLiteStorage, db_path: Path) -> None:
    storage.close()
    db_path.chmod(0o400)
    db_path.parent.chmod(0o500)
    try:
        with pytest.raises(StorageError, match=str(db_path)):
            store = SQLiteStorage(db_path)
            store.add_trials("sqlite-bench", [NewTrial(dict(CONFIG))])
    finally:
        db_path.parent.chmod(0o700)
        db_path.chmod(0o600)


def test_full_disk_rolls_back_the_whole_batch(storage: SQLiteStorage) -> None:
    populate(storage)
    before = storage.list_trials("sqlite-bench")
    conn = storage._db  # simulate a full disk: cap this connection's file size
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    big = [NewTrial({**CONFIG, "mode": "x" * 4000}) for _ in range(50)]
    with pytest.raises(StorageError, match=r"add trials .* full"):
        storage.add_trials("sqlite-bench", big)
    assert storage.list_trials("sqlite-bench") == before
    assert storage.integrity_check() == "ok"
    conn.execute(f"PRAGMA max_page_count = {2**30}")
    assert storage.add_trials("sqlite-bench", big[:1])[0].id == 4


def test_integrity_check_reports_dangling_rows(storage: SQLiteStorage, db_path: Path) -> None:
    populate(storage)
    with raw(db_path) as conn:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("INSERT INTO metrics VALUES (1, 42, 'qps', 1.0)")
    assert "metrics row" in storage.integrity_check()
    assert "foreign key" in storage.integrity_check()


def test_unreadable_stored_spec_raises_storage_error(storage: SQLiteStorage, db_path: Path) -> None:
    with raw(db_path) as conn:
        conn.execute("UPDATE studies SET spec_json = '{\"name\": 3}'")
    with pytest.raises(StorageError, match="stored spec of study 'sqlite-bench' cannot be read"):
        storage.get_study("sqlite-bench")


def _old_study(db: Database, version: int) -> None:
    """Bring ``db`` to schema ``version`` and store study 1, ``old``, as that version's
    files hold it (the migration tests then add that version's rows)."""
    migrations.migrate(db, migrations.MIGRATIONS[:version])
    spec = make_spec("old")
    db.execute(
        "INSERT INTO studies (id, name, spec_json, fingerprint, created_at) "
        "VALUES (1, 'old', ?, ?, 0)",
        [json.dumps(spec.to_dict()), spec.fingerprint()],
    )


def test_a_version_4_file_gets_step_kinds_from_its_source_labels(tmp_path: Path) -> None:
    """Before v5 a trial said what made it only in free text; the migration reads each old
    label once, and from then on the step is an enum the designer reads."""
    path = tmp_path / "v4.db"
    labels = ["default", "sobol", "bo", "random", "fallback", "import:other", ""]
    with Database(path) as db:
        _old_study(db, 4)
        for i, label in enumerate(labels, 1):
            db.execute(
                "INSERT INTO trials (study_id, trial_id, status, source, created_at, updated_at) "
                "VALUES (1, ?, 'ACTIVE', ?, 0, 0)",
                [i, label],
            )
    with SQLiteStorage(path) as storage:
        trials = storage.list_trials("old")
        assert [t.source for t in trials] == labels  # the labels stay for people
        assert [t.step for t in trials] == [
            StepKind.DEFAULT,
            StepKind.SOBOL,
            StepKind.GLOBAL,
            StepKind.FILL_IN,
            StepKind.FALLBACK,
            StepKind.IMPORT,
            StepKind.IMPORT,
        ]
        (new,) = storage.add_trials("old", [NewTrial({}, source="trend", step=StepKind.TREND)])
        assert storage.get_trial("old", new.id).step is StepKind.TREND


def test_an_unknown_step_kind_is_a_storage_error(storage: SQLiteStorage, db_path: Path) -> None:
    storage.create_study(make_spec("steps"))
    storage.add_trials("steps", [NewTrial({}, step=StepKind.SOBOL)])
    with raw(db_path) as conn:
        conn.execute("UPDATE trials SET step = 'hunch'")
    with pytest.raises(StorageError, match=r"'hunch'.*known: default, sobol"):
        storage.list_trials("steps")
    with pytest.raises(ValidationError, match=r"trial\.step"):
        NewTrial({}, step="sobol")  # type: ignore[arg-type]


def test_a_version_9_file_takes_early_stopped_trials_and_progress_and_keeps_its_rows(
    tmp_path: Path,
) -> None:
    """v10 widens two CHECK constraints in place (SQLite cannot ALTER them, and rebuilding
    ``trials`` would cascade-delete what refers to it): every stored row stays, and the new
    status and measurement kind are taken."""
    path = tmp_path / "v9.db"
    with Database(path) as db:
        _old_study(db, 9)
        for i in (1, 2):
            db.execute(
                "INSERT INTO trials (study_id, trial_id, status, source, created_at, updated_at) "
                "VALUES (1, ?, 'ACTIVE', 'sobol', 0, 0)",
                [i],
            )
        db.execute(
            "INSERT INTO measurements (study_id, trial_id, kind, at, metrics_json) "
            "VALUES (1, 1, 'control', 1, '{\"qps\": 5.0}')"
        )
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            db.execute("UPDATE trials SET status = 'EARLY_STOPPED' WHERE trial_id = 2")
    with SQLiteStorage(path) as storage:
        assert storage.integrity_check() == "ok"
        assert [m.metrics for m in storage.list_measurements("old")] == [{"qps": 5.0}]
        progress = Measurement({"qps": 4.0}, MeasurementKind.PROGRESS, round=1)
        [stored] = storage.add_measurements("old", 2, [progress])
        assert (stored.kind, stored.round) == (MeasurementKind.PROGRESS, 1)
        done = storage.finish_trial(
            "old", 2, TrialStatus.EARLY_STOPPED, {"qps": 4.0}, "stopped early"
        )
        assert done.status is TrialStatus.EARLY_STOPPED and done.reason == "stopped early"
        assert done.windows == 1
    with raw(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert migrations.current_version(conn) == migrations.LATEST_VERSION


def test_a_version_10_file_gives_its_finished_trials_their_windows(tmp_path: Path) -> None:
    """v11 adds ``windows``: a trial finished before counts the progress windows stored for
    it (its controls and repeats are not windows); a trial still ACTIVE counts from 0 and
    takes its number when it finishes."""
    path = tmp_path / "v10.db"
    with Database(path) as db:
        _old_study(db, 10)
        for i, status in ((1, "EARLY_STOPPED"), (2, "COMPLETED"), (3, "ACTIVE")):
            db.execute(
                "INSERT INTO trials (study_id, trial_id, status, source, created_at, updated_at) "
                "VALUES (1, ?, ?, 'sobol', 0, 0)",
                [i, status],
            )
        for trial, kind, n in ((1, "progress", 3), (2, "progress", 10), (2, "control", 2),
                               (3, "progress", 4)):  # fmt: skip
            for number in range(1, n + 1):
                db.execute(
                    "INSERT INTO measurements (study_id, trial_id, kind, round, at, metrics_json) "
                    "VALUES (1, ?, ?, ?, 1, '{\"qps\": 5.0}')",
                    [trial, kind, number if kind == "progress" else 0],
                )
    with SQLiteStorage(path) as storage:
        assert [t.windows for t in storage.list_trials("old")] == [3, 10, 0]
        done = storage.finish_trial("old", 3, TrialStatus.EARLY_STOPPED, {"qps": 4.0}, "slow")
        assert done.windows == 4
        assert [t.windows for t in storage.list_trials("old")] == [3, 10, 4]


def test_a_version_11_file_gives_its_trials_no_transfer_weights(tmp_path: Path) -> None:
    """v12 adds ``transfer_json``: trials written before had no sources (empty weights), and a
    new trial keeps the weights it is given."""
    path = tmp_path / "v11.db"
    with Database(path) as db:
        _old_study(db, 11)
        db.execute(
            "INSERT INTO trials (study_id, trial_id, status, source, created_at, updated_at) "
            "VALUES (1, 1, 'COMPLETED', 'global', 0, 0)"
        )
    with SQLiteStorage(path) as storage:
        assert [t.transfer for t in storage.list_trials("old")] == [()]
        (new,) = storage.add_trials(
            "old", [NewTrial({}, step=StepKind.GLOBAL, transfer=(("", 1.0),))]
        )
        assert storage.get_trial("old", new.id).transfer == (("", 1.0),)
    with raw(path) as conn:
        assert migrations.current_version(conn) == migrations.LATEST_VERSION
