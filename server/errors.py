"""Domain errors <-> gRPC status codes: one table, one decorator, and its inverse.

``ERROR_CODES`` is the only place that decides which status code a domain error becomes.
``grpc_errors`` applies it to every servicer method: a ``TunerError`` aborts the call with its
code and message; anything else is a bug and becomes ``INTERNAL`` with a generic message
while the traceback goes to the server log. The client inverts the same table
(``error_from_rpc``), so code on either side of the wire handles the same exception classes.

Besides the status code and message, an error status carries rich details
(``google.rpc.Status``, read by ``grpc_status.rpc_status``):

* ``ErrorInfo(domain="tuner.v1", reason=<status code name>)`` marks a status raised on
  purpose by this server, which tells it apart from transport errors with the same code
  (a server that cannot be reached is also ``UNAVAILABLE``, but not a ``StorageError``);
* ``BadRequest`` with one field violation for ``ValidationError``, so the client rebuilds the
  error with its ``field``;
* ``RetryInfo`` with the delay for ``OverloadedError`` (RESOURCE_EXHAUSTED: the server is
  too busy to take the call now; nothing was done, and the same call may be sent again
  after the delay). A RESOURCE_EXHAUSTED without the tuner's ``ErrorInfo`` comes from gRPC
  itself (a message over the size limit) and is not retried.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from tuner.errors import (
    AlreadyExistsError,
    NotFoundError,
    OverloadedError,
    PermissionDeniedError,
    StateError,
    StorageError,
    TunerError,
    ValidationError,
)

log = logging.getLogger(__name__)

ERROR_DOMAIN = "tuner.v1"
INTERNAL_MESSAGE = "internal error; see server log"
# Characters of a status message; with the field and the rich details, percent- and
# base64-encoded, the trailers of even an all-CJK message stay well under gRPC's 16 KiB.
MAX_MESSAGE = 600

# Most specific class first: the first row whose class matches decides.
ERROR_CODES: tuple[tuple[type[TunerError], grpc.StatusCode], ...] = (
    (ValidationError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (StateError, grpc.StatusCode.FAILED_PRECONDITION),
    (StorageError, grpc.StatusCode.UNAVAILABLE),
    (OverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
)
# The inverse, for the client. INTERNAL (an unexpected server error) comes back as the base
# class, since the server tells nothing more about it.
CODE_ERRORS: dict[grpc.StatusCode, type[TunerError]] = {
    **{code: cls for cls, code in ERROR_CODES},
    grpc.StatusCode.INTERNAL: TunerError,
}

_Method = TypeVar("_Method", bound=Callable[..., Any])


def status_for(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message that report ``error`` to a client.

    Args:
        error: An exception raised while serving a call.

    Returns:
        ``(code, message)``: the table's code and the error's own message for domain errors,
        ``(INTERNAL, INTERNAL_MESSAGE)`` for anything else.
    """
    for cls, code in ERROR_CODES:
        if isinstance(error, cls):
            return code, str(error)
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE


class Undecodable:
    """A request whose bytes do not decode as its method's message (``lenient``): the
    method answers INVALID_ARGUMENT instead of gRPC's INTERNAL "Exception deserializing
    request!"."""

    def __init__(self, message: str, reason: str) -> None:
        self.message = message
        self.reason = reason

    def error(self) -> ValidationError:
        return ValidationError(
            "request",
            f"cannot be decoded as a {self.message} message ({self.reason})",
            f"a serialized {self.message}",
        )


