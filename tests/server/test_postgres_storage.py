"""The PostgreSQL backend beyond the conformance suite: its schema and migrations, storage
URLs, two storages (two server replicas) on one database, a server restart under it, a
read-only open, and errors that name the database without its password.

Runs against a real PostgreSQL server (``conftest.postgres_cluster``); skipped where
PostgreSQL is not installed.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from server.storage import NewTrial, Request, SQLiteStorage, migrations, postgres_schema
from server.storage.postgres import PostgresStorage
from server.storage.urls import open_storage, parse, redact
from targets.db.postgres.cluster import Cluster
from tuner.errors import AlreadyExistsError, StateError, StorageError, ValidationError
from tuner.study import StudySpec
from tuner.trial import TrialStatus

CONFIG: dict[str, Any] = {"shared_buffers_mb": 128, "jit": True}


def make_spec() -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "pg-oltp",
            "knobs": [
                {"name": "shared_buffers_mb", "kind": "int", "low": 16, "high": 8192},
                {"name": "jit", "kind": "bool"},
            ],
            "objectives": [{"name": "tps", "goal": "maximize"}],
        }
    )


def test_the_schema_matches_sqlites_migration_for_migration(postgres_url: str) -> None:
    with PostgresStorage(postgres_url) as store:
        assert store.schema_version() == migrations.LATEST_VERSION
        with psycopg.connect(postgres_url) as conn:
            rows = conn.execute("SELECT version, name FROM schema_version ORDER BY 1").fetchall()
    assert rows == [(i + 1, m.__name__) for i, m in enumerate(migrations.MIGRATIONS)]
    assert [name for name, _ in postgres_schema.MIGRATIONS] == [
        m.__name__ for m in migrations.MIGRATIONS
    ]


def test_replicas_starting_at_once_on_an_empty_database_migrate_it_once(
    postgres_url: str,
) -> None:
    with ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda _: PostgresStorage(postgres_url), range(4)))
    try:
        assert {s.schema_version() for s in stores} == {migrations.LATEST_VERSION}
        with psycopg.connect(postgres_url) as conn:
            count = conn.execute("SELECT count(*) FROM schema_version").fetchone()
        assert count == (migrations.LATEST_VERSION,)
    finally:
        for store in stores:
            store.close()


def test_a_newer_schema_is_refused(postgres_url: str) -> None:
    PostgresStorage(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO schema_version VALUES (%s, 'future', 0)", [migrations.LATEST_VERSION + 1]
        )
    for read_only in (False, True):
        with pytest.raises(StorageError, match=f"{migrations.LATEST_VERSION + 1} is newer"):
            PostgresStorage(postgres_url, read_only=read_only)


def test_read_only_reads_and_refuses_every_write(postgres_url: str) -> None:
    with pytest.raises(StorageError, match="version 0 is older"):
        PostgresStorage(postgres_url, read_only=True)
    with PostgresStorage(postgres_url) as writer:
        writer.create_study(make_spec())
        writer.add_trials("pg-oltp", [NewTrial(dict(CONFIG))])
    with PostgresStorage(postgres_url, read_only=True) as reader:
        assert [t.id for t in reader.list_trials("pg-oltp")] == [1]
        with pytest.raises(StorageError, match=r"add trials .*read-only transaction"):
            reader.add_trials("pg-oltp", [NewTrial(dict(CONFIG))])
        with pytest.raises(StorageError, match="read-only"):
            reader.finish_trial("pg-oltp", 1, TrialStatus.COMPLETED, {"tps": 1.0})
        reader.check()  # reading works: a read-only server is healthy
    with PostgresStorage(postgres_url) as writer:
        assert writer.get_trial("pg-oltp", 1).status is TrialStatus.ACTIVE


def test_two_replicas_never_hand_out_a_queued_trial_twice(postgres_url: str) -> None:
    """Two storages on one database, as two servers: 8 threads each claim and finish
    queued trials while others add more; every trial goes to one client, is finished
    once, and the ids have no gaps or repeats."""
    a, b = PostgresStorage(postgres_url), PostgresStorage(postgres_url)
    try:
        a.create_study(make_spec())
        queued = [NewTrial(dict(CONFIG), status=TrialStatus.PENDING) for _ in range(60)]
        a.add_trials("pg-oltp", queued[:30])
        claimed: list[tuple[str, int]] = []
        guard = threading.Lock()

        def work(k: int) -> None:
            store = (a, b)[k % 2]
            if k == 0:  # one thread keeps adding while the others claim
                for i in range(30, 60, 5):
                    store.add_trials("pg-oltp", queued[i : i + 5])
                return
            while True:
                got = store.claim_trials("pg-oltp", f"w{k}", 2, None)
                if not got:
                    if len(store.list_trials("pg-oltp", [TrialStatus.PENDING])) == 0:
                        break
                    continue
                for trial in got:
                    store.finish_trial("pg-oltp", trial.id, TrialStatus.COMPLETED, {"tps": k})
                with guard:
                    claimed.extend((f"w{k}", t.id) for t in got)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(work, range(8)))
        # whatever the adder stored after the claimers stopped is still queued
        rest = a.claim_trials("pg-oltp", "last", 60, None)
        ids = [i for _, i in claimed] + [t.id for t in rest]
        assert sorted(ids) == list(range(1, 61))
        assert Counter(ids).most_common(1)[0][1] == 1
        for trial in b.list_trials("pg-oltp"):
            events = [e.event for e in b.trial_events("pg-oltp", trial.id)]
            assert events.count("status:ACTIVE") == 1
            assert events.count("status:COMPLETED") == (trial.id not in {t.id for t in rest})
    finally:
        a.close()
        b.close()


def test_two_replicas_finish_a_trial_once_and_number_new_trials_without_gaps(
    postgres_url: str,
) -> None:
    a, b = PostgresStorage(postgres_url), PostgresStorage(postgres_url)
    try:
        a.create_study(make_spec())

        def add(k: int) -> list[int]:
            store = (a, b)[k % 2]
            return [t.id for t in store.add_trials("pg-oltp", [NewTrial(dict(CONFIG))] * 3)]

        with ThreadPoolExecutor(8) as pool:
            ids = [i for batch in pool.map(add, range(16)) for i in batch]
        assert sorted(ids) == list(range(1, 49))

        def finish(k: int) -> str:
            try:
                (a, b)[k % 2].finish_trial("pg-oltp", 7, TrialStatus.COMPLETED, {"tps": k})
            except StateError:
                return "refused"
            return "finished"

        with ThreadPoolExecutor(8) as pool:
            outcomes = Counter(pool.map(finish, range(8)))
        assert outcomes == {"finished": 1, "refused": 7}
    finally:
        a.close()
        b.close()


def test_results_are_stored_while_the_study_is_locked_and_an_expiry_waits_for_them(
    postgres_url: str,
) -> None:
    """A result locks its trial, not the study: results for different trials of a study are
    stored side by side (a burst of them does not queue behind itself). An expiry that
    finds a trial whose result is being stored waits for it, then leaves it finished."""
    with PostgresStorage(postgres_url) as store:
        store.create_study(make_spec())
        [t1, t2] = store.add_trials("pg-oltp", [NewTrial(dict(CONFIG), lease_expires_at=1.0)] * 2)
        with psycopg.connect(postgres_url) as other:  # another replica adding trials
            other.execute("SELECT id FROM studies FOR NO KEY UPDATE")
            done = store.finish_trial("pg-oltp", t1.id, TrialStatus.COMPLETED, {"tps": 1.0})
            assert done.status is TrialStatus.COMPLETED
        with psycopg.connect(postgres_url) as other:  # a result for t2 being stored
            other.execute("SELECT 1 FROM trials WHERE trial_id = %s FOR UPDATE", [t2.id])
            other.execute(
                "UPDATE trials SET status = 'COMPLETED', lease_expires_at = NULL "
                "WHERE trial_id = %s", [t2.id]
            )  # fmt: skip
            with ThreadPoolExecutor(1) as pool:
                expiry = pool.submit(
                    store.expire_leases, "pg-oltp", 2.0, TrialStatus.ABANDONED, True
                )
                time.sleep(0.5)
                assert not expiry.done()  # waiting for the trial's lock
                other.commit()
                assert expiry.result(timeout=10) == []
        assert store.get_trial("pg-oltp", t2.id).status is TrialStatus.COMPLETED
        assert [t.id for t in store.list_trials("pg-oltp")] == [t1.id, t2.id]  # no re-offer


def test_a_request_recorded_by_one_replica_is_found_by_the_other(postgres_url: str) -> None:
    with PostgresStorage(postgres_url) as a, PostgresStorage(postgres_url) as b:
        a.create_study(make_spec())
        a.add_trials("pg-oltp", [NewTrial(dict(CONFIG))], Request("r1", "SuggestTrials", "d"))
        assert b.find_request("pg-oltp", "r1") == Request("r1", "SuggestTrials", "d", (1,))
        with pytest.raises(AlreadyExistsError, match="'r1' was answered meanwhile"):
            b.add_trials("pg-oltp", [NewTrial(dict(CONFIG))], Request("r1", "SuggestTrials", "d"))
        assert [t.id for t in b.list_trials("pg-oltp")] == [1]  # the refused write rolled back


def test_the_same_study_created_by_two_replicas_at_once_exists_once(postgres_url: str) -> None:
    stores = [PostgresStorage(postgres_url) for _ in range(4)]
    barrier = threading.Barrier(4)

    def create(store: PostgresStorage) -> str:
        barrier.wait()
        try:
            store.create_study(make_spec())
        except AlreadyExistsError:
            return "exists"
        return "created"

    try:
        with ThreadPoolExecutor(4) as pool:
            assert Counter(pool.map(create, stores)) == {"created": 1, "exists": 3}
        assert [s.name for s in stores[3].list_studies()] == ["pg-oltp"]
    finally:
        for store in stores:
            store.close()


def test_a_server_restart_fails_calls_while_down_and_loses_nothing(
    postgres_cluster: Cluster, postgres_url: str
) -> None:
    """The storage outlives a restart of PostgreSQL: while it is down, every call and the
    health probe raise ``StorageError``; afterwards its broken connections are replaced."""
    with PostgresStorage(postgres_url, connect_timeout_s=2) as store:
        store.create_study(make_spec())
        store.add_trials("pg-oltp", [NewTrial(dict(CONFIG))] * 2)
        store.check()
        postgres_cluster.stop()
        try:
            with pytest.raises(StorageError, match="cannot write to the database"):
                store.check()
            with pytest.raises(StorageError, match="cannot list trials"):
                store.list_trials("pg-oltp")
        finally:
            postgres_cluster.start()
        store.check()
        finished = store.finish_trial("pg-oltp", 2, TrialStatus.COMPLETED, {"tps": 5.0})
        assert finished.metrics == {"tps": 5.0}
        assert [t.id for t in store.list_trials("pg-oltp")] == [1, 2]


def test_errors_name_the_database_without_its_password(postgres_server_url: str) -> None:
    url = f"postgresql://postgres:s3cret@127.0.0.1:{_closed_port()}/tuner"
    with pytest.raises(StorageError) as caught:
        PostgresStorage(url, connect_timeout_s=2)
    message = str(caught.value)
    assert "cannot open the database in postgresql://postgres:***@127.0.0.1" in message
    assert "s3cret" not in message
    # the socket's trust authentication takes any password: one that works, and stays hidden
    works = postgres_server_url.replace("postgres@", "postgres:s3cret@")
    with PostgresStorage(works) as store:
        assert "s3cret" not in repr(store) and "postgres:***@" in repr(store)


def test_a_lock_held_too_long_by_another_replica_is_a_storage_error(postgres_url: str) -> None:
    with PostgresStorage(postgres_url, lock_timeout_s=0.5) as store:
        store.create_study(make_spec())
        with psycopg.connect(postgres_url) as other:  # holds the study's lock
            other.execute("SELECT id FROM studies FOR UPDATE")
            started = time.monotonic()
            with pytest.raises(StorageError, match="lock timeout"):
                store.add_trials("pg-oltp", [NewTrial(dict(CONFIG))])
            assert time.monotonic() - started < 5
        assert store.add_trials("pg-oltp", [NewTrial(dict(CONFIG))])[0].id == 1


# -- storage URLs ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "backend", "target"),
    [
        ("runs/tuner.db", "sqlite", "runs/tuner.db"),
        ("sqlite:///runs/tuner.db", "sqlite", "runs/tuner.db"),
        ("sqlite:////var/lib/tuner.db", "sqlite", "/var/lib/tuner.db"),
        ("postgresql://u@db:5432/t", "postgresql", "postgresql://u@db:5432/t"),
        ("postgres://u@db/t", "postgresql", "postgresql://u@db/t"),
        ("postgresql+psycopg://u@db/t", "postgresql", "postgresql://u@db/t"),
    ],
)
def test_storage_urls_name_their_backend(value: str, backend: str, target: str) -> None:
    url = parse(value)
    assert (url.backend, url.target) == (backend, target)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("mysql://u@db/t", "unknown storage scheme 'mysql'"),
        ("sqlite://", "has no file path"),
        ("sqlite:///", "has no file path"),
        ("", "got ''"),
    ],
)
def test_a_bad_storage_url_names_the_field_and_the_forms(value: str, fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment) as caught:
        parse(value, "db")
    assert caught.value.field == "db"
    assert "postgresql://" in str(caught.value) and "sqlite:///PATH" in str(caught.value)


def test_open_storage_opens_either_backend(tmp_path: Path, postgres_url: str) -> None:
    with open_storage(f"sqlite:///{tmp_path}/a.db") as store:
        assert isinstance(store, SQLiteStorage) and store.path == tmp_path / "a.db"
    with open_storage(postgres_url) as store:
        assert isinstance(store, PostgresStorage)
        store.create_study(make_spec())
    with open_storage(postgres_url, read_only=True) as store:
        assert store.get_study("pg-oltp").spec == make_spec()


def test_a_bad_url_is_named_without_its_password() -> None:
    with pytest.raises(ValidationError) as caught:
        parse("mysql://u:hunter2@h/t")
    assert "hunter2" not in str(caught.value) and "u:***@h" in str(caught.value)


def test_a_client_takes_replicas_as_ip_addresses_and_names_a_hostname() -> None:
    from server.client import TunerClient

    with TunerClient("127.0.0.1:1,127.0.0.1:2", retry_for=0) as client:
        assert client.target == "127.0.0.1:1,127.0.0.1:2"
    with TunerClient("[::1]:1,[::1]:2", retry_for=0):
        pass
    with pytest.raises(ValidationError, match="replica 'db2:50051' is not an IP") as caught:
        TunerClient("10.0.0.5:50051,db2:50051")
    assert caught.value.field == "target" and "dns:///" in str(caught.value)


def test_redact_hides_only_the_password() -> None:
    assert redact("postgresql://u:pw@h:5/d?sslmode=require") == (
        "postgresql://u:***@h:5/d?sslmode=require"
    )
    assert redact("postgresql://u@h/d") == "postgresql://u@h/d"
    assert "pw" not in str(parse("postgresql://u:pw@[::1]:5/d"))


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- the command line ------------------------------------------------------------------------
def test_cli_reads_and_writes_a_postgresql_database(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    with PostgresStorage(postgres_url) as store:
        store.create_study(make_spec())
    assert main(["ask", "pg-oltp", "--db", postgres_url, "--format", "json"]) == 0
    asked = json.loads(capsys.readouterr().out)
    assert main(["tell", "pg-oltp", str(asked["trial"]), "--metric", "tps=12.5",
                 "--db", postgres_url]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["studies", "--db", postgres_url]) == 0
    assert "pg-oltp" in capsys.readouterr().out
    with PostgresStorage(postgres_url, read_only=True) as store:
        (trial,) = store.list_trials("pg-oltp")
    assert trial.status is TrialStatus.COMPLETED and trial.metrics == {"tps": 12.5}


def test_a_bad_db_url_on_the_command_line_names_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cli.main import main

    assert main(["studies", "--db", "mysql://u@h/t"]) != 0
    message = capsys.readouterr().err
    assert "--db" in message and "unknown storage scheme 'mysql'" in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [("sqlite:///runs/a.db", "runs/a.db"), ("runs/b.db", "runs/b.db")],
)
def test_a_session_db_is_a_sqlite_file(tmp_path: Path, value: str, expected: str) -> None:
    from runner.config import load_config

    config = tmp_path / "s.toml"
    config.write_text(SESSION.format(db=value))
    assert load_config(config).db == Path(expected)


def test_a_session_on_postgresql_is_refused_with_the_way_there(tmp_path: Path) -> None:
    from runner.config import load_config

    config = tmp_path / "s.toml"
    config.write_text(SESSION.format(db="postgresql://u@h/t"))
    with pytest.raises(ValidationError, match="tuner serve --db postgresql") as caught:
        load_config(config)
    assert caught.value.field == "session.db"


SESSION = """
[study]
name = "s"
objectives = [{{ name = "ops", goal = "maximize" }}]
[[study.knobs]]
name = "x"
kind = "float"
low = 0.0
high = 1.0
[target]
kind = "command"
command = ["echo", "ops=1"]
metrics = ["ops"]
[session]
db = "{db}"
"""


def test_new_database_is_a_sqlite_flag_and_refused_for_postgresql(postgres_url: str) -> None:
    with pytest.raises(ValidationError, match="applies to a SQLite file") as caught:
        open_storage(postgres_url, new_database=True)
    assert caught.value.field == "new_database"
