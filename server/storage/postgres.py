"""The PostgreSQL storage backend: studies and trials in a PostgreSQL database that several
``tuner serve`` replicas may share.

Every ``Storage`` method is ``server.storage.sql.SQLStorage``'s; this module adds the
connections, the transactions and the locks that make sharing safe:

* **Connections.** A small pool (``pool_size``) of psycopg connections in autocommit
  mode, opened on demand and shared by the gRPC threads; a connection that breaks (the
  server restarted, the network dropped) is closed and replaced on the next call, so a
  storage outlives a restart of PostgreSQL. Every connection sets ``lock_timeout``: a write
  waiting for a lock longer than that fails with ``StorageError`` instead of hanging.
* **Transactions.** A write is one ``BEGIN ... COMMIT`` at READ COMMITTED that rolls back
  on any error. A read is ``REPEATABLE READ READ ONLY``, one snapshot.
* **Locks across replicas.** Every write of a study but a claim first locks the study's
  row (``FOR NO KEY UPDATE``): trial numbering (``MAX(trial_id) + 1``), the life-cycle
  check of ``finish_trial`` and lease expiry see every earlier write of that study, as
  SQLite's single writer does. ``claim_trials`` takes queued trials ``FOR UPDATE SKIP
  LOCKED``, so two replicas claiming at once get different trials. The study lock does not
  conflict with the ``KEY SHARE`` locks foreign keys take, so the lock order (study, then
  trial rows) has no cycle.
* **Errors.** Every psycopg error leaves as ``StorageError`` naming the action and the
  database (never the password); a unique key another replica wrote first (the same study
  name or request id at the same moment) as ``AlreadyExistsError``.

URLs are libpq's (``postgresql://user:password@host:port/dbname?sslmode=require``,
``host=/run/postgresql`` for a socket directory); see ``server.storage.urls``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from server.storage import postgres_schema
from server.storage.migrations import check_current
from server.storage.sql import SQLStorage
from server.storage.urls import redact
from tuner.errors import AlreadyExistsError, StorageError


class PostgresStorage(SQLStorage):
    """Studies and trials in a PostgreSQL database.

    Args:
        url: A libpq connection URL (``postgresql://...``).
        read_only: Reads work; every write raises ``StorageError``; the database must
            already be at the current schema version.
        pool_size: Connections open at most; a call waits for a free one.
        lock_timeout_s: How long a statement waits for a lock another replica holds.
        connect_timeout_s: How long opening a connection may take.
        clock: Source of timestamps (Unix seconds); tests pass a fake.

    Raises:
        StorageError: The database cannot be reached, upgraded, or is from a newer tuner.
    """

    LOCK_STUDY = " FOR NO KEY UPDATE"
    LOCK_TRIALS = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    ORDER = "seq"

    def __init__(
        self,
        url: str,
        *,
        read_only: bool = False,
        pool_size: int = 8,
        lock_timeout_s: float = 10.0,
        connect_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(clock)
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        self.url = url
        self.read_only = read_only
        self._lock_timeout_ms = max(1, round(lock_timeout_s * 1000))
        self._connect_timeout_s = max(1, round(connect_timeout_s))
        self._wait_s = lock_timeout_s + connect_timeout_s
        self._slots = threading.BoundedSemaphore(pool_size)
        self._idle: list[psycopg.Connection[Any]] = []
        self._guard = threading.Lock()
        self._closed = False
        try:
            with self._connection("open the database") as conn:
                if read_only:
                    with conn.transaction():
                        version = postgres_schema.current_version(conn)
                    check_current(version, postgres_schema.LATEST_VERSION)
                else:
                    postgres_schema.migrate(conn)
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else ""
        return f"PostgresStorage({redact(self.url)!r}{mode})"

    # -- housekeeping -------------------------------------------------------------------
    def schema_version(self) -> int:
        with self._connection("read the schema version") as conn, conn.transaction():
            return postgres_schema.current_version(conn)

    def check(self) -> None:
        """Raise ``StorageError`` when the database cannot keep what it is given: it cannot
        be reached, or a write fails (a read-only standby, a full disk). Writes and commits
        one row (``write_probe``); a read-only storage only reads."""
        if self.read_only:
            with self._read("reach the database (probe)") as tx:
                tx.one("SELECT 1")
            return
        with self._write("write to the database (probe)") as tx:
            self._probe(tx)

    def close(self) -> None:
        with self._guard:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- connections and transactions ----------------------------------------------------
    @contextlib.contextmanager
    def _write(self, action: str) -> Iterator[_Tx]:
        begin = "BEGIN READ ONLY" if self.read_only else "BEGIN"
        with self._connection(action) as conn, _transaction(conn, begin):
            yield _Tx(conn)

    @contextlib.contextmanager
    def _read(self, action: str) -> Iterator[_Tx]:
        with (
            self._connection(action) as conn,
            _transaction(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
        ):
            yield _Tx(conn)

    @contextlib.contextmanager
    def _peek(self, action: str) -> Iterator[_Tx]:
        with self._connection(action) as conn:  # autocommit: the statement is its own
            yield _Tx(conn)

    @contextlib.contextmanager
    def _connection(self, action: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one call; psycopg errors become ``StorageError``."""
        where = redact(self.url)
        if self._closed:
            raise StorageError(f"cannot {action}: the storage at {where} is closed")
        if not self._slots.acquire(timeout=self._wait_s):
            raise StorageError(
                f"cannot {action} in {where}: every connection stayed busy for {self._wait_s:.0f} s"
            )
        conn = None
        try:
            try:
                conn = self._take()
                yield conn
            except psycopg.errors.UniqueViolation as exc:
                raise AlreadyExistsError(
                    f"cannot {action}: another call stored the same first "
                    f"({exc.diag.message_detail or exc})"
                ) from exc
            except psycopg.Error as exc:
                raise StorageError(f"cannot {action} in {where}: {_first_line(exc)}") from exc
        finally:
            if conn is not None:
                self._give_back(conn)
            self._slots.release()

    def _take(self) -> psycopg.Connection[Any]:
        with self._guard:
            if self._idle:
                return self._idle.pop()
        conn = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=self._connect_timeout_s,
            application_name="tuner",
        )
        # SET, not the connection's ``options``: a URL's own options (a search_path) stay
        conn.execute(f"SET lock_timeout = {self._lock_timeout_ms}")
        return conn

    def _give_back(self, conn: psycopg.Connection[Any]) -> None:
        """Keep a healthy, idle connection for the next call; close any other."""
        healthy = (
            not conn.closed
            and not conn.broken
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )
        with self._guard:
            if healthy and not self._closed:
                self._idle.append(conn)
                return
        conn.close()


