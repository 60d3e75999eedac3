"""The storage contract in SQL that SQLite and PostgreSQL both run: one implementation of
every ``Storage`` method, over a small transaction interface each backend provides.

A backend subclasses ``SQLStorage`` and supplies:

* ``_write(action)`` and ``_read(action)``: context managers around one transaction that
  yield a ``Tx``. A write commits on success and rolls back on any error; a read sees one
  consistent snapshot. Driver errors leave as ``tuner.errors.StorageError`` naming the
  action.
* Optionally ``_peek(action)``, for reads of one statement: the same without a
  transaction around it where the engine allows (PostgreSQL: one round trip, not three).
  Lookups the service makes on every call use it (a study, a request id, whether any
  lease has run out), and a write transaction is opened only when there is something to
  write (``expire_leases``) or asked for.
* ``Tx``: ``execute`` and ``executemany`` (no result), ``rows`` (dicts) and ``one`` (a
  tuple or None), taking SQL with ``?`` placeholders (the PostgreSQL backend rewrites them
  for psycopg); ``later`` sends a query whose rows are read afterwards, so that
  PostgreSQL answers it together with the writes before it (``finish_trial``, the write
  every worker makes after every measurement: three round trips).
* Four fragments of dialect, as class attributes:

  ``LOCK_STUDY``
      Appended to the study's lookup in every write but ``claim_trials`` and
      ``finish_trial``. SQLite: nothing (``BEGIN IMMEDIATE`` already serialises all
      writers). PostgreSQL: ``FOR NO KEY UPDATE``, a row lock on the study that serialises
      the writes of one study across server replicas (trial numbering, expiry) without
      blocking the foreign-key checks of inserts elsewhere.
  ``LOCK_TRIALS``
      Appended to the reads of trials a write is about to change by their state:
      ``finish_trial``'s and ``renew_lease``'s trial, ``expire_leases``' expired ones.
      PostgreSQL: ``FOR UPDATE``, so the results of one study are stored side by side
      (each locks its own trial, not the study), and an expiry waits for a result being
      stored, then reads the trial as that left it (a finished trial is not expired).
  ``SKIP_LOCKED``
      Appended to ``claim_trials``' choice of queued trials. PostgreSQL:
      ``FOR UPDATE SKIP LOCKED``: two replicas claiming at once each lock different rows,
      so a queued trial is handed out once, and neither waits for the other.
  ``ORDER``
      The column that keeps the order a trial's parameters and metrics were stored in
      (SQLite's ``rowid``; an identity column ``seq`` in PostgreSQL).

Tables are described in ``server/storage/migrations.py`` (and, in PostgreSQL's DDL, in
``server/storage/postgres_schema.py``). Parameter values are stored as JSON text per value,
which keeps ``int``, ``float``, ``bool`` and ``str`` apart and round-trips floats exactly.
"""

from __future__ import annotations

import datetime
import json
import math
from abc import abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, Protocol, cast

from server.storage.base import (
    ROW_CHARS,
    FinishedTrial,
    LeaseLapsed,
    NewBatch,
    NewTrial,
    Request,
    Storage,
    StoredSize,
    StoredStudy,
    TrialEvent,
    check_holder,
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
    TakenError,
    ValidationError,
)
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, Trial, TrialStatus

_REQUEST_RETENTION_S = 7 * 24 * 3600.0
_FORGET_EVERY_S = 60.0  # how often a process deletes requests older than the retention
#: ``stored_size``: every text the study's rows hold, plus ROW_CHARS a row (see StoredSize).
_SIZE_SQL = f"""SELECT
    (SELECT LENGTH(spec_json) FROM studies WHERE id = ?)
    + (SELECT COALESCE(SUM(LENGTH(client_id) + LENGTH(source) + LENGTH(warning) + LENGTH(reason)
        + LENGTH(embedded_json) + LENGTH(spread_json) + LENGTH(transfer_json) + {ROW_CHARS}), 0)
       FROM trials WHERE study_id = ?)
    + (SELECT COALESCE(SUM(LENGTH(name) + LENGTH(value_json) + {ROW_CHARS}), 0)
       FROM parameters WHERE study_id = ?)
    + (SELECT COALESCE(SUM(LENGTH(name) + {ROW_CHARS}), 0) FROM metrics WHERE study_id = ?)
    + (SELECT COALESCE(SUM(LENGTH(metrics_json) + {ROW_CHARS}), 0)
       FROM measurements WHERE study_id = ?)
    + (SELECT COALESCE(SUM(LENGTH(event) + LENGTH(detail) + {ROW_CHARS}), 0)
       FROM trial_events WHERE study_id = ?),
    (SELECT COUNT(*) FROM trials WHERE study_id = ? AND status IN (?, ?))"""
#: A trial's progress windows, counted as it finishes (``Trial.windows``). Its own text, not
#: the migrations' (``migrations.WINDOWS_OF_TRIAL``): a released migration never changes.
_WINDOWS = (
    "(SELECT COUNT(*) FROM measurements m WHERE m.study_id = trials.study_id "
    "AND m.trial_id = trials.trial_id AND m.kind = 'progress')"
)
_TRIAL_COLUMNS = ("reason", "client_id", "source", "warning", "created_at", "updated_at")
_NEW_TRIAL_COLUMNS = (
    "study_id", "trial_id", "status", "client_id", "source", "step", "warning",
    "embedded_json", "reason", "created_at", "updated_at", "heartbeat_at", "lease_expires_at",
    "config_key", "transfer_json",
)  # fmt: skip


