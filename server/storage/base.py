"""The storage contract: what the service may ask of any backend that keeps studies and trials.

The service is the only writer. A backend stores studies (immutable ``StudySpec`` plus a
creation time), trials (configuration, status, metrics, provenance) and an append-only log
of trial events, and it keeps four promises:

* **Atomic writes.** ``add_trials`` and ``finish_trial`` each either happen completely or
  not at all; a crash or a full disk never leaves a half-written trial behind.
* **Exact values.** A parameter value comes back with the type it went in with (an ``int``
  stays an ``int``, a ``bool`` a ``bool``); metrics are finite floats.
* **Checked life cycle.** ``finish_trial`` applies ``TrialStatus.check_transition`` to the
  stored status inside the same transaction that writes the new one, so two concurrent
  reports for one trial cannot both succeed.
* **No configuration twice by accident.** ``add_trial_batches`` with ``since`` refuses a
  trial whose configuration another writer stored after the history it was chosen from
  (checked and stored in one transaction), so replicas and sessions sharing a database do
  not measure one configuration twice.

Errors come from ``tuner.errors``: ``NotFoundError``, ``AlreadyExistsError``,
``StateError``, ``ValidationError`` for bad arguments, and ``StorageError`` when the
database itself cannot be read or written. One conformance suite
(``tests/server/test_storage_contract.py``) runs against every backend.

Shape after Optuna's ``BaseStorage`` (``optuna/storages/_base.py``) and Vizier's datastore,
trimmed to what this service needs.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from tuner.errors import PermissionDeniedError, ValidationError
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, Trial, TrialStatus

#: Statuses a trial may be created with; final statuses are reached through ``finish_trial``.
CREATABLE_STATUSES = (TrialStatus.PENDING, TrialStatus.ACTIVE)
#: What ``Storage.stored_size`` counts for each row besides its text: its numbers and keys.
ROW_CHARS = 16


class LeaseLapsed(Exception):
    """``finish_trial`` with ``due``: the trial is ACTIVE and its lease ran out before
    ``due``, and nothing has expired it yet. Nothing was written; the caller expires the
    study's leases (``expire_leases``) and finishes the trial again, as a late result."""


@dataclass(frozen=True)
class StoredStudy:
    """A study as stored: its number in the database, its spec and when it was created."""

    id: int
    spec: StudySpec
    created_at: float

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class StoredSize:
    """How much a study holds (``Storage.stored_size``).

    Attributes:
        chars: Characters of text stored for it: the spec's JSON; each trial's texts
            (client, source, warning, reason, embedded point, spread and transfer weights as
            JSON), parameter
            names and JSON values, metric names; each measurement's metrics as JSON; each
            event's text; plus ``ROW_CHARS`` for every row but the study's.
        unfinished: Its PENDING and ACTIVE trials, whose results are still to come.
    """

    chars: int
    unfinished: int


@dataclass(frozen=True)
class TrialEvent:
    """One line of a trial's history.

    Attributes:
        trial_id: Number of the trial within its study.
        at: Unix time of the event.
        event: What happened: ``created``, ``status:<STATUS>``, or a service-defined word
            such as ``reoffered``.
        detail: Free text (the previous status, a reason, the client).
    """

    trial_id: int
    at: float
    event: str
    detail: str