class _Tx:
    """``server.storage.sql.Tx`` over one psycopg connection inside a transaction."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._conn.execute(_dialect(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            with self._conn.cursor() as cursor:
                cursor.executemany(_dialect(sql), rows)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._conn.cursor(row_factory=dict_row) as cursor:
            cursor.execute(_dialect(sql), params)
            return cursor.fetchall()

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return self._conn.execute(_dialect(sql), params).fetchone()

    def later(self, sql: str, params: Sequence[Any] = ()) -> Callable[[], list[dict[str, Any]]]:
        cursor = self._conn.cursor(row_factory=dict_row)
        cursor.execute(_dialect(sql), params)  # queued in the transaction's pipeline

        def read() -> list[dict[str, Any]]:
            with cursor:
                return cursor.fetchall()

        return read


@contextlib.contextmanager
def _transaction(conn: psycopg.Connection[Any], begin: str) -> Iterator[None]:
    """``begin`` ... COMMIT in pipeline mode: a statement is sent without waiting for the
    one before, and those sent since the last read are answered at the next (the BEGIN
    with the first query, the last writes with the COMMIT); an error surfaces there."""
    try:
        with conn.pipeline():
            conn.execute(begin)
            yield
            conn.execute("COMMIT")
    except BaseException:
        # Keep the original error: a failed rollback (the server went away) must not mask it.
        with contextlib.suppress(psycopg.Error):
            if not conn.closed:
                conn.execute("ROLLBACK")
        raise


@functools.lru_cache(maxsize=512)
def _dialect(sql: str) -> str:
    """``sql`` with SQLite's ``?`` placeholders as psycopg's ``%s``."""
    return sql.replace("%", "%%").replace("?", "%s")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