class Tx(Protocol):
    """One open transaction of a backend; SQL takes ``?`` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement whose result nobody reads (``RETURNING`` rows, read with
        ``rows``, tell what a write changed)."""

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement for each parameter row."""

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Every row of a query, as column name -> value."""

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """The first row of a query, or None."""

    def later(self, sql: str, params: Sequence[Any] = ()) -> Callable[[], list[dict[str, Any]]]:
        """Send a query and read its rows (as ``rows`` does) when the returned function is
        called. PostgreSQL sends a transaction's statements in a pipeline: those sent
        since the last read are answered together, in one round trip, at the next read
        (``rows``, ``one``, or calling such a function) or at the commit."""


#: An ACTIVE trial (``t``) whose lease ran out before a time (parameters: the ACTIVE
#: status, the time): what ``expire_leases`` gives up and ``finish_trial``'s ``due`` refuses.
LAPSED = "t.status = ? AND t.lease_expires_at IS NOT NULL AND t.lease_expires_at < ?"


class SQLStorage(Storage):
    """Every ``Storage`` method over ``Tx`` transactions; see the module's docstring for
    what a backend adds.

    Args:
        clock: Source of timestamps (Unix seconds); tests pass a fake.
    """

    LOCK_STUDY = ""
    LOCK_TRIALS = ""
    SKIP_LOCKED = ""
    ORDER = "rowid"

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._forgotten_at = -math.inf  # when ``_remember`` last deleted old requests

    @abstractmethod
    def _write(self, action: str) -> AbstractContextManager[Tx]:
        """One write transaction: committed on success, rolled back on any error."""

    @abstractmethod
    def _read(self, action: str) -> AbstractContextManager[Tx]:
        """One read transaction that sees a single snapshot."""

    def _peek(self, action: str) -> AbstractContextManager[Tx]:
        """For a read that needs no snapshot of its own: one statement (which sees one
        snapshot by itself), or rows nobody else changes meanwhile. A backend may run it
        without a transaction around it (PostgreSQL: no BEGIN and COMMIT, each statement
        one round trip)."""
        return self._read(action)

    # -- studies ----------------------------------------------------------------------
    def create_study(self, spec: StudySpec) -> StoredStudy:
        if not isinstance(spec, StudySpec):
            raise ValidationError("spec", f"must be a StudySpec, got {type(spec).__name__}")
        spec_json = json.dumps(spec.to_dict(), allow_nan=False)
        fingerprint = spec.fingerprint()
        with self._write(f"create study {spec.name!r}") as tx:
            row = tx.one("SELECT fingerprint FROM studies WHERE name = ?", [spec.name])
            if row is not None:
                same = "the same" if row[0] == fingerprint else "a different"
                raise AlreadyExistsError(f"study {spec.name!r} already exists (with {same} spec)")
            now = self._clock()
            made = tx.one(
                "INSERT INTO studies (name, spec_json, fingerprint, created_at) "
                "VALUES (?, ?, ?, ?) RETURNING id",
                [spec.name, spec_json, fingerprint, now],
            )
            return StoredStudy(id=int(cast(tuple[Any, ...], made)[0]), spec=spec, created_at=now)

    def get_study(self, name: str) -> StoredStudy:
        with self._peek(f"read study {name!r}") as tx:
            rows = tx.rows("SELECT * FROM studies WHERE name = ?", [check_text(name, "study")])
        if not rows:
            raise NotFoundError(f"study {name!r} not found")
        return _stored_study(rows[0])

    def list_studies(self, offset: int = 0, limit: int | None = None) -> list[StoredStudy]:
        with self._read("list studies") as tx:
            rows = tx.rows(f"SELECT * FROM studies ORDER BY id{_page(offset, limit)}")
        return [_stored_study(row) for row in rows]

    def stored_size(self, study: str) -> StoredSize:
        with self._read(f"measure study {study!r}") as tx:
            study_id = self._study_id(tx, study)
            unfinished = [TrialStatus.PENDING.value, TrialStatus.ACTIVE.value]
            row = tx.one(_SIZE_SQL, [study_id] * 7 + unfinished)
        chars, unfinished = cast(tuple[Any, ...], row)
        return StoredSize(chars=int(chars), unfinished=int(unfinished))

    # -- trials -----------------------------------------------------------------------
    def add_trials(
        self,
        study: str,
        trials: Sequence[NewTrial],
        request: Request | None = None,
        answered: Sequence[int] = (),
        since: int | None = None,
    ) -> list[Trial]:
        [added] = self.add_trial_batches(study, [NewBatch(trials, request, answered)], since)
        if added is None:
            raise AlreadyExistsError(
                f"request {request.request_id if request else ''!r} was answered meanwhile; "
                "nothing more was stored"
            )
        return added

    def add_trial_batches(
        self, study: str, batches: Sequence[NewBatch], since: int | None = None
    ) -> list[list[Trial] | None]:
        groups = [list(b.trials) for b in batches]
        for g, items in enumerate(groups):
            for i, item in enumerate(items):
                if not isinstance(item, NewTrial):
                    where = f"trials[{i}]" if len(groups) == 1 else f"batches[{g}].trials[{i}]"
                    raise ValidationError(where, f"must be a NewTrial, got {item!r}")
        if since is not None:
            since = check_trial_id(since, "since")
        with self._write(f"add trials to study {study!r}") as tx:
            study_id = self._study_id(tx, study, lock=True)
            if since is not None:
                _refuse_taken(tx, study, study_id, since, [t for items in groups for t in items])
            now = self._clock()
            spans: list[tuple[int, int] | None] = []
            for batch, items in zip(batches, groups, strict=True):
                first = _next_trial_id(tx, study_id)
                if batch.request is not None:
                    ids = (*batch.answered, *range(first, first + len(items)))
                    if not self._record(tx, study_id, replace(batch.request, answer_ids=ids), now):
                        spans.append(None)  # answered by another call first: nothing stored
                        continue
                _insert_trials(
                    tx, study_id, now,
                    [(_trial_row(t, now), t.config, {}, f"{t.status.value}, client {t.client_id!r}")
                     for t in items],
                    first,
                )  # fmt: skip
                spans.append((first, first + len(items)))
        stored = [span for span in spans if span is not None and span[0] < span[1]]
        loaded = (
            self._reread(study, study_id, "AND t.trial_id >= ? AND t.trial_id < ?",
                         [stored[0][0], stored[-1][1]])
            if stored else []
        )  # fmt: skip
        by_id = {t.id: t for t in loaded}
        return [None if span is None else [by_id[i] for i in range(*span)] for span in spans]

    def import_trials(
        self, study: str, trials: Sequence[FinishedTrial], request: Request | None = None
    ) -> list[Trial]:
        items = list(trials)
        for i, item in enumerate(items):
            if not isinstance(item, FinishedTrial):
                raise ValidationError(f"trials[{i}]", f"must be a FinishedTrial, got {item!r}")
        with self._write(f"import trials into study {study!r}") as tx:
            study_id = self._study_id(tx, study, lock=True)
            now = self._clock()
            made = []
            for t in items:
                row = _trial_row(NewTrial(t.config, source=t.source, key=t.key), now)
                row |= {"status": t.status.value, "reason": t.reason}
                made.append((row, t.config, t.metrics, f"imported {t.status.value} ({t.source})"))
            first = _insert_trials(tx, study_id, now, made)
            if request is not None:
                ids = tuple(range(first, first + len(items)))
                self._remember(tx, study_id, replace(request, answer_ids=ids), now)
            return self._load_trials(tx, study_id, "AND t.trial_id >= ?", [first]) if items else []

    def get_trial(self, study: str, trial_id: int) -> Trial:
        trial_id = check_trial_id(trial_id)
        with self._read(f"read trial {trial_id} of study {study!r}") as tx:
            found = self._load_trials(
                tx, self._study_id(tx, study), "AND t.trial_id = ?", [trial_id]
            )
        if not found:
            raise NotFoundError(f"trial {trial_id} not found in study {study!r}")
        return found[0]

    def list_trials(
        self,
        study: str,
        statuses: Collection[TrialStatus] | None = None,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Trial]:
        where = "AND t.trial_id > ?"
        params: list[Any] = [check_trial_id(after, "after")]
        if statuses is not None:
            wanted = sorted({check_status(s, "statuses") for s in statuses})
            marks = ", ".join("?" * len(wanted))
            where += f" AND t.status IN ({marks})" if wanted else " AND 1 = 0"
            params += [s.value for s in wanted]
        with self._read(f"list trials of study {study!r}") as tx:
            study_id = self._study_id(tx, study)
            if limit is not None:  # the ids first, so that the page's values load by range
                last = tx.rows(
                    f"SELECT t.trial_id FROM trials t WHERE t.study_id = ? {where} "
                    f"ORDER BY t.trial_id{_page(0, limit)}",
                    [study_id, *params],
                )
                if not last:
                    return []
                where += " AND t.trial_id <= ?"
                params.append(last[-1]["trial_id"])
            return self._load_trials(tx, study_id, where, params)

    def active_trials(self, study: str, client_id: str) -> list[Trial]:
        check_text(client_id, "client_id")
        # statement by statement, outside a transaction: a client's active trials (rows of
        # its own) change only by its own calls, and most often there are none: one look
        with self._peek(f"list active trials of study {study!r}") as tx:
            return self._load_trials(
                tx,
                self._study_id(tx, study),
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
        holder: str | None = None,
        due: float | None = None,
    ) -> Trial:
        trial_id = check_trial_id(trial_id)
        new = check_status(status)
        values = check_metrics(metrics)
        deviations = check_metrics(spread or {})
        repeats = [_measurement_row(m) for m in measurements]
        check_text(reason, "reason")
        with self._write(f"finish trial {trial_id} of study {study!r}") as tx:
            # the trial's lock, not the study's: results for other trials are stored
            # meanwhile (nothing here numbers trials or reads other trials by state)
            row = tx.one(
                "SELECT t.study_id, t.status, t.client_id, t.expired_at, t.reported_late, "
                f"t.reoffered_as, {LAPSED} FROM trials t "
                "WHERE t.study_id = (SELECT id FROM studies WHERE name = ?) "
                f"AND t.trial_id = ?{self.LOCK_TRIALS}",
                [TrialStatus.ACTIVE.value, -math.inf if due is None else due,
                 check_text(study, "study"), trial_id],
            )  # fmt: skip
            if row is None:
                self._study_id(tx, study)  # NotFoundError naming the study if it is missing
                raise NotFoundError(f"trial {trial_id} not found in study {study!r}")
            study_id, old, handed_to, expired_at, reported_late, reoffered_as, lapsed = row
            old = TrialStatus(old)
            if lapsed:  # never without ``due`` (nothing is before -inf)
                raise LeaseLapsed(f"trial {trial_id}'s lease ran out before its result arrived")
            late = expired_at is not None and not reported_late
            if not late:
                old.check_transition(new, trial_id)
            check_holder(study, trial_id, handed_to, holder, "finish")
            now = self._clock()
            detail = f"from {old.value}" + (" (late: after its lease expired)" if late else "")
            detail += f": {reason}" if reason else ""
            # sent together, answered in one round trip on PostgreSQL (``Tx.later``)
            _insert_measurements(tx, study_id, trial_id, now, repeats)
            if late and reoffered_as is not None:
                _supersede(tx, study_id, int(reoffered_as), trial_id, now)
            tx.executemany(
                "INSERT INTO metrics (study_id, trial_id, name, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (study_id, trial_id, name) DO UPDATE SET value = excluded.value",
                [(study_id, trial_id, k, v) for k, v in values.items()],
            )
            _insert_events(tx, [(study_id, trial_id, now, f"status:{new.value}", detail)])
            recorded = (
                (lambda: True)
                if request is None
                else self._record_later(tx, study_id, replace(request, answer_ids=(trial_id,)), now)
            )
            stored = tx.later(
                "UPDATE trials SET status = ?, reason = ?, updated_at = ?, lease_expires_at = "
                "CASE WHEN expired_at IS NULL THEN NULL ELSE lease_expires_at END, "
                "reported_late = ?, repeats = ?, spread_json = ?, "
                f"windows = {_WINDOWS} "
                "WHERE study_id = ? AND trial_id = ? RETURNING *",
                [
                    new.value, reason, now, int(late or bool(reported_late)),
                    max(1, len(repeats)), json.dumps(deviations), study_id, trial_id,
                ],
            )  # fmt: skip
            where, args = "AND t.trial_id = ?", [study_id, trial_id]
            configs = self._trial_values_later(tx, "parameters", "value_json", where, args)
            measured = self._trial_values_later(tx, "metrics", "value", where, args)
            if not recorded():  # the writes above roll back
                raise AlreadyExistsError(
                    f"request {request.request_id if request else ''!r} was answered "
                    "meanwhile; nothing more was stored"
                )
            return _trials(stored(), _values(configs(), json.loads), _values(measured(), float))[0]

    def add_measurements(
        self,
        study: str,
        trial_id: int,
        measurements: Sequence[Measurement],
        request: Request | None = None,
    ) -> list[Measurement]:
        trial_id = check_trial_id(trial_id)
        rows = [_measurement_row(m) for m in measurements]
        with self._write(f"add measurements to trial {trial_id} of study {study!r}") as tx:
            study_id = self._study_id(tx, study, lock=True)
            status = _stored_status(tx, study, study_id, trial_id)
            progress = [m.kind is MeasurementKind.PROGRESS for m in measurements]
            if any(progress) and (not all(progress) or status is not TrialStatus.ACTIVE):
                raise StateError(
                    f"trial {trial_id} is {status.value}: only an ACTIVE trial's measurement "
                    "is reported in progress, and alone"
                )
            if not any(progress) and not status.is_final:
                raise StateError(
                    f"trial {trial_id} is {status.value}: only a finished trial's "
                    "configuration takes further measurements"
                )
            now = self._clock()
            ids = _insert_measurements(tx, study_id, trial_id, now, rows)
            if request is not None:
                self._remember(tx, study_id, replace(request, answer_ids=tuple(ids)), now)
            if not ids:
                return []
            marks = ", ".join("?" * len(ids))
            return _load_measurements(tx, study_id, f"AND m.id IN ({marks})", ids)

    def list_measurements(
        self,
        study: str,
        trial_id: int | None = None,
        kinds: Collection[MeasurementKind] | None = None,
        ids: Collection[int] | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> list[Measurement]:
        where: list[str] = []
        params: list[Any] = []
        if ids is not None:
            chosen = sorted({int(i) for i in ids})
            where.append(f"AND m.id IN ({', '.join('?' * len(chosen))})" if chosen else "AND 1 = 0")
            params += chosen
        if kinds is not None:
            wanted = sorted({_measurement_kind(k, "kinds") for k in kinds})
            where.append(
                f"AND m.kind IN ({', '.join('?' * len(wanted))})" if wanted else "AND 1 = 0"
            )
            params += [k.value for k in wanted]
        with self._read(f"list measurements of study {study!r}") as tx:
            study_id = self._study_id(tx, study)
            if trial_id is not None:
                trial_id = check_trial_id(trial_id)
                _stored_status(tx, study, study_id, trial_id)
                where.append("AND m.trial_id = ?")
                params.append(trial_id)
            return _load_measurements(tx, study_id, " ".join(where), params, _page(offset, limit))

    def find_request(self, study: str, request_id: str) -> Request | None:
        check_text(request_id, "request_id", required=True)
        with self._peek(f"look up request {request_id!r}") as tx:
            row = tx.one(
                "SELECT r.method, r.digest, r.trial_ids, s.name FROM requests r "
                "JOIN studies s ON s.id = r.study_id WHERE r.request_id = ?",
                [request_id],
            )
        if row is None:
            return None
        if row[3] != study:
            raise ValidationError(
                "request_id",
                f"{request_id!r} was already used for a request to study {row[3]!r}",
                "a new id for every request",
            )
        return Request(request_id, row[0], row[1], tuple(int(i) for i in json.loads(row[2])))

    def _remember(self, tx: Tx, study_id: int, request: Request, now: float) -> None:
        """Record ``request`` inside the caller's transaction; forget week-old ones.

        Raises:
            AlreadyExistsError: Another call (another server's, with a shared database)
                recorded a request with this id first; the caller's writes roll back.
        """
        if not self._record(tx, study_id, request, now):
            raise AlreadyExistsError(
                f"request {request.request_id!r} was answered meanwhile; nothing more was stored"
            )

    def _record(self, tx: Tx, study_id: int, request: Request, now: float) -> bool:
        """Record ``request`` inside the caller's transaction unless a request with its id
        is recorded already (False: nothing was written); forget week-old ones."""
        return self._record_later(tx, study_id, request, now)()

    def _record_later(
        self, tx: Tx, study_id: int, request: Request, now: float
    ) -> Callable[[], bool]:
        """``_record`` sent now (``Tx.later``): whether it wrote is known when the returned
        function is called."""
        if now - self._forgotten_at > _FORGET_EVERY_S:
            tx.execute("DELETE FROM requests WHERE created_at < ?", [now - _REQUEST_RETENTION_S])
            self._forgotten_at = now
        stored = tx.later(
            "INSERT INTO requests (request_id, method, study_id, digest, trial_ids, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (request_id) DO NOTHING RETURNING 1",
            [request.request_id, request.method, study_id, request.digest,
             json.dumps(list(request.answer_ids)), now],
        )  # fmt: skip
        return lambda: bool(stored())

    def renew_lease(
        self, study: str, trial_id: int, expires_at: float, holder: str | None = None
    ) -> Trial:
        trial_id = check_trial_id(trial_id)
        with self._write(f"renew the lease of trial {trial_id} of study {study!r}") as tx:
            study_id = self._study_id(tx, study)  # the trial's lock is enough (LOCK_TRIALS)
            row = tx.one(
                "SELECT status, client_id FROM trials WHERE study_id = ? AND trial_id = ?"
                f"{self.LOCK_TRIALS}",
                [study_id, trial_id],
            )
            if row is None:
                raise NotFoundError(f"trial {trial_id} not found in study {study!r}")
            check_holder(study, trial_id, row[1], holder, "renew")
            if TrialStatus(row[0]) is not TrialStatus.ACTIVE:
                trial = self._load_trials(tx, study_id, "AND t.trial_id = ?", [trial_id])[0]
                raise StateError(_not_active(trial))
            tx.execute(
                "UPDATE trials SET heartbeat_at = ?, lease_expires_at = ? "
                "WHERE study_id = ? AND trial_id = ?",
                [self._clock(), float(expires_at), study_id, trial_id],
            )
        return self._reread(study, study_id, "AND t.trial_id = ?", [trial_id])[0]

    def expire_leases(
        self, study: str, now: float, status: TrialStatus, reoffer: bool
    ) -> list[Trial]:
        if status not in (TrialStatus.ABANDONED, TrialStatus.FAILED):
            raise ValidationError("status", f"got {status!r}", ["ABANDONED", "FAILED"])
        with self._peek(f"look for expired leases in study {study!r}") as tx:
            # the common case, nothing expired, without a write transaction or a lock; a
            # lease another call renews meanwhile is judged again under the lock below
            due = tx.one(
                f"SELECT EXISTS (SELECT 1 FROM trials t WHERE t.study_id = s.id AND {LAPSED}) "
                "FROM studies s WHERE s.name = ?",
                [TrialStatus.ACTIVE.value, now, check_text(study, "study")],
            )
        if due is None:
            raise NotFoundError(f"study {study!r} not found")
        if not due[0]:
            return []
        with self._write(f"expire leases in study {study!r}") as tx:
            study_id = self._study_id(tx, study, lock=True)
            expired = self._load_trials(
                tx,
                study_id,
                f"AND {LAPSED}",
                [TrialStatus.ACTIVE.value, now],
                lock=True,
            )
            if not expired:
                return []
            keys = _stored_keys(tx, study_id, [t.id for t in expired]) if reoffer else {}
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
                        key=keys.get(trial.id) or "",
                        transfer=trial.transfer,
                    )
                    detail = f"PENDING, re-offer of trial {trial.id}"
                    copy = _insert_trials(
                        tx, study_id, now, [(_trial_row(again, now), trial.config, {}, detail)]
                    )
                tx.execute(
                    "UPDATE trials SET status = ?, reason = ?, updated_at = ?, expired_at = ?, "
                    "reoffered_as = ? WHERE study_id = ? AND trial_id = ?",
                    [status.value, reason, now, now, copy, study_id, trial.id],
                )
                events.append((study_id, trial.id, now, "lease_expired", reason))
                if copy is not None:
                    events.append((study_id, trial.id, now, "reoffered", f"as trial {copy}"))
            _insert_events(tx, events)
            ids = [t.id for t in expired]
            marks = ", ".join("?" * len(ids))
            return self._load_trials(tx, study_id, f"AND t.trial_id IN ({marks})", ids)

    def claim_trials(
        self, study: str, client_id: str, count: int, lease_expires_at: float | None
    ) -> list[Trial]:
        check_text(client_id, "client_id")
        with self._peek(f"look for queued trials in study {study!r}") as tx:
            # the common case, none queued, without a write transaction; what is queued
            # meanwhile is claimed by a later call
            queued = tx.one(
                "SELECT EXISTS (SELECT 1 FROM trials t WHERE t.study_id = s.id AND t.status = ?) "
                "FROM studies s WHERE s.name = ?",
                [TrialStatus.PENDING.value, check_text(study, "study")],
            )
        if queued is None:
            raise NotFoundError(f"study {study!r} not found")
        if not queued[0] or count < 1:
            return []
        with self._write(f"hand out queued trials of study {study!r}") as tx:
            study_id = self._study_id(tx, study)
            ids = [
                row["trial_id"]
                for row in tx.rows(
                    "SELECT trial_id FROM trials WHERE study_id = ? AND status = ? "
                    f"ORDER BY trial_id LIMIT ?{self.SKIP_LOCKED}",
                    [study_id, TrialStatus.PENDING.value, max(0, int(count))],
                )
            ]
            if not ids:
                return []
            now = self._clock()
            marks = ", ".join("?" * len(ids))
            tx.execute(
                "UPDATE trials SET status = ?, client_id = ?, updated_at = ?, heartbeat_at = ?, "
                f"lease_expires_at = ? WHERE study_id = ? AND trial_id IN ({marks})",
                [TrialStatus.ACTIVE.value, client_id, now,
                 now if lease_expires_at is not None else None, lease_expires_at, study_id, *ids],
            )  # fmt: skip
            _insert_events(
                tx,
                [(study_id, i, now, "status:ACTIVE", f"from PENDING, client {client_id!r}")
                 for i in ids],
            )  # fmt: skip
        return self._reread(study, study_id, f"AND t.trial_id IN ({marks})", ids)

    def add_trial_event(
        self, study: str, trial_id: int, event: str, detail: str = ""
    ) -> TrialEvent:
        trial_id = check_trial_id(trial_id)
        check_text(event, "event", required=True)
        check_text(detail, "detail")
        with self._write(f"record an event for trial {trial_id} of study {study!r}") as tx:
            study_id = self._study_id(tx, study)
            _stored_status(tx, study, study_id, trial_id)
            now = self._clock()
            _insert_events(tx, [(study_id, trial_id, now, event, detail)])
        return TrialEvent(trial_id=trial_id, at=now, event=event, detail=detail)

    def trial_events(self, study: str, trial_id: int) -> list[TrialEvent]:
        trial_id = check_trial_id(trial_id)
        with self._read(f"read events of trial {trial_id} of study {study!r}") as tx:
            study_id = self._study_id(tx, study)
            _stored_status(tx, study, study_id, trial_id)
            rows = tx.rows(
                "SELECT trial_id, at, event, detail FROM trial_events "
                "WHERE study_id = ? AND trial_id = ? ORDER BY id",
                [study_id, trial_id],
            )
        return [TrialEvent(**row) for row in rows]

    def last_event(self, study: str, event: str) -> TrialEvent | None:
        check_text(event, "event", required=True)
        with self._read(f"read the last {event!r} event of study {study!r}") as tx:
            study_id = self._study_id(tx, study)
            rows = tx.rows(
                "SELECT trial_id, at, event, detail FROM trial_events "
                "WHERE study_id = ? AND event = ? ORDER BY id DESC LIMIT 1",
                [study_id, event],
            )
        return TrialEvent(**rows[0]) if rows else None

    def _probe(self, tx: Tx) -> None:
        """The write ``check`` makes: one row rewritten and committed."""
        tx.execute(
            "INSERT INTO write_probe (id, at) VALUES (1, ?) "
            "ON CONFLICT (id) DO UPDATE SET at = excluded.at",
            [self._clock()],
        )

    # -- helpers that need the dialect ----------------------------------------------------
    def _study_id(self, tx: Tx, name: str, lock: bool = False) -> int:
        """The study's row id; with ``lock``, the study's writes wait for this one."""
        row = tx.one(
            f"SELECT id FROM studies WHERE name = ?{self.LOCK_STUDY if lock else ''}",
            [check_text(name, "study")],
        )
        if row is None:
            raise NotFoundError(f"study {name!r} not found")
        return int(row[0])

    def _reread(self, study: str, study_id: int, where: str, params: Sequence[Any]) -> list[Trial]:
        """Trials a write just stored, read after its commit (``_load_trials``): the read's
        round trips are not made while the write holds the study's lock. Rows a write
        made or handed to one caller are changed next by that caller (or by an expiry of
        its lease, long after)."""
        with self._peek(f"read back trials of study {study!r}") as tx:
            return self._load_trials(tx, study_id, where, params)

    def _load_trials(
        self, tx: Tx, study_id: int, where: str, params: Sequence[Any], lock: bool = False
    ) -> list[Trial]:
        """Trials of one study matching ``where`` (SQL over alias ``t``), in id order; with
        ``lock``, their rows are locked (``LOCK_TRIALS``) until the transaction ends."""
        args = [study_id, *params]
        rows = tx.rows(
            f"SELECT * FROM trials t WHERE t.study_id = ? {where} ORDER BY t.trial_id"
            f"{self.LOCK_TRIALS if lock else ''}",
            args,
        )
        if not rows:
            return []
        configs = self._trial_values(tx, "parameters", "value_json", where, args, json.loads)
        metrics = self._trial_values(tx, "metrics", "value", where, args, float)
        return _trials(rows, configs, metrics)

    def _trial_values(
        self,
        tx: Tx,
        table: str,
        column: str,
        where: str,
        args: Sequence[Any],
        decode: Callable[[Any], Any],
    ) -> dict[int, dict[str, Any]]:
        """``trial_id -> {name: decode(column)}`` from ``table`` for the trials matching
        ``where``, in the order they were stored."""
        return _values(self._trial_values_later(tx, table, column, where, args)(), decode)

    def _trial_values_later(
        self, tx: Tx, table: str, column: str, where: str, args: Sequence[Any]
    ) -> Callable[[], list[dict[str, Any]]]:
        """``_trial_values``' rows, sent now (``Tx.later``), for ``_values``."""
        return tx.later(
            f"SELECT x.trial_id, x.name, x.{column} AS value FROM {table} x "
            "JOIN trials t ON t.study_id = x.study_id AND t.trial_id = x.trial_id "
            f"WHERE t.study_id = ? {where} ORDER BY x.{self.ORDER}",
            args,
        )