@dataclass(frozen=True)
class Request:
    """A mutating request with a client-chosen id, stored with the write it caused.

    Attributes:
        request_id: The client's id for the request (unique per request, kept for a week).
        method: The RPC, e.g. ``CompleteTrial``.
        digest: A hash of what was asked; a retry with another digest is refused.
        answer_ids: What the request answered with, filled in by the backend: the trials'
            ids, or for ``AddMeasurements`` the stored measurements' (``list_measurements``
            with ``ids``).
    """

    request_id: str
    method: str
    digest: str
    answer_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class NewTrial:
    """A trial to be added; the backend assigns its id and timestamps.

    Attributes:
        config: Knob name -> value (``float``, ``int``, ``str`` or ``bool``). The service has
            already validated it against the study's search space.
        client_id: The worker the trial is handed to (empty for a queued trial).
        source: A label for people (the step's name for the designer's trials).
        warning: Numerical trouble met while suggesting it.
        status: ``PENDING`` (queued) or ``ACTIVE`` (handed out).
        step: The step of the generation strategy that made it.
        embedded: The low-dimensional point of a study searched in an embedding, else empty.
        lease_expires_at: For an ACTIVE trial, when its lease runs out (None: no lease).
        key: The configuration's identity (``tuner.config_key.key_text``), which
            ``Storage.add_trial_batches`` checks against what others stored meanwhile;
            empty: none (never checked).
        transfer: What each transfer source weighed in the model that suggested it
            (``Trial.transfer``): source names (``""``: the study's own) and weights in [0, 1].
    """

    config: Config
    client_id: str = ""
    source: str = ""
    warning: str = ""
    status: TrialStatus = TrialStatus.ACTIVE
    embedded: tuple[float, ...] = ()
    lease_expires_at: float | None = None
    step: StepKind = StepKind.IMPORT
    key: str = ""
    transfer: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", check_config(self.config))
        object.__setattr__(self, "transfer", check_weights(self.transfer, "trial.transfer"))
        object.__setattr__(self, "embedded", check_point(self.embedded, "trial.embedded"))
        if not isinstance(self.step, StepKind):
            raise ValidationError("trial.step", f"got {self.step!r}", [k.value for k in StepKind])
        for key in ("client_id", "source", "warning", "key"):
            check_text(getattr(self, key), f"trial.{key}")
        status = check_status(self.status, "trial.status")
        if status not in CREATABLE_STATUSES:
            raise ValidationError(
                "trial.status",
                f"a new trial cannot start as {status.value}",
                [s.value for s in CREATABLE_STATUSES],
            )
        object.__setattr__(self, "status", status)


@dataclass(frozen=True)
class NewBatch:
    """New trials for one caller, added with others in one transaction
    (``Storage.add_trial_batches``).

    Attributes:
        trials: The caller's new trials.
        request: The caller's request, recorded with them (None: no request id).
        answered: Trials the caller hands out besides the new ones (its request's answer
            begins with them).
    """

    trials: Sequence[NewTrial]
    request: Request | None = None
    answered: Sequence[int] = ()


@dataclass(frozen=True)
class FinishedTrial:
    """A trial measured elsewhere, added with its outcome (``Storage.import_trials``).

    Attributes:
        config: Knob name -> value, already validated against the study's space.
        status: A final status (COMPLETED, INFEASIBLE, FAILED, TIMED_OUT, ABANDONED).
        metrics: Its metrics (finite floats).
        reason: Why it is not COMPLETED, if it is not.
        source: Where it came from (``import``, ``import:<study>``, ``import:<file>``).
        key: The configuration's identity, as ``NewTrial.key``.
    """

    config: Config
    status: TrialStatus
    metrics: Mapping[str, float] = field(default_factory=dict)
    reason: str = ""
    source: str = "import"
    key: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", check_config(self.config))
        object.__setattr__(self, "metrics", check_metrics(self.metrics))
        status = check_status(self.status, "trial.status")
        if not status.is_final:
            raise ValidationError(
                "trial.status", f"an imported trial is finished, not {status.value}",
                [s.value for s in TrialStatus if s.is_final],
            )  # fmt: skip
        object.__setattr__(self, "status", status)
        for key in ("reason", "source", "key"):
            check_text(getattr(self, key), f"trial.{key}")


