"""What the service checks in a request before anything is stored: limits, names, text,
statuses, reported metrics and repeats, and the record of a request with an id.

Every function raises ``ValidationError`` naming the field and what is allowed; the
service's parts (``server.service``) call them once per request, before storage.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence

from server.storage import Request, storable
from tuner.config_key import config_key, key_text
from tuner.constraints import METRIC_NAME
from tuner.errors import ValidationError
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, TrialStatus

MAX_CLIENT_ID = 256
MAX_REQUEST_ID = 256
MAX_REASON = 4096
#: Characters of an imported trial's source ("import:<file name or study>").
MAX_SOURCE = 1024
MAX_IMPORT = 10_000
MAX_MEASUREMENTS = 1_000
#: Metrics one trial or measurement may report (the study's and extra readings).
MAX_METRICS = 256
#: Statuses a client may report, and whether each needs a reason.
REPORTABLE = {
    TrialStatus.COMPLETED: False,
    TrialStatus.INFEASIBLE: True,
    TrialStatus.FAILED: True,
    TrialStatus.TIMED_OUT: True,
    TrialStatus.ABANDONED: True,
    TrialStatus.EARLY_STOPPED: True,
}


def request_record(request_id: object, method: str, *asked: object) -> Request | None:
    """The record of a request with an id (None without one): its method and a digest of
    what it asked, so that a retry can be told from a reuse of the id."""
    request_id = checked_text(request_id, "request_id", MAX_REQUEST_ID)
    if not request_id:
        return None
    text = json.dumps([method, *asked], separators=(",", ":"), default=str)
    return Request(request_id, method, hashlib.sha256(text.encode()).hexdigest())


def trial_key(spec: StudySpec, config: Config) -> str:
    """The identity storage keeps with a trial of ``config`` (``tuner.config_key``)."""
    return key_text(config_key(spec.space, config))


def holder_of(client_id: str | None, override: bool) -> str | None:
    """Whom storage lets finish or renew a trial (``check_holder``): a trial handed to a
    client is that client's (an empty ``client_id`` is nobody's), unless ``override`` (an
    operator's explicit choice, logged). None: anyone (``override``, or an in-process
    caller, which is trusted)."""
    if client_id is None or override:
        return None
    return checked_text(client_id, "client_id", MAX_CLIENT_ID)


def study_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValidationError("study", "a study name is required", "the name of an existing study")
    return storable(name, "study")


def checked_text(value: object, field_: str, limit: int) -> str:
    """``value`` if it is text of at most ``limit`` characters that storage can hold
    (``storable``: no NUL, no unpaired surrogate, the same verdict on every backend)."""
    if not isinstance(value, str):
        raise ValidationError(field_, f"must be text, got {type(value).__name__}")
    if len(value) > limit:
        raise ValidationError(field_, f"is {len(value)} characters long", f"at most {limit}")
    return storable(value, field_)


def reportable(status: object, field_: str = "status") -> TrialStatus:
    parsed = next((s for s in REPORTABLE if s == status), None)
    if parsed is None:
        raise ValidationError(field_, f"cannot report {status!r}", [s.value for s in REPORTABLE])
    return parsed


def check_reported_metrics(
    spec: StudySpec | None,
    metrics: Mapping[str, float],
    status: TrialStatus,
    where: str = "metrics",
) -> None:
    """At most ``MAX_METRICS`` metrics, each with a valid name and a finite number; a
    COMPLETED trial has every metric of ``spec``. Metrics the study does not declare are
    stored too (a target's extra readings), within the same bounds."""
    if not isinstance(metrics, Mapping):
        raise ValidationError(where, f"must map names to numbers, got {type(metrics).__name__}")
    if len(metrics) > MAX_METRICS:
        raise ValidationError(where, f"has {len(metrics)} metrics", f"at most {MAX_METRICS}")
    for name, value in metrics.items():
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
            shown = repr(name) if len(str(name)) <= 64 else f"{str(name)[:64]!r}..."
            raise ValidationError(
                f"{where}[{shown}]",
                f"invalid metric name ({len(str(name))} characters)",
                f"a name matching {METRIC_NAME.pattern}",
            )
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValidationError(f"{where}.{name}", f"got {value!r}", "a finite number")
    if spec is not None and status is TrialStatus.COMPLETED:
        missing = [m for m in spec.metric_names if m not in metrics]
        if missing:
            raise ValidationError(
                f"{where}.{missing[0]}",
                "is missing; a COMPLETED trial reports the objective and every constrained metric",
                spec.metric_names,
            )


def repeats_of(
    measurements: Sequence[Measurement], metrics: Mapping[str, float], status: TrialStatus
) -> list[Measurement]:
    """The checked repeats of a trial being completed (``complete_trial``)."""
    items = list(measurements)
    if not items:
        return []
    if metrics:
        raise ValidationError(
            "metrics", "give a trial's metrics or its measurements, not both",
            "empty metrics when measurements are given (the metrics are their means)",
        )  # fmt: skip
    if not status.measured:
        raise ValidationError("measurements", f"a {status.value} trial has no measurements", "none")
    if len(items) > MAX_MEASUREMENTS:
        raise ValidationError(
            "measurements", f"got {len(items)}", f"1 to {MAX_MEASUREMENTS} measurements"
        )
    for i, item in enumerate(items):
        if not isinstance(item, Measurement):
            raise ValidationError(f"measurements[{i}]", f"got {type(item).__name__}")
        if item.kind != MeasurementKind.REPEAT:
            raise ValidationError(
                f"measurements[{i}].kind",
                f"got {getattr(item.kind, 'value', item.kind)!r} "
                "(controls and confirmations go to AddMeasurements)",
                [MeasurementKind.REPEAT.value],
            )
    names = set(items[0].metrics)
    for i, item in enumerate(items[1:], start=1):
        if set(item.metrics) != names:
            raise ValidationError(
                f"measurements[{i}].metrics",
                f"names {sorted(item.metrics)} differ from the first repeat's",
                sorted(names),
            )
    return items


def differences(a: StudySpec, b: StudySpec) -> list[str]:
    """The top-level settings in which two specs differ as stored (``["spec"]`` if none)."""
    left, right = a.to_dict(), b.to_dict()
    keys = [*left, *(k for k in right if k not in left)]  # a setting only one of them stores
    return [k for k in keys if left.get(k) != right.get(k)] or ["spec"]
