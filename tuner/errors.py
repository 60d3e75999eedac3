"""The domain error tree, shared by every layer.

Every error a user can cause names the field at fault and, where there is a closed set,
the allowed values. The gRPC layer maps each class to one status code (``server/errors.py``);
nothing else decides status codes.

::

    TunerError
    ├── ValidationError          bad input: a spec, a knob value, a metric  -> INVALID_ARGUMENT
    ├── NotFoundError            unknown study or trial                      -> NOT_FOUND
    ├── AlreadyExistsError       same study name, different spec              -> ALREADY_EXISTS
    │   └── TakenError           a configuration another writer stored first (the service
    │                            suggests again; never sent to a client)
    ├── StateError               e.g. completing a finished trial            -> FAILED_PRECONDITION
    ├── StorageError             the database cannot be read or written       -> UNAVAILABLE
    ├── OverloadedError          too busy now; retry after a delay            -> RESOURCE_EXHAUSTED
    ├── PermissionDeniedError    a trial handed to another client             -> PERMISSION_DENIED
    └── TargetError              a target could not run a trial (infrastructure)
        ├── ConfigRejected       the configuration itself is at fault (INFEASIBLE trial)
        └── TrialTimedOut        the measurement ran past its time limit (TIMED_OUT trial)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class TunerError(Exception):
    """Base class of every error raised on purpose by this project."""


class ValidationError(TunerError, ValueError):
    """Input that does not satisfy the contract.

    Attributes:
        field: Dotted path of the offending field, e.g. ``"space.knobs[2].low"``.
        message: What is wrong with it (the text after the field).
        allowed: Human-readable description of what would have been accepted.
    """

    def __init__(self, field: str, message: str, allowed: Any = None) -> None:
        self.field = field
        self.message = message
        self.allowed = allowed
        self._args = (field, message, allowed)
        text = f"{field}: {message}"
        if allowed is not None:
            text += f" (allowed: {_describe_allowed(allowed)})"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole, across worker processes
        return (type(self), self._args)


def relocate(error: ValidationError, old: str, new: str, label: str = "") -> ValidationError:
    """``error`` about a field under ``old`` (``knobs.x``), named under ``new`` instead
    (``study.knobs[3]``: the place in the file), with ``label`` (``knob 'x'``) before the
    message unless the message names it already; any other error unchanged.

    Knobs and objectives name their own fields by name (they do not know their place); a
    list that builds them calls this so that every error of an item has one path."""
    field = error.field
    if field != old and not field.startswith(old + ".") and not field.startswith(old + "["):
        return error
    message = error.message
    if label and label.split(" ", 1)[-1] not in message:
        message = f"{label}: {message}"
    return ValidationError(new + field[len(old) :], message, error.allowed)


class NotFoundError(TunerError, LookupError):
    """A study or trial that does not exist."""


class AlreadyExistsError(TunerError):
    """A study name already used with a different specification."""


class TakenError(AlreadyExistsError):
    """New trials whose configurations another writer (a server replica, a session on the
    same file) stored after the history they were chosen from; nothing was stored.

    Attributes:
        trial_ids: The stored trials with those configurations.
    """

    def __init__(self, message: str, trial_ids: tuple[int, ...]) -> None:
        self.trial_ids = tuple(trial_ids)
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.trial_ids))


class StateError(TunerError):
    """An operation that is not allowed in the object's current state."""


class StorageError(TunerError):
    """The database could not be read or written (disk full, read-only, corrupted)."""


class OverloadedError(TunerError):
    """The service is too busy to take the request now. Nothing was done: send the same
    request again after ``retry_after_s`` seconds."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        self.retry_after_s = float(retry_after_s)
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.retry_after_s))


class PermissionDeniedError(TunerError):
    """The caller may not do this: e.g. finish a trial handed to another client."""


class TargetError(TunerError):
    """A target failed for reasons outside the configuration (a FAILED trial)."""


class ConfigRejected(TargetError):
    """The configuration itself made the system fail or breach a limit (an INFEASIBLE trial)."""


class TrialTimedOut(TargetError):
    """The measurement ran past its time limit and was stopped (a TIMED_OUT trial)."""


def _describe_allowed(allowed: Any) -> str:
    if isinstance(allowed, str):
        return allowed
    if isinstance(allowed, Iterable):
        return ", ".join(repr(a) if isinstance(a, str) else str(a) for a in allowed)
    return str(allowed)