def _stored_status(tx: Tx, study: str, study_id: int, trial_id: int) -> TrialStatus:
    row = tx.one(
        "SELECT status FROM trials WHERE study_id = ? AND trial_id = ?", [study_id, trial_id]
    )
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
        "transfer_json": json.dumps([list(pair) for pair in trial.transfer]),
        "reason": "",
        "created_at": now,
        "updated_at": now,
        "heartbeat_at": now if trial.lease_expires_at is not None else None,
        "lease_expires_at": trial.lease_expires_at,
        "config_key": trial.key or None,
    }


def _refuse_taken(
    tx: Tx, study: str, study_id: int, since: int, trials: Sequence[NewTrial]
) -> None:
    """``TakenError`` when a trial stored after trial ``since`` has the key of one of
    ``trials`` (``Storage.add_trial_batches``); the caller holds the study's lock."""
    wanted = {t.key for t in trials if t.key}
    if not wanted:
        return
    rows = tx.rows(
        "SELECT trial_id, config_key FROM trials "
        "WHERE study_id = ? AND trial_id > ? AND config_key IS NOT NULL ORDER BY trial_id",
        [study_id, since],
    )
    holders = tuple(row["trial_id"] for row in rows if row["config_key"] in wanted)
    if holders:
        taken = len({row["config_key"] for row in rows if row["trial_id"] in holders})
        shown = ", ".join(map(str, holders[:10])) + (", ..." if len(holders) > 10 else "")
        raise TakenError(
            f"study {study!r}: {taken} of {len(trials)} new trials have configurations "
            f"stored meanwhile (trials {shown}, after trial {since}, the last of the history "
            "they were chosen from); nothing was stored",
            holders,
        )