class Storage(ABC):
    """Durable home of studies, trials and trial events; safe to share between threads."""

    # -- studies ----------------------------------------------------------------------
    @abstractmethod
    def create_study(self, spec: StudySpec) -> StoredStudy:
        """Store a new study.

        Raises:
            AlreadyExistsError: A study with this name exists (whatever its spec); the message
                says whether the stored spec is the same or different.
        """

    @abstractmethod
    def get_study(self, name: str) -> StoredStudy:
        """The study called ``name``.

        Raises:
            NotFoundError: No such study; the message names it.
        """

    @abstractmethod
    def list_studies(self, offset: int = 0, limit: int | None = None) -> list[StoredStudy]:
        """The studies, oldest first: at most ``limit`` (None: all) from the ``offset``-th
        on (studies are never deleted, so an offset stays where it was)."""

    @abstractmethod
    def stored_size(self, study: str) -> StoredSize:
        """What the study holds (``StoredSize``), counted the same way on every backend.

        Raises:
            NotFoundError: Unknown study.
        """

    # -- trials -----------------------------------------------------------------------
    @abstractmethod
    def add_trials(
        self,
        study: str,
        trials: Sequence[NewTrial],
        request: Request | None = None,
        answered: Sequence[int] = (),
        since: int | None = None,
    ) -> list[Trial]:
        """Add trials in one transaction, numbering them on from the study's last trial id.

        Ids are 1, 2, 3, ... per study, never reused, and unique even when several threads
        add trials at once. Each new trial gets a ``created`` event. With ``request``, the
        request is recorded in the same transaction, answered by ``answered`` (trials the
        caller hands out besides the new ones) followed by the new trials. ``since``: as in
        ``add_trial_batches``.

        Raises:
            NotFoundError: Unknown study.
            TakenError: As in ``add_trial_batches``.
        """

    @abstractmethod
    def add_trial_batches(
        self, study: str, batches: Sequence[NewBatch], since: int | None = None
    ) -> list[list[Trial] | None]:
        """Add the trials of several callers in one transaction (one designer run's
        suggestions for the calls it served), each batch numbered and recorded as
        ``add_trials`` would; returns each batch's new trials.

        A batch whose request id another call recorded first (another server, on a shared
        database) gets None instead and stores nothing; the other batches are stored.

        With ``since``, the last trial id of the history the new trials were chosen from,
        a new trial is refused when its ``key`` is the key of a trial stored after trial
        ``since``: another writer (a server replica, a process on the same file) chose the
        same configuration from the same history meanwhile. The check and the insert are
        one transaction under the study's lock, so of two writers racing with one
        configuration exactly one stores it. Trials up to ``since`` are not compared: the
        caller saw them, and may choose one of their configurations again on purpose (a
        FAILED one it retries).

        Raises:
            NotFoundError: Unknown study.
            TakenError: Some new trial's configuration was stored after trial ``since``;
                nothing was stored, and the error names the trials that hold it.
        """

    @abstractmethod
    def import_trials(
        self, study: str, trials: Sequence[FinishedTrial], request: Request | None = None
    ) -> list[Trial]:
        """Add finished trials (with their metrics) in one transaction, numbered on like
        ``add_trials``, each with a ``created`` event saying it was imported; with
        ``request``, the request is recorded in the same transaction."""

    @abstractmethod
    def get_trial(self, study: str, trial_id: int) -> Trial:
        """One trial.

        Raises:
            NotFoundError: Unknown study or trial.
        """

    @abstractmethod
    def list_trials(
        self,
        study: str,
        statuses: Collection[TrialStatus] | None = None,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Trial]:
        """The study's trials in id order, only those with one of ``statuses`` when given:
        at most ``limit`` (None: all) of those with an id above ``after``."""

    @abstractmethod
    def active_trials(self, study: str, client_id: str) -> list[Trial]:
        """ACTIVE trials handed to ``client_id``, in id order."""

    @abstractmethod
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
        """Move a trial to ``status`` and record its metrics, reason and a ``status:`` event.

        With ``holder``, only that client may: a trial handed to another client raises
        ``PermissionDeniedError`` and nothing is written (a trial handed out anonymously, or
        imported, is anyone's). The check and the write are one transaction.

        With ``request``, the request is recorded (answered by this trial) in the same
        transaction. With ``measurements`` (the trial's repeats; ``metrics`` are then their
        means, computed by the caller, and ``spread`` their standard deviations), each is
        stored and the trial's ``repeats`` becomes their number.

        The stored status is read, checked and overwritten in one transaction. Metrics with
        names already stored for the trial replace the old values.

        A trial given up by ``expire_leases`` takes one late result: the transition from its
        expiry status is allowed once, ``reported_late`` is set, and a re-offer of it that
        is still PENDING becomes ABANDONED (its configuration is measured now). With ``due``
        (when the result arrived), a trial that ``expire_leases`` would give up at ``due``
        but has not yet raises ``LeaseLapsed`` and nothing is written: the lease is judged
        in the transaction that stores the result, without a look at the study's other
        leases first.

        Raises:
            LeaseLapsed: See ``due``.
            NotFoundError: Unknown study or trial.
            StateError: The transition is not allowed; the message names both statuses.
                (Checked before ``holder``: a finished trial is a StateError for anyone.)
            PermissionDeniedError: The trial was handed to a client other than ``holder``.
            ValidationError: A metric is not a finite number (field ``metrics.<name>``).
        """

    @abstractmethod
    def add_measurements(
        self,
        study: str,
        trial_id: int,
        measurements: Sequence[Measurement],
        request: Request | None = None,
    ) -> list[Measurement]:
        """Store measurements of a finished trial's configuration (controls, confirmation
        rounds), or windows of an ACTIVE trial's measurement in progress (PROGRESS, only
        those), in one transaction, without changing the trial. A measurement with ``at = 0``
        is stamped with the current time. With ``request``, the request is recorded (answered
        by the new measurements' ids) in the same transaction; a request id already recorded
        raises ``AlreadyExistsError`` and stores nothing.

        Returns:
            The measurements as stored (with ``trial_id`` and ``at`` set).

        Raises:
            NotFoundError: Unknown study or trial.
            StateError: The trial is not finished (PROGRESS: not ACTIVE).
            ValidationError: A metric is not a finite number (field ``metrics.<name>``).
        """

    @abstractmethod
    def list_measurements(
        self,
        study: str,
        trial_id: int | None = None,
        kinds: Collection[MeasurementKind] | None = None,
        ids: Collection[int] | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> list[Measurement]:
        """The study's measurements in the order they were stored; only one trial's, only
        some kinds, or only those a request answered with (``Request.answer_ids``), when
        given: at most ``limit`` (None: all) of them from the ``offset``-th on
        (measurements are never deleted, so an offset stays where it was).

        Raises:
            NotFoundError: Unknown study (or trial, when one is named).
        """

    @abstractmethod
    def find_request(self, study: str, request_id: str) -> Request | None:
        """The recorded request with this id, or None."""

    @abstractmethod
    def renew_lease(
        self, study: str, trial_id: int, expires_at: float, holder: str | None = None
    ) -> Trial:
        """Record a heartbeat: the ACTIVE trial's lease now runs until ``expires_at``.
        ``holder``: as in ``finish_trial``.

        Raises:
            NotFoundError: Unknown study or trial.
            PermissionDeniedError: The trial was handed to a client other than ``holder``.
            StateError: The trial is not ACTIVE; the message says what became of it (for an
                expired lease: when, and the trial that re-offers its configuration).
        """

    @abstractmethod
    def expire_leases(
        self, study: str, now: float, status: TrialStatus, reoffer: bool
    ) -> list[Trial]:
        """Give up every ACTIVE trial whose lease ran out before ``now``, in one transaction.

        Each becomes ``status`` (ABANDONED or FAILED) with ``expired_at = now``, a reason
        naming its client and the lease's end, and a ``lease_expired`` event. With
        ``reoffer``, each also gets a new PENDING trial with the same configuration (and
        key; a ``reoffered`` event, the new trial in ``reoffered_as``), which ``claim_trials``
        hands out before anything new is suggested.

        Returns:
            The expired trials as they are now stored.
        """

    @abstractmethod
    def claim_trials(
        self, study: str, client_id: str, count: int, lease_expires_at: float | None
    ) -> list[Trial]:
        """Hand up to ``count`` PENDING trials (oldest first) to ``client_id`` as ACTIVE."""

    @abstractmethod
    def add_trial_event(
        self, study: str, trial_id: int, event: str, detail: str = ""
    ) -> TrialEvent:
        """Append an event (e.g. ``reoffered``) to a trial's history without changing it.

        Raises:
            NotFoundError: Unknown study or trial.
        """

    @abstractmethod
    def trial_events(self, study: str, trial_id: int) -> list[TrialEvent]:
        """The trial's history, oldest first.

        Raises:
            NotFoundError: Unknown study or trial.
        """

    @abstractmethod
    def last_event(self, study: str, event: str) -> TrialEvent | None:
        """The study's latest event named ``event``, of any trial; None when there is none
        (how a result computed with the model, such as the best by posterior mean, is kept
        for readers without it: ``server.best``).

        Raises:
            NotFoundError: Unknown study.
        """

    # -- housekeeping -------------------------------------------------------------------
    @abstractmethod
    def schema_version(self) -> int:
        """The schema version of the stored data (0 for a backend without versions)."""

    @abstractmethod
    def check(self) -> None:
        """Raise ``StorageError`` when the backend can no longer keep what it is given (its
        data deleted or replaced, writes failing); a server probes it every few seconds
        and reports NOT_SERVING while it fails."""

    @abstractmethod
    def close(self) -> None:
        """Release the backend's resources; later calls raise ``StorageError``."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def check_config(config: Any) -> Config:
    """A copy of ``config`` after checking that it maps strings to scalar values.

    Raises:
        ValidationError: Not a mapping, a non-string name, or a value that is not a finite
            ``float``, an ``int``, a ``str`` or a ``bool`` (field ``config.<name>``).
    """
    if not isinstance(config, Mapping):
        raise ValidationError("config", "must be a mapping of knob name to value")
    out: Config = {}
    for name, value in config.items():
        if not isinstance(name, str) or not name:
            raise ValidationError("config", f"knob names must be non-empty strings, got {name!r}")
        storable(name, "config")  # (values are stored as JSON text, which escapes a NUL)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValidationError(f"config.{name}", f"got {value!r}", "finite numbers")
        if not isinstance(value, float | int | str | bool):
            raise ValidationError(
                f"config.{name}", f"got a {type(value).__name__}", "float, int, str, bool"
            )
        out[name] = value
    return out


def check_metrics(metrics: Any) -> dict[str, float]:
    """Metrics as a name -> finite float dictionary.

    Raises:
        ValidationError: Not a mapping, a non-string name, or a value that is not a finite
            real number (field ``metrics.<name>``).
    """
    if not isinstance(metrics, Mapping):
        raise ValidationError("metrics", "must be a mapping of metric name to value")
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise ValidationError(
                "metrics", f"metric names must be non-empty strings, got {name!r}"
            )
        storable(name, "metrics")
        number = _finite_float(value)
        if number is None:
            raise ValidationError(f"metrics.{name}", f"got {value!r}", "finite numbers")
        out[name] = number
    return out


def check_status(status: Any, field_: str = "status") -> TrialStatus:
    """``status`` as a ``TrialStatus`` (its string value is accepted too).

    Raises:
        ValidationError: Not a trial status; the message lists the statuses.
    """
    try:
        return TrialStatus(status)
    except ValueError:
        raise ValidationError(
            field_, f"unknown trial status {status!r}", [s.value for s in TrialStatus]
        ) from None


def check_text(value: Any, field_: str, *, required: bool = False) -> str:
    """``value`` if it is a string (non-empty when ``required``) that every backend can
    store (``storable``); else ``ValidationError``."""
    if not isinstance(value, str) or (required and not value):
        wanted = "a non-empty string" if required else "a string"
        raise ValidationError(field_, f"must be {wanted}, got {value!r}")
    return storable(value, field_)


def storable(text: str, field_: str) -> str:
    """``text`` if every backend stores it as given: no NUL character (PostgreSQL's text
    cannot hold one, SQLite's can: the same request must not be stored on one backend and
    fail on the other) and no unpaired surrogate (Python's stand-in for bytes that are not
    UTF-8, such as an undecodable file name, which no UTF-8 column can hold).

    Raises:
        ValidationError: naming ``field_`` and where the character is.
    """
    bad = _UNSTORABLE.search(text)
    if bad is None:
        return text
    char = bad.group(0)
    what = "a NUL character (\\x00)" if char == "\0" else f"an unpaired surrogate ({char!r})"
    raise ValidationError(
        field_,
        f"holds {what} at character {bad.start() + 1} of {len(text)}, which cannot be stored",
        "text without NUL characters or unpaired surrogates (valid UTF-8)",
    )


def storable_tree(value: Any, field_: str) -> None:
    """``storable`` for every string in ``value`` (nested dicts and lists, as
    ``StudySpec.to_dict`` makes), keys included; the error names the path
    (``spec.knobs[2].choices[1]``)."""
    if isinstance(value, str):
        storable(value, field_)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{field_}.{key}" if isinstance(key, str) and key.isidentifier() else field_
            if isinstance(key, str):
                storable(key, where)
            storable_tree(item, where)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            storable_tree(item, f"{field_}[{i}]")


def check_point(value: Any, field_: str) -> tuple[float, ...]:
    """``value`` as a tuple of finite floats; else ``ValidationError``."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValidationError(field_, f"must be a list of numbers, got {value!r}")
    out = []
    for i, item in enumerate(value):
        number = _finite_float(item)
        if number is None:
            raise ValidationError(f"{field_}[{i}]", f"must be a finite number, got {item!r}")
        out.append(number)
    return tuple(out)


def check_weights(value: Any, field_: str) -> tuple[tuple[str, float], ...]:
    """``value`` as ``(name, weight)`` pairs, each weight a number in [0, 1]; else
    ``ValidationError``."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValidationError(field_, f"must be a list of (source, weight) pairs, got {value!r}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str | bytes) or not isinstance(item, Sequence) or len(item) != 2:
            raise ValidationError(f"{field_}[{i}]", f"got {item!r}", "a (source, weight) pair")
        name, weight = item
        check_text(name, f"{field_}[{i}].source")
        number = _finite_float(weight)
        if number is None or not 0.0 <= number <= 1.0:
            raise ValidationError(f"{field_}[{i}].weight", f"got {weight!r}", "a number in [0, 1]")
        out.append((str(name), number))
    return tuple(out)


def check_holder(
    study: str, trial_id: int, handed_to: str, holder: str | None, action: str
) -> None:
    """``PermissionDeniedError`` unless ``holder`` (None: anyone) may ``action`` a trial
    ``handed_to`` that client ("": handed out anonymously, or imported: anyone's)."""
    if holder is None or not handed_to or handed_to == holder:
        return
    raise PermissionDeniedError(
        f"trial {trial_id} of study {study!r} was handed to client {handed_to!r}, not "
        f"{holder!r}: only that client may {action} it (an operator may, with override_holder)"
    )


def check_trial_id(trial_id: Any, field_: str = "trial_id") -> int:
    """``trial_id`` if it is an integer (not a bool); else ``ValidationError``."""
    if isinstance(trial_id, bool) or not isinstance(trial_id, int):
        raise ValidationError(field_, f"must be an integer, got {trial_id!r}")
    return trial_id


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _finite_float(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a finite real number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