def lenient(parse: Callable[[bytes], Any], message: str) -> Callable[[bytes], Any]:
    """``parse``, returning an ``Undecodable`` where it would raise."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as error:  # DecodeError, or anything else the parser raises
            return Undecodable(message, shorten(str(error) or type(error).__name__, 200))

    return deserialize


def grpc_errors(method: _Method) -> _Method:
    """Decorate a servicer method so that exceptions become gRPC statuses via ``ERROR_CODES``.

    The wrapped method has the servicer signature ``(self, request, context)``. Errors that
    are not in the table are logged with their traceback and reported as ``INTERNAL`` with
    a generic message, so no internals leak to clients.
    """

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        begun = time.perf_counter()
        try:
            if isinstance(request, Undecodable):
                raise request.error()
            reply = method(self, request, context)
        except Exception as exc:
            error: Exception = exc
        else:
            _observe(self, method.__name__, request, grpc.StatusCode.OK, begun)
            return reply
        code, message = status_for(error)
        message = shorten(message)
        fields = {"rpc": method.__name__, "code": code.name,
                  "study": str(getattr(request, "study", "") or "")}  # fmt: skip
        if code is grpc.StatusCode.INTERNAL:
            log.error("%s failed unexpectedly", method.__name__, exc_info=error, extra=fields)
        elif isinstance(error, StorageError):  # the disk is full, read-only, or gone
            log.error("%s: %s %s", method.__name__, code.name, message, extra=fields)
        else:
            log.info("%s: %s %s", method.__name__, code.name, message, extra=fields)
        _observe(self, method.__name__, request, code, begun)
        context.abort_with_status(rpc_status.to_status(_rich_status(code, message, error)))
        raise AssertionError("unreachable: abort_with_status raises")  # pragma: no cover

    return cast(_Method, wrapper)


def _observe(servicer: Any, method: str, request: Any, code: grpc.StatusCode, begun: float) -> None:
    """Record the call's latency in the servicer's metrics (if it has any) and the log."""
    seconds = time.perf_counter() - begun
    study = str(getattr(request, "study", "") or "")
    metrics = getattr(servicer, "metrics", None)
    if metrics is not None:
        metrics.observe(method, code.name, seconds, study)
    fields = {"rpc": method, "code": code.name, "study": study, "ms": round(seconds * 1000, 2)}
    log.debug("%s %s in %.1f ms", method, code.name, seconds * 1000, extra=fields)


def shorten(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` cut to ``limit`` characters with a note of how much was cut.

    A status message travels in a trailer, and gRPC clients drop trailers over 16 KiB (the
    client sees RESOURCE_EXHAUSTED instead of the error): a message quoting a megabyte of
    hostile input must not cost the client the answer.
    """
    if len(message) <= limit:
        return message
    return f"{message[: limit - 40]}... ({len(message) - limit + 40} characters cut)"


def error_from_rpc(error: grpc.RpcError) -> Exception:
    """The domain exception a failed call stands for, or ``error`` itself.

    Statuses raised on purpose by a tuner server (marked with ``ErrorInfo`` of domain
    ``ERROR_DOMAIN``) become the class ``CODE_ERRORS`` names for their code, with the
    server's message; a ``ValidationError`` gets its ``field`` back. Anything else (the
    server cannot be reached, a deadline passed, another server answered) is returned as is.

    Args:
        error: The ``grpc.RpcError`` raised by a stub call (also a ``grpc.Call``).
    """
    call = cast(grpc.Call, error)
    status = _rich_status_of(error)
    if status is None or _error_info(status) is None:
        return error
    cls = CODE_ERRORS.get(call.code())
    if cls is None:
        return error
    message = call.details() or ""
    if cls is ValidationError:
        return _validation_error(status, message)
    if cls is OverloadedError:
        return OverloadedError(message, retry_delay(status))
    return cls(message)


def retry_delay(status: status_pb2.Status) -> float:
    """The delay a ``RetryInfo`` detail of ``status`` asks for, in seconds (0: none)."""
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return max(0.0, info.retry_delay.ToTimedelta().total_seconds())
    return 0.0


# -- helpers -----------------------------------------------------------------------------


def _rich_status(code: grpc.StatusCode, message: str, error: Exception) -> status_pb2.Status:
    numeric = code.value[0]
    details = [_pack(error_details_pb2.ErrorInfo(domain=ERROR_DOMAIN, reason=code.name))]
    if isinstance(error, ValidationError):
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=shorten(error.field, 200), description=message
        )
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[violation])))
    if isinstance(error, OverloadedError):
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(max(1, round(error.retry_after_s * 1000)))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    return status_pb2.Status(code=numeric, message=message, details=details)


def _pack(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _rich_status_of(error: grpc.RpcError) -> status_pb2.Status | None:
    try:
        return rpc_status.from_call(cast(grpc.Call, error))
    except (ValueError, AttributeError):
        # Inconsistent or missing trailers: not a status this server produced.
        return None


def _error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo | None:
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == ERROR_DOMAIN:
                return info
    return None


def _validation_error(status: status_pb2.Status, message: str) -> ValidationError:
    field = ""
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            request = error_details_pb2.BadRequest()
            detail.Unpack(request)
            if request.field_violations:
                field = request.field_violations[0].field
    prefix = f"{field}: "
    text = message[len(prefix) :] if field and message.startswith(prefix) else message
    return ValidationError(field or "request", text)