def _stored_keys(tx: Tx, study_id: int, ids: Sequence[int]) -> dict[int, str | None]:
    """The stored ``config_key`` of each of the trials ``ids``."""
    marks = ", ".join("?" * len(ids))
    rows = tx.rows(
        f"SELECT trial_id, config_key FROM trials WHERE study_id = ? AND trial_id IN ({marks})",
        [study_id, *ids],
    )
    return {int(row["trial_id"]): row["config_key"] for row in rows}


def _next_trial_id(tx: Tx, study_id: int) -> int:
    """The id the study's next trial gets (the caller holds the study's lock)."""
    found = tx.one(
        "SELECT COALESCE(MAX(trial_id), 0) + 1 FROM trials WHERE study_id = ?", [study_id]
    )
    return int(cast(tuple[Any, ...], found)[0])


def _insert_trials(
    tx: Tx,
    study_id: int,
    now: float,
    made: Sequence[tuple[dict[str, Any], Mapping[str, Any], Mapping[str, float], str]],
    first: int | None = None,
) -> int:
    """Insert trials numbered on from the study's last (``first``, when the caller has
    just read it with ``_next_trial_id``), each given as (row, config, metrics, detail of
    its ``created`` event); returns the first new trial id. The caller holds the study's
    lock (``SQLStorage._study_id(lock=True)``)."""
    first = _next_trial_id(tx, study_id) if first is None else first
    numbered = list(enumerate(made, start=first))
    columns = ", ".join(_NEW_TRIAL_COLUMNS)
    tx.executemany(
        f"INSERT INTO trials ({columns}) VALUES ({', '.join('?' * len(_NEW_TRIAL_COLUMNS))})",
        [
            [study_id, i, *(row[key] for key in _NEW_TRIAL_COLUMNS[2:])]
            for i, (row, _, _, _) in numbered
        ],
    )
    # one executemany per table: building rows one by one in Python dominated storing a
    # batch of many-knob trials (one profile, 5,000 knobs: 14.5 s for 100 trials before,
    # 0.44 s for 10 after, on a VM running CI beside it)
    tx.executemany(
        "INSERT INTO parameters (study_id, trial_id, name, value_json) VALUES (?, ?, ?, ?)",
        [
            (study_id, i, name, json.dumps(value))
            for i, (_, config, _, _) in numbered
            for name, value in config.items()
        ],
    )
    tx.executemany(
        "INSERT INTO metrics (study_id, trial_id, name, value) VALUES (?, ?, ?, ?)",
        [
            (study_id, i, name, value)
            for i, (_, _, metrics, _) in numbered
            for name, value in metrics.items()
        ],
    )
    _insert_events(tx, [(study_id, i, now, "created", detail) for i, (*_, detail) in numbered])
    return first


