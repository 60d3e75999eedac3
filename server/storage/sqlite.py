"""The SQLite storage backend: one file, WAL, numbered migrations, one guarded connection.

The server is the only writer, so the backend keeps a single ``sqlite3`` connection shared
by the gRPC thread pool (``check_same_thread=False``) and serialises every call on a
``threading.RLock``. Each write is one ``BEGIN IMMEDIATE ... COMMIT`` transaction that rolls
back on any error, so a failed call leaves no half-written trial. Reads run in a deferred
transaction and see one consistent snapshot. Every ``sqlite3`` error (disk full, read-only
file, a lock held too long, a corrupted file) surfaces as ``tuner.errors.StorageError``
naming the operation and the file.

The connection (opened by ``migrations.open_database``) has the driver's own transaction
handling switched off (``isolation_level=None``): every transaction is the explicit one
opened here, and sqlite-utils' table helpers join it through savepoints.

Tables are described in ``server/storage/migrations.py``. Parameter values are stored as
JSON text per value, which keeps ``int``, ``float``, ``bool`` and ``str`` apart and
round-trips floats exactly (``repr`` precision).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from sqlite_utils import Database

from server.storage import migrations
from server.storage.base import (
    FinishedTrial,
    NewTrial,
    Request,
    Storage,
    StoredStudy,
    TrialEvent,
    check_metrics,
    check_status,
    check_text,
    check_trial_id,
)
from tuner.errors import (
    AlreadyExistsError,
    NotFoundError,
    StateError,
    StorageError,
    ValidationError,
)
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, Trial, TrialStatus

log = logging.getLogger(__name__)

_REQUEST_RETENTION_S = 7 * 24 * 3600.0
_TRIAL_COLUMNS = ("reason", "client_id", "source", "warning", "created_at", "updated_at")


class SQLiteStorage(Storage):
    """Studies and trials in one SQLite file.

    Args:
        path: The database file; created with mode 0600 when missing (its directory must
            exist). A file from an older tuner is upgraded on open.
        read_only: Open with SQLite's ``mode=ro``: reads work, writes raise ``StorageError``,
            and the file must already exist at the current schema version.
        busy_timeout_s: How long a statement waits for a lock held by another connection.
        clock: Source of timestamps (Unix seconds); tests pass a fake.

    Raises:
        StorageError: The file cannot be created, opened, upgraded, or is from a newer tuner.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_only: bool = False,
        busy_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = False
        self._identity: tuple[int, int] | None = None  # the file opened (device, inode)
        self._lost: str | None = None  # why the file can no longer be trusted
        self._db = self._open(busy_timeout_s)
        self._identity = _identity(self.path)
        self._wal_identity = _identity(_sidecar(self.path, "-wal"))
        self.rescued: Path | None = None  # where the data went when the file was lost

    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else ""
        return f"SQLiteStorage({str(self.path)!r}{mode})"

    # -- studies ----------------------------------------------------------------------
    def create_study(self, spec: StudySpec) -> StoredStudy:
        if not isinstance(spec, StudySpec):
            raise ValidationError("spec", f"must be a StudySpec, got {type(spec).__name__}")
        spec_json = json.dumps(spec.to_dict(), allow_nan=False)
        fingerprint = spec.fingerprint()
        with self._write(f"create study {spec.name!r}") as db:
            row = db.execute(
                "SELECT fingerprint FROM studies WHERE name = ?", [spec.name]
            ).fetchone()
            if row is not None:
                same = "the same" if row[0] == fingerprint else "a different"
                raise AlreadyExistsError(f"study {spec.name!r} already exists (with {same} spec)")
            now = self._clock()
            table = db.table("studies").insert(
                {
                    "name": spec.name,
                    "spec_json": spec_json,
                    "fingerprint": fingerprint,
                    "created_at": now,
                }
            )
            return StoredStudy(id=int(cast(int, table.last_pk)), spec=spec, created_at=now)

    def get_study(self, name: str) -> StoredStudy:
        with self._read(f"read study {name!r}") as db:
            rows = list(
                db.query("SELECT * FROM studies WHERE name = ?", [check_text(name, "study")])
            )
        if not rows:
            raise NotFoundError(f"study {name!r} not found")
        return _stored_study(rows[0])

    def list_studies(self) -> list[StoredStudy]:
        with self._read("list studies") as db:
            rows = list(db.query("SELECT * FROM studies ORDER BY id"))
        return [_stored_study(row) for row in rows]

    # -- trials -----------------------------------------------------------------------
    def add_trials(
        self,
        study: str,
        trials: Sequence[NewTrial],
        request: Request | None = None,
        answered: Sequence[int] = (),
    ) -> list[Trial]:
        items = list(trials)
        for i, item in enumerate(items):
            if not isinstance(item, NewTrial):
                raise ValidationError(f"trials[{i}]", f"must be a NewTrial, got {item!r}")
        with self._write(f"add trials to study {study!r}") as db:
            study_id = _study_id(db, study)
            now = self._clock()
            first = _insert_trials(
                db, study_id, now,
                [(_trial_row(t, now), t.config, {}, f"{t.status.value}, client {t.client_id!r}")
                 for t in items],
            )  # fmt: skip
            numbered = list(enumerate(items, start=first))
            if request is not None:
                ids = (*answered, *(i for i, _ in numbered))
                self._remember(db, study_id, replace(request, trial_ids=ids), now)
            return _load_trials(db, study_id, "AND t.trial_id >= ?", [first]) if items else []

    def import_trials(
        self, study: str, trials: Sequence[FinishedTrial], request: Request | None = None
    ) -> list[Trial]:
        items = list(trials)
        for i, item in enumerate(items):
            if not isinstance(item, FinishedTrial):
                raise ValidationError(f"trials[{i}]", f"must be a FinishedTrial, got {item!r}")
        with self._write(f"import trials into study {study!r}") as db:
            study_id = _study_id(db, study)
            now = self._clock()
            made = []
            for t in items:
                row = _trial_row(NewTrial(t.config, source=t.source), now)
                row |= {"status": t.status.value, "reason": t.reason}
                made.append((row, t.config, t.metrics, f"imported {t.status.value} ({t.source})"))
            first = _insert_trials(db, study_id, now, made)
            numbered = list(enumerate(items, start=first))
            if request is not None:
                ids = tuple(i for i, _ in numbered)
                self._remember(db, study_id, replace(request, trial_ids=ids), now)
            return _load_trials(db, study_id, "AND t.trial_id >= ?", [first]) if items else []

    def get_trial(self, study: str, trial_id: int) -> Trial:
        trial_id = check_trial_id(trial_id)
        with self._read(f"read trial {trial_id} of study {study!r}") as db:
            found = _load_trials(db, _study_id(db, study), "AND t.trial_id = ?", [trial_id])
        if not found:
            raise NotFoundError(f"trial {trial_id} not found in study {study!r}")
        return found[0]

    def list_trials(
        self, study: str, statuses: Collection[TrialStatus] | None = None
    ) -> list[Trial]:
        where, params = "", []
        if statuses is not None:
            wanted = sorted({check_status(s, "statuses") for s in statuses})
            where = f"AND t.status IN ({', '.join('?' * len(wanted))})" if wanted else "AND 0"
            params = [s.value for s in wanted]
        with self._read(f"list trials of study {study!r}") as db:
            return _load_trials(db, _study_id(db, study), where, params)

    def active_trials(self, study: str, client_id: str) -> list[Trial]:
        check_text(client_id, "client_id")
        with self._read(f"list active trials of study {study!r}") as db:
            return _load_trials(
                db,
                _study_id(db, study),
                "AND t.client_id = ? AND t.status = ?",
                [client_id, TrialStatus.ACTIVE.value],
            )

    def finish_trial(
        self,
        study: str,
        trial_id: int,
        status: TrialStatus,
        metrics: Mapping[str, float],
        reason: str = "",
        request: Request | None = None,
        measurements: Sequence[Measurement] = (),
        spread: Mapping[str, float] | None = None,
    ) -> Trial:
        trial_id = check_trial_id(trial_id)
        new = check_status(status)
        values = check_metrics(metrics)
        deviations = check_metrics(spread or {})
        repeats = [_measurement_row(m) for m in measurements]
        check_text(reason, "reason")
        with self._write(f"finish trial {trial_id} of study {study!r}") as db:
            study_id = _study_id(db, study)
            old = _stored_status(db, study, study_id, trial_id)
            row = db.execute(
                "SELECT expired_at, reported_late, reoffered_as FROM trials "
                "WHERE study_id = ? AND trial_id = ?",
                [study_id, trial_id],
            ).fetchone()
            late = row[0] is not None and not row[1]
            if not late:
                old.check_transition(new, trial_id)
            now = self._clock()
            db.execute(
                "UPDATE trials SET status = ?, reason = ?, updated_at = ?, lease_expires_at = "
                "CASE WHEN expired_at IS NULL THEN NULL ELSE lease_expires_at END, "
                "reported_late = ?, repeats = ?, spread_json = ? "
                "WHERE study_id = ? AND trial_id = ?",
                [
                    new.value, reason, now, int(late or bool(row[1])), max(1, len(repeats)),
                    json.dumps(deviations), study_id, trial_id,
                ],
            )  # fmt: skip
            _insert_measurements(db, study_id, trial_id, now, repeats)
            if late and row[2] is not None:
                _supersede(db, study_id, int(row[2]), trial_id, now)
            db.table("metrics").insert_all(
                (
                    {"study_id": study_id, "trial_id": trial_id, "name": k, "value": v}
                    for k, v in values.items()
                ),
                replace=True,
            )
            detail = f"from {old.value}" + (" (late: after its lease expired)" if late else "")
            detail += f": {reason}" if reason else ""
            _insert_events(db, [(study_id, trial_id, now, f"status:{new.value}", detail)])
            if request is not None:
                self._remember(db, study_id, replace(request, trial_ids=(trial_id,)), now)
            return _load_trials(db, study_id, "AND t.trial_id = ?", [trial_id])[0]

    def add_measurements(
        self, study: str, trial_id: int, measurements: Sequence[Measurement]
    ) -> list[Measurement]:
        trial_id = check_trial_id(trial_id)
        rows = [_measurement_row(m) for m in measurements]
        with self._write(f"add measurements to trial {trial_id} of study {study!r}") as db:
            study_id = _study_id(db, study)
            status = _stored_status(db, study, study_id, trial_id)
            if not status.is_final:
                raise StateError(
                    f"trial {trial_id} is {status.value}: only a finished trial's "
                    "configuration takes further measurements"
                )
            now = self._clock()
            first = _insert_measurements(db, study_id, trial_id, now, rows)
            return _load_measurements(db, study_id, "AND m.id >= ?", [first])

    def list_measurements(
        self,
        study: str,
        trial_id: int | None = None,
        kinds: Collection[MeasurementKind] | None = None,
    ) -> list[Measurement]:
        where: list[str] = []
        params: list[Any] = []
        if kinds is not None:
            wanted = sorted({_measurement_kind(k, "kinds") for k in kinds})
            where.append(f"AND m.kind IN ({', '.join('?' * len(wanted))})" if wanted else "AND 0")
            params += [k.value for k in wanted]
        with self._read(f"list measurements of study {study!r}") as db:
            study_id = _study_id(db, study)
            if trial_id is not None:
                trial_id = check_trial_id(trial_id)
                _stored_status(db, study, study_id, trial_id)
                where.append("AND m.trial_id = ?")
                params.append(trial_id)
            return _load_measurements(db, study_id, " ".join(where), params)

    def find_request(self, study: str, request_id: str) -> Request | None:
        check_text(request_id, "request_id", required=True)
        with self._read(f"look up request {request_id!r}") as db:
            row = db.execute(
                "SELECT r.method, r.digest, r.trial_ids, s.name FROM requests r "
                "JOIN studies s ON s.id = r.study_id WHERE r.request_id = ?",
                [request_id],
            ).fetchone()
        if row is None:
            return None
        if row[3] != study:
            raise ValidationError(
                "request_id",
                f"{request_id!r} was already used for a request to study {row[3]!r}",
                "a new id for every request",
            )
        return Request(request_id, row[0], row[1], tuple(int(i) for i in json.loads(row[2])))

    def _remember(self, db: Database, study_id: int, request: Request, now: float) -> None:
        """Record ``request`` inside the caller's transaction; forget week-old ones."""
        db.execute("DELETE FROM requests WHERE created_at < ?", [now - _REQUEST_RETENTION_S])
        db.execute(
            "INSERT INTO requests (request_id, method, study_id, digest, trial_ids, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [request.request_id, request.method, study_id, request.digest,
             json.dumps(list(request.trial_ids)), now],
        )  # fmt: skip

    def renew_lease(self, study: str, trial_id: int, expires_at: float) -> Trial:
        trial_id = check_trial_id(trial_id)
        with self._write(f"renew the lease of trial {trial_id} of study {study!r}") as db:
            study_id = _study_id(db, study)
            status = _stored_status(db, study, study_id, trial_id)
            if status is not TrialStatus.ACTIVE:
                trial = _load_trials(db, study_id, "AND t.trial_id = ?", [trial_id])[0]
                raise StateError(_not_active(trial))
            db.execute(
                "UPDATE trials SET heartbeat_at = ?, lease_expires_at = ? "
                "WHERE study_id = ? AND trial_id = ?",
                [self._clock(), float(expires_at), study_id, trial_id],
            )
            return _load_trials(db, study_id, "AND t.trial_id = ?", [trial_id])[0]

    def expire_leases(
        self, study: str, now: float, status: TrialStatus, reoffer: bool
    ) -> list[Trial]:
        if status not in (TrialStatus.ABANDONED, TrialStatus.FAILED):
            raise ValidationError("status", f"got {status!r}", ["ABANDONED", "FAILED"])
        with self._write(f"expire leases in study {study!r}") as db:
            study_id = _study_id(db, study)
            expired = _load_trials(
                db,
                study_id,
                "AND t.status = ? AND t.lease_expires_at IS NOT NULL AND t.lease_expires_at < ?",
                [TrialStatus.ACTIVE.value, now],
            )
            if not expired:
                return []
            events = []
            for trial in expired:
                reason = (
                    f"lease expired at {_iso(cast(float, trial.lease_expires_at))}: no heartbeat "
                    f"from client {trial.client_id!r}"
                )
                copy = None
                if reoffer:
                    again = NewTrial(
                        trial.config,
                        source=trial.source,
                        status=TrialStatus.PENDING,
                        embedded=trial.embedded,
                        step=trial.step,
                    )
                    detail = f"PENDING, re-offer of trial {trial.id}"
                    copy = _insert_trials(
                        db, study_id, now, [(_trial_row(again, now), trial.config, {}, detail)]
                    )
                db.execute(
                    "UPDATE trials SET status = ?, reason = ?, updated_at = ?, expired_at = ?, "
                    "reoffered_as = ? WHERE study_id = ? AND trial_id = ?",
                    [status.value, reason, now, now, copy, study_id, trial.id],
                )
                events.append((study_id, trial.id, now, "lease_expired", reason))
                if copy is not None:
                    events.append((study_id, trial.id, now, "reoffered", f"as trial {copy}"))
            _insert_events(db, events)
            ids = [t.id for t in expired]
            marks = ", ".join("?" * len(ids))
            return _load_trials(db, study_id, f"AND t.trial_id IN ({marks})", ids)

    def claim_trials(
        self, study: str, client_id: str, count: int, lease_expires_at: float | None
    ) -> list[Trial]:
        check_text(client_id, "client_id")
        with self._write(f"hand out queued trials of study {study!r}") as db:
            study_id = _study_id(db, study)
            ids = [
                row[0]
                for row in db.execute(
                    "SELECT trial_id FROM trials WHERE study_id = ? AND status = ? "
                    "ORDER BY trial_id LIMIT ?",
                    [study_id, TrialStatus.PENDING.value, max(0, int(count))],
                )
            ]
            if not ids:
                return []
            now = self._clock()
            marks = ", ".join("?" * len(ids))
            db.execute(
                "UPDATE trials SET status = ?, client_id = ?, updated_at = ?, heartbeat_at = ?, "
                f"lease_expires_at = ? WHERE study_id = ? AND trial_id IN ({marks})",
                [TrialStatus.ACTIVE.value, client_id, now,
                 now if lease_expires_at is not None else None, lease_expires_at, study_id, *ids],
            )  # fmt: skip
            _insert_events(
                db,
                [(study_id, i, now, "status:ACTIVE", f"from PENDING, client {client_id!r}")
                 for i in ids],
            )  # fmt: skip
            return _load_trials(db, study_id, f"AND t.trial_id IN ({marks})", ids)

    def add_trial_event(
        self, study: str, trial_id: int, event: str, detail: str = ""
    ) -> TrialEvent:
        trial_id = check_trial_id(trial_id)
        check_text(event, "event", required=True)
        check_text(detail, "detail")
        with self._write(f"record an event for trial {trial_id} of study {study!r}") as db:
            study_id = _study_id(db, study)
            _stored_status(db, study, study_id, trial_id)
            now = self._clock()
            _insert_events(db, [(study_id, trial_id, now, event, detail)])
        return TrialEvent(trial_id=trial_id, at=now, event=event, detail=detail)

    def trial_events(self, study: str, trial_id: int) -> list[TrialEvent]:
        trial_id = check_trial_id(trial_id)
        with self._read(f"read events of trial {trial_id} of study {study!r}") as db:
            study_id = _study_id(db, study)
            _stored_status(db, study, study_id, trial_id)
            rows = list(
                db.query(
                    "SELECT trial_id, at, event, detail FROM trial_events "
                    "WHERE study_id = ? AND trial_id = ? ORDER BY id",
                    [study_id, trial_id],
                )
            )
        return [TrialEvent(**row) for row in rows]

    # -- housekeeping -------------------------------------------------------------------
    def schema_version(self) -> int:
        with self._read("read the schema version") as db:
            return migrations.current_version(db)

    def integrity_check(self) -> str:
        """``"ok"``, or one line per problem from ``integrity_check`` and ``foreign_key_check``."""
        with self._read("check integrity") as db:
            problems = [row[0] for row in db.execute("PRAGMA integrity_check").fetchall()]
            if problems == ["ok"]:
                problems = []
            for table, rowid, parent, _ in db.execute("PRAGMA foreign_key_check").fetchall():
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
        with self._write("write to the database (probe)") as db:
            db.execute("INSERT OR REPLACE INTO write_probe (id, at) VALUES (1, ?)", [self._clock()])

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    # -- connection and transactions ---------------------------------------------------
    def _open(self, busy_timeout_s: float) -> Database:
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
                "server on that file"
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
        target = self.path.with_name(f"{self.path.name}.rescued-{stamp}")
        try:
            copy = sqlite3.connect(target)
            try:
                self._db.conn.backup(copy)
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
    def _write(self, action: str) -> Iterator[Database]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on error."""
        with self._errors(action), _transaction(self._db, "BEGIN IMMEDIATE"):
            yield self._db

    @contextlib.contextmanager
    def _read(self, action: str) -> Iterator[Database]:
        """One deferred transaction, so multi-statement reads see a single snapshot."""
        with self._errors(action), _transaction(self._db, "BEGIN"):
            yield self._db


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
def _transaction(db: Database, begin: str) -> Iterator[None]:
    db.conn.execute(begin)
    try:
        yield
        db.conn.execute("COMMIT")
    except BaseException:
        if db.conn.in_transaction:
            # Keep the original error: a failed rollback (the disk went away) must not mask it.
            with contextlib.suppress(sqlite3.Error):
                db.conn.execute("ROLLBACK")
        raise


def _study_id(db: Database, name: str) -> int:
    row = db.execute(
        "SELECT id FROM studies WHERE name = ?", [check_text(name, "study")]
    ).fetchone()
    if row is None:
        raise NotFoundError(f"study {name!r} not found")
    return int(row[0])


def _stored_status(db: Database, study: str, study_id: int, trial_id: int) -> TrialStatus:
    row = db.execute(
        "SELECT status FROM trials WHERE study_id = ? AND trial_id = ?", [study_id, trial_id]
    ).fetchone()
    if row is None:
        raise NotFoundError(f"trial {trial_id} not found in study {study!r}")
    return TrialStatus(row[0])


def _stored_study(row: Mapping[str, Any]) -> StoredStudy:
    try:
        spec = StudySpec.from_dict(json.loads(row["spec_json"]))
    except (ValueError, TypeError) as exc:  # ValidationError and JSONDecodeError included
        raise StorageError(f"stored spec of study {row['name']!r} cannot be read: {exc}") from exc
    return StoredStudy(id=int(row["id"]), spec=spec, created_at=float(row["created_at"]))


def _trial_row(trial: NewTrial, now: float) -> dict[str, Any]:
    """The ``trials`` row of a new trial, without its study and number."""
    return {
        "status": trial.status.value,
        "client_id": trial.client_id,
        "source": trial.source,
        "step": trial.step.value,
        "warning": trial.warning,
        "embedded_json": json.dumps(list(trial.embedded)),
        "reason": "",
        "created_at": now,
        "updated_at": now,
        "heartbeat_at": now if trial.lease_expires_at is not None else None,
        "lease_expires_at": trial.lease_expires_at,
    }


def _insert_trials(
    db: Database,
    study_id: int,
    now: float,
    made: Sequence[tuple[dict[str, Any], Mapping[str, Any], Mapping[str, float], str]],
) -> int:
    """Insert trials numbered on from the study's last, each given as (row, config,
    metrics, detail of its ``created`` event); returns the first new trial id."""
    first = int(
        db.execute(
            "SELECT COALESCE(MAX(trial_id), 0) + 1 FROM trials WHERE study_id = ?", [study_id]
        ).fetchone()[0]
    )
    numbered = list(enumerate(made, start=first))
    db.table("trials").insert_all(
        {"study_id": study_id, "trial_id": i, **row} for i, (row, _, _, _) in numbered
    )
    # plain executemany: sqlite-utils' insert_all builds each row's query in Python, which
    # dominated storing a batch of many-knob trials (one profile, 5,000 knobs: 14.5 s for
    # 100 trials before, 0.44 s for 10 after, on a VM running CI beside it)
    db.conn.executemany(
        "INSERT INTO parameters (study_id, trial_id, name, value_json) VALUES (?, ?, ?, ?)",
        (
            (study_id, i, name, json.dumps(value))
            for i, (_, config, _, _) in numbered
            for name, value in config.items()
        ),
    )
    db.conn.executemany(
        "INSERT INTO metrics (study_id, trial_id, name, value) VALUES (?, ?, ?, ?)",
        (
            (study_id, i, name, value)
            for i, (_, _, metrics, _) in numbered
            for name, value in metrics.items()
        ),
    )
    _insert_events(db, [(study_id, i, now, "created", detail) for i, (*_, detail) in numbered])
    return first


def _insert_events(db: Database, events: Iterable[tuple[int, int, float, str, str]]) -> None:
    """Append ``(study_id, trial_id, at, event, detail)`` rows to the trial event log."""
    db.conn.executemany(
        "INSERT INTO trial_events (study_id, trial_id, at, event, detail) VALUES (?, ?, ?, ?, ?)",
        events,
    )


def _load_trials(db: Database, study_id: int, where: str, params: Sequence[Any]) -> list[Trial]:
    """Trials of one study matching ``where`` (SQL over alias ``t``), in id order."""
    args = [study_id, *params]
    rows = list(
        db.query(f"SELECT * FROM trials t WHERE t.study_id = ? {where} ORDER BY t.trial_id", args)
    )
    if not rows:
        return []
    configs = _trial_values(db, "parameters", "value_json", where, args, json.loads)
    metrics = _trial_values(db, "metrics", "value", where, args, float)
    return [
        Trial(
            id=row["trial_id"],
            config=configs.get(row["trial_id"], {}),
            status=TrialStatus(row["status"]),
            metrics=metrics.get(row["trial_id"], {}),
            embedded=tuple(float(v) for v in json.loads(row["embedded_json"])),
            lease_expires_at=row["lease_expires_at"],
            expired_at=row["expired_at"],
            reported_late=bool(row["reported_late"]),
            reoffered_as=row["reoffered_as"],
            step=_step(row["step"]),
            repeats=int(row["repeats"]),
            spread={k: float(v) for k, v in json.loads(row["spread_json"]).items()},
            **{key: row[key] for key in _TRIAL_COLUMNS},
        )
        for row in rows
    ]


def _measurement_kind(value: Any, field_: str) -> MeasurementKind:
    try:
        return MeasurementKind(value)
    except ValueError:
        raise ValidationError(
            field_, f"got {value!r}", [k.value for k in MeasurementKind]
        ) from None


def _measurement_row(measurement: Measurement) -> dict[str, Any]:
    """The checked ``measurements`` row of ``measurement``, without study, trial and id."""
    if not isinstance(measurement, Measurement):
        raise ValidationError(
            "measurements", f"must be Measurement, got {type(measurement).__name__}"
        )
    at = measurement.at
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at < float("inf"):
        raise ValidationError("measurements.at", f"got {at!r}", "a Unix time >= 0")
    if (
        isinstance(measurement.round, bool)
        or not isinstance(measurement.round, int)
        or (measurement.round < 0)
    ):
        raise ValidationError("measurements.round", f"got {measurement.round!r}", ">= 0")
    return {
        "kind": _measurement_kind(measurement.kind, "measurements.kind").value,
        "round": measurement.round,
        "at": float(at),
        "metrics_json": json.dumps(check_metrics(measurement.metrics)),
    }


def _insert_measurements(
    db: Database, study_id: int, trial_id: int, now: float, rows: Sequence[dict[str, Any]]
) -> int:
    """Insert checked measurement rows of one trial; returns the id the first one got."""
    first = int(db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM measurements").fetchone()[0])
    db.conn.executemany(
        "INSERT INTO measurements (id, study_id, trial_id, kind, round, at, metrics_json) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (first + i, study_id, trial_id, r["kind"], r["round"], r["at"] or now,
             r["metrics_json"])
            for i, r in enumerate(rows)
        ],
    )  # fmt: skip
    return first


def _load_measurements(
    db: Database, study_id: int, where: str, params: Sequence[Any]
) -> list[Measurement]:
    rows = db.execute(
        "SELECT trial_id, kind, round, at, metrics_json FROM measurements m "
        f"WHERE m.study_id = ? {where} ORDER BY m.id",
        [study_id, *params],
    )
    return [
        Measurement(
            metrics={k: float(v) for k, v in json.loads(metrics).items()},
            kind=MeasurementKind(kind),
            at=float(at),
            round=int(round_),
            trial_id=int(trial_id),
        )
        for trial_id, kind, round_, at, metrics in rows
    ]


def _step(value: str) -> StepKind:
    try:
        return StepKind(value)
    except ValueError:
        raise StorageError(
            f"trials.step holds {value!r}, which this tuner does not know "
            f"(known: {', '.join(k.value for k in StepKind)})"
        ) from None


def _trial_values(
    db: Database,
    table: str,
    column: str,
    where: str,
    args: Sequence[Any],
    decode: Callable[[Any], Any],
) -> dict[int, dict[str, Any]]:
    """``trial_id -> {name: decode(column)}`` from ``table`` for the trials matching ``where``."""
    cursor = db.execute(
        f"SELECT x.trial_id, x.name, x.{column} FROM {table} x "
        "JOIN trials t ON t.study_id = x.study_id AND t.trial_id = x.trial_id "
        f"WHERE t.study_id = ? {where} ORDER BY x.rowid",
        args,
    )
    out: dict[int, dict[str, Any]] = {}
    for trial_id, name, value in cursor:
        out.setdefault(trial_id, {})[name] = decode(value)
    return out


def _supersede(db: Database, study_id: int, copy: int, late: int, now: float) -> None:
    """A late result arrived for trial ``late``: its re-offer ``copy``, if nobody has taken
    it yet, is not needed any more."""
    reason = f"not needed: trial {late} reported its result late"
    changed = db.execute(
        "UPDATE trials SET status = ?, reason = ?, updated_at = ? "
        "WHERE study_id = ? AND trial_id = ? AND status = ?",
        [TrialStatus.ABANDONED.value, reason, now, study_id, copy, TrialStatus.PENDING.value],
    ).rowcount
    if changed:
        _insert_events(db, [(study_id, copy, now, "status:ABANDONED", f"from PENDING: {reason}")])


def _not_active(trial: Trial) -> str:
    """Why a heartbeat for ``trial`` cannot be taken."""
    if trial.expired_at is None or trial.reported_late:
        return f"trial {trial.id} is {trial.status.value}, not ACTIVE: it has no lease to renew"
    again = (
        f"; its configuration is re-offered as trial {trial.reoffered_as}"
        if (trial.reoffered_as is not None)
        else ""
    )
    return (
        f"trial {trial.id} is {trial.status.value}: its lease expired at "
        f"{_iso(trial.lease_expires_at or trial.expired_at)}{again}. Report its result "
        "with CompleteTrial anyway: a late result is stored once"
    )


def _iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(timespec="seconds")
