"""The SQLite storage backend: one file, WAL, numbered migrations, one guarded connection.

Every ``Storage`` method is ``server.storage.sql.SQLStorage``'s; this module adds the
file. The backend keeps a single ``sqlite3`` connection shared by the gRPC thread pool
(``check_same_thread=False``) and serialises every call on a ``threading.RLock``. Each
write is one ``BEGIN IMMEDIATE ... COMMIT`` transaction that rolls back on any error, so a
failed call leaves no half-written trial. Reads run in a deferred transaction and see one
consistent snapshot. Every ``sqlite3`` error (disk full, read-only file, a lock held too
long, a corrupted file) surfaces as ``tuner.errors.StorageError`` naming the operation and
the file.

The connection (opened by ``migrations.open_database``) has the driver's own transaction
handling switched off (``isolation_level=None``): every transaction is the explicit one
opened here.

The file is watched: its device and inode are compared before every call, and ``check``
writes one row. A file deleted or replaced while in use is saved from the open connection
(``<name>.rescued-<time>``) and every later call is refused, naming where the data went;
a later start on the path refuses while that copy holds another database than the file
there (``server.storage.rescued``).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from server.storage import migrations
from server.storage.rescued import RestartGuard, rescued_name
from server.storage.sql import SQLStorage
from tuner.errors import StorageError

log = logging.getLogger(__name__)


class SQLiteStorage(SQLStorage):
    """Studies and trials in one SQLite file.

    Args:
        path: The database file; created with mode 0600 when missing (its directory must
            exist). A file from an older tuner is upgraded on open.
        read_only: Open with SQLite's ``mode=ro``: reads work, writes raise ``StorageError``,
            and the file must already exist at the current schema version.
        busy_timeout_s: How long a statement waits for a lock held by another connection.
        clock: Source of timestamps (Unix seconds); tests pass a fake.
        new_database: Open ``path`` as it is even when a rescued copy beside it holds the
            database that was lost there (``server.storage.rescued``): created empty when
            missing, the copies set aside.

    Raises:
        StorageError: The file cannot be created, opened, upgraded, or is from a newer
            tuner; or a database was lost at ``path`` (a rescued copy beside it holds it)
            and ``new_database`` is not set.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_only: bool = False,
        busy_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        new_database: bool = False,
    ) -> None:
        super().__init__(clock)
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.RLock()
        self._closed = False
        self._identity: tuple[int, int] | None = None  # the file opened (device, inode)
        self._lost: str | None = None  # why the file can no longer be trusted
        guard = None if read_only else RestartGuard(self.path, new_database)
        copies = [] if guard is None else guard.before_open()
        self._db = self._open(busy_timeout_s)
        if guard is not None:
            try:
                with self._errors("compare the database with its rescued copies"):
                    guard.after_open(self._db, copies)
            except BaseException:
                self._db.close()
                raise
        self._identity = _identity(self.path)
        self._wal_identity = _identity(_sidecar(self.path, "-wal"))
        self.rescued: Path | None = None  # where the data went when the file was lost

    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else ""
        return f"SQLiteStorage({str(self.path)!r}{mode})"

    # -- housekeeping -------------------------------------------------------------------
    def schema_version(self) -> int:
        with self._read("read the schema version"):
            return migrations.current_version(self._db)

    def integrity_check(self) -> str:
        """``"ok"``, or one line per problem from ``integrity_check`` and ``foreign_key_check``."""
        with self._read("check integrity") as tx:
            problems = [row[0] for row in tx.tuples("PRAGMA integrity_check")]
            if problems == ["ok"]:
                problems = []
            for table, rowid, parent, _ in tx.tuples("PRAGMA foreign_key_check"):
                problems.append(f"{table} row {rowid}: missing {parent} row (foreign key)")
        return "\n".join(problems) or "ok"

    def check(self) -> None:
        """Raise ``StorageError`` when the storage cannot keep what it is given: the file
        was deleted or replaced (checked before every call too), or a write fails (the
        file is read-only, its disk full or gone). Writes and commits one row
        (``write_probe``); a read-only storage only checks the file."""
        with self._errors("check the database"):
            pass
        if self.read_only:
            return
        with self._write("write to the database (probe)") as tx:
            self._probe(tx)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    # -- connection and transactions ---------------------------------------------------
    def _open(self, busy_timeout_s: float) -> sqlite3.Connection:
        with self._errors("open the database"):
            return migrations.open_database(
                self.path, read_only=self.read_only, busy_timeout_s=busy_timeout_s
            )

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Hold the lock and turn ``sqlite3`` errors into ``StorageError``."""
        with self._lock:
            if self._closed:
                raise StorageError(f"cannot {action}: the storage at {self.path} is closed")
            self._check_identity(action)
            try:
                yield
            except sqlite3.Error as exc:
                raise StorageError(f"cannot {action} in {self.path}: {exc}") from exc

    def _check_identity(self, action: str) -> None:
        """Refuse every call once the file at ``path`` is not the one opened: a deleted
        file's writes would go to an inode nobody can open again, and a replaced one is
        another database."""
        if self._lost is None and self._identity is not None:
            now = _identity(self.path)
            if now is None:
                self._lost = "was deleted"
            elif now != self._identity:
                self._lost = "was replaced by another file"
            if self._lost is not None:
                self._rescue()
        if self._lost is not None:
            saved = (
                f"everything stored until then is saved in {self.rescued}; restart the "
                f"server on that file (--db {self.rescued}) or move it back to {self.path}"
                if self.rescued is not None
                else "restart the server on a database"
            )
            raise StorageError(
                f"cannot {action}: the database file {self.path} {self._lost} while in use; "
                f"nothing more is read or written ({saved})"
            )

    def _rescue(self) -> None:
        """Save what the lost file held: the open connection still reads it (its inode and
        the WAL beside it), so SQLite's backup copies every committed transaction to
        ``<name>.rescued-<time>`` next to it. Then the WAL and its index, when they are
        still this connection's, are moved aside (``.stale-<time>``): SQLite matches them
        to a database by name only, and would lay this database's pages over the file
        that took its place."""
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        target = rescued_name(self.path, stamp)
        try:
            copy = sqlite3.connect(target)
            try:
                self._db.backup(copy)
            finally:
                copy.close()
            os.chmod(target, 0o600)
            self.rescued = target
        except (sqlite3.Error, OSError) as error:
            log.error("cannot save the lost database %s to %s: %s", self.path, target, error)
            return
        log.error("database file %s %s while in use; its data is saved in %s", self.path,
                  self._lost, target)  # fmt: skip
        wal = _sidecar(self.path, "-wal")
        if self._wal_identity is not None and _identity(wal) == self._wal_identity:
            for suffix in ("-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.replace(
                        _sidecar(self.path, suffix), f"{_sidecar(self.path, suffix)}.stale-{stamp}"
                    )

    @contextlib.contextmanager
    def _write(self, action: str) -> Iterator[_Tx]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on error."""
        with self._errors(action), _transaction(self._db, "BEGIN IMMEDIATE"):
            yield _Tx(self._db)

    @contextlib.contextmanager
    def _read(self, action: str) -> Iterator[_Tx]:
        """One deferred transaction, so multi-statement reads see a single snapshot."""
        with self._errors(action), _transaction(self._db, "BEGIN"):
            yield _Tx(self._db)


class _Tx:
    """``server.storage.sql.Tx`` over the backend's connection (already in a transaction)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._conn.executemany(sql, rows)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cursor = self._conn.execute(sql, params)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._conn.execute(sql, params).fetchone()
        return row

    def later(self, sql: str, params: Sequence[Any] = ()) -> Callable[[], list[dict[str, Any]]]:
        rows = self.rows(sql, params)  # SQLite runs every statement at once
        return lambda: rows

    def tuples(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, params).fetchall()


def _sidecar(path: Path, suffix: str) -> Path:
    """SQLite's file beside the database: ``-wal`` or ``-shm``."""
    return path.with_name(path.name + suffix)


def _identity(path: Path) -> tuple[int, int] | None:
    """The file's device and inode (None: no such file)."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection, begin: str) -> Iterator[None]:
    conn.execute(begin)
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            # Keep the original error: a failed rollback (the disk went away) must not mask it.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