def _values(
    rows: Iterable[Mapping[str, Any]], decode: Callable[[Any], Any]
) -> dict[int, dict[str, Any]]:
    """``trial_id -> {name: decode(value)}`` from rows of ``trial_id, name, value``."""
    out: dict[int, dict[str, Any]] = {}
    for row in rows:
        out.setdefault(row["trial_id"], {})[row["name"]] = decode(row["value"])
    return out


def _trials(
    rows: Iterable[Mapping[str, Any]],
    configs: Mapping[int, dict[str, Any]],
    metrics: Mapping[int, dict[str, float]],
) -> list[Trial]:
    """Trials from rows of the trials table and their parameters and metrics."""
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
            windows=int(row["windows"]),
            transfer=tuple((str(n), float(w)) for n, w in json.loads(row["transfer_json"])),
            **{key: row[key] for key in _TRIAL_COLUMNS},
        )
        for row in rows
    ]


def _insert_events(tx: Tx, events: Sequence[tuple[int, int, float, str, str]]) -> None:
    """Append ``(study_id, trial_id, at, event, detail)`` rows to the trial event log."""
    tx.executemany(
        "INSERT INTO trial_events (study_id, trial_id, at, event, detail) VALUES (?, ?, ?, ?, ?)",
        events,
    )


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
    tx: Tx, study_id: int, trial_id: int, now: float, rows: Sequence[dict[str, Any]]
) -> list[int]:
    """Insert checked measurement rows of one trial; the ids they got, in order."""
    ids = []
    for r in rows:
        made = tx.one(
            "INSERT INTO measurements (study_id, trial_id, kind, round, at, metrics_json) "
            "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
            [study_id, trial_id, r["kind"], r["round"], r["at"] or now, r["metrics_json"]],
        )
        ids.append(int(cast(tuple[Any, ...], made)[0]))
    return ids


def _load_measurements(
    tx: Tx, study_id: int, where: str, params: Sequence[Any], page: str = ""
) -> list[Measurement]:
    rows = tx.rows(
        "SELECT trial_id, kind, round, at, metrics_json FROM measurements m "
        f"WHERE m.study_id = ? {where} ORDER BY m.id{page}",
        [study_id, *params],
    )
    return [
        Measurement(
            metrics={k: float(v) for k, v in json.loads(row["metrics_json"]).items()},
            kind=MeasurementKind(row["kind"]),
            at=float(row["at"]),
            round=int(row["round"]),
            trial_id=int(row["trial_id"]),
        )
        for row in rows
    ]


def _page(offset: int, limit: int | None) -> str:
    """The ``LIMIT``/``OFFSET`` clause of a page of a listing ("" for all of it); both are
    checked integers, written into the SQL (SQLite and PostgreSQL spell "no limit"
    differently, and neither takes a placeholder for it)."""
    offset = check_trial_id(offset, "offset")
    if limit is not None:
        limit = check_trial_id(limit, "limit")
    if offset < 0 or (limit is not None and limit < 0):
        raise ValidationError("offset" if offset < 0 else "limit", "must be >= 0")
    if limit is None:
        return f" LIMIT {2**62} OFFSET {offset}" if offset else ""
    return f" LIMIT {limit} OFFSET {offset}"


def _step(value: str) -> StepKind:
    try:
        return StepKind(value)
    except ValueError:
        raise StorageError(
            f"trials.step holds {value!r}, which this tuner does not know "
            f"(known: {', '.join(k.value for k in StepKind)})"
        ) from None


def _supersede(tx: Tx, study_id: int, copy: int, late: int, now: float) -> None:
    """A late result arrived for trial ``late``: its re-offer ``copy``, if nobody has taken
    it yet, is not needed any more."""
    reason = f"not needed: trial {late} reported its result late"
    changed = tx.rows(
        "UPDATE trials SET status = ?, reason = ?, updated_at = ? "
        "WHERE study_id = ? AND trial_id = ? AND status = ? RETURNING trial_id",
        [TrialStatus.ABANDONED.value, reason, now, study_id, copy, TrialStatus.PENDING.value],
    )
    if changed:
        _insert_events(tx, [(study_id, copy, now, "status:ABANDONED", f"from PENDING: {reason}")])


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
