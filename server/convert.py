"""Conversions between the wire messages (``tuner.v1``) and the domain types.

This is the only module that knows both sides: the servicer and the client call it and
never touch a message field themselves. Everything that comes off the wire is checked here
for what only the wire can get wrong (an unset oneof, an unset or unknown enum, a NaN bound,
a repeated knob in a configuration) and raises ``ValidationError`` naming the field path of
the message (``spec.knobs[2].float_range.low``); the domain constructors check the rest.

Value types survive the trip: a knob value travels in the ``Value`` field of its Python type
(``bool`` -> ``flag``, ``int`` -> ``integer``, ``float`` -> ``number``, ``str`` -> ``text``),
so an integer knob's 8 never comes back as 8.0. Timestamps (``float`` seconds in the domain)
travel as ``google.protobuf.Timestamp`` to the nanosecond; 0.0 means "unset".
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from google.protobuf import timestamp_pb2

from server.api.v1 import tuner_pb2 as pb
from server.records import ImportedTrial, StudyInfo
from tuner.errors import ValidationError
from tuner.space import (
    BoolKnob,
    CategoricalKnob,
    Config,
    FloatKnob,
    IntKnob,
    Knob,
    OrdinalKnob,
    Scalar,
    knob_from_dict,
)
from tuner.stopping import Decision
from tuner.study import EmbeddingSettings, Goal, StoppingSettings, StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, Trial, TrialStatus

KNOB_KINDS = ("float_range", "int_range", "categorical", "ordinal", "bool_knob")
VALUE_KINDS = ("number", "integer", "text", "flag")

_GOALS = {Goal.MINIMIZE: pb.GOAL_MINIMIZE, Goal.MAXIMIZE: pb.GOAL_MAXIMIZE}
_STATUSES = {s: pb.TrialStatus.Value(f"TRIAL_STATUS_{s.name}") for s in TrialStatus}
_STEPS = {k: pb.StepKind.Value(f"STEP_KIND_{k.name}") for k in StepKind}
_STEPS_BACK = {v: k for k, v in _STEPS.items()}
_KINDS = {k: pb.MeasurementKind.Value(f"MEASUREMENT_KIND_{k.name}") for k in MeasurementKind}
_KINDS_BACK = {v: k for k, v in _KINDS.items()}
#: Which request takes each kind of measurement, for the error when one arrives elsewhere.
_KIND_HOMES = {
    MeasurementKind.REPEAT: "a trial's repeats come with CompleteTrial",
    MeasurementKind.CONTROL: "controls go to AddMeasurements",
    MeasurementKind.CONFIRM: "confirmation rounds go to AddMeasurements",
    MeasurementKind.PROGRESS: "windows of a measurement in progress go to ReportProgress",
}
_OUTCOMES = {
    TrialStatus.COMPLETED: pb.TRIAL_OUTCOME_COMPLETED,
    TrialStatus.INFEASIBLE: pb.TRIAL_OUTCOME_INFEASIBLE,
    TrialStatus.FAILED: pb.TRIAL_OUTCOME_FAILED,
    TrialStatus.TIMED_OUT: pb.TRIAL_OUTCOME_TIMED_OUT,
    TrialStatus.ABANDONED: pb.TRIAL_OUTCOME_ABANDONED,
    TrialStatus.EARLY_STOPPED: pb.TRIAL_OUTCOME_EARLY_STOPPED,
}


# -- studies -----------------------------------------------------------------------------


def spec_to_proto(spec: StudySpec) -> pb.StudySpec:
    """The wire form of a study spec."""
    designer = spec.designer
    return pb.StudySpec(
        name=spec.name,
        knobs=[knob_to_proto(k) for k in spec.space.knobs],
        objectives=[
            pb.Objective(name=o.name, goal=_GOALS[o.goal], reference=o.reference)
            for o in spec.objectives
        ],
        outcome_constraints=[
            str(c) if c.relative else f"{c.metric} {c.op} {_exact_number(c.bound)}"
            for c in spec.outcome_constraints
        ],
        parameter_constraints=[str(c) for c in spec.parameter_constraints],
        designer=pb.DesignerSettings(
            algorithm=designer.algorithm,
            initial_trials=designer.initial_trials,
            seed=designer.seed,
            start_with_default=designer.start_with_default,
            random_fraction=designer.random_fraction,
            expert_priors=designer.expert_priors,
            retry_failed=designer.retry_failed,
            portfolio=designer.portfolio,
        ),
        allow_unsafe=spec.allow_unsafe,
        embedding=_embedding_to_proto(spec.embedding),
        stopping=_stopping_to_proto(spec.stopping),
        transfer_from=[
            pb.TransferSource(study=t.study, knobs=dict(t.knobs)) for t in spec.transfer_from
        ],
        candidates=[
            pb.Candidate(
                config=config_to_proto(c),
                features=spec.candidate_features[i] if spec.candidate_features else {},
            )
            for i, c in enumerate(spec.candidates)
        ],
    )


def _embedding_to_proto(embedding: EmbeddingSettings | None) -> pb.Embedding | None:
    if embedding is None:
        return None
    return pb.Embedding(
        kind=embedding.kind,
        dims=embedding.dims,
        special_bias=embedding.special_bias,
        buckets=embedding.buckets,
        seed=embedding.seed,
        grow_after=embedding.grow_after,
    )


def _embedding_from_proto(message: pb.Embedding) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if message.kind:
        data["kind"] = message.kind
    for key in ("dims", "special_bias", "buckets", "seed", "grow_after"):
        if message.HasField(key):
            data[key] = getattr(message, key)
    return data


def _stopping_to_proto(stopping: StoppingSettings) -> pb.StoppingSettings | None:
    if stopping.default:
        return None
    return pb.StoppingSettings(
        early_stop=stopping.early_stop,
        confidence=stopping.confidence,
        min_windows=stopping.min_windows,
        screen_windows=stopping.screen_windows,
        screen_keep=stopping.screen_keep,
        confirm="" if stopping.confirm == "fixed" else stopping.confirm,
    )


def _stopping_from_proto(message: pb.StoppingSettings) -> dict[str, Any]:
    data: dict[str, Any] = {
        "early_stop": message.early_stop,
        "screen_windows": message.screen_windows,
    }
    if message.confirm:
        data["confirm"] = message.confirm
    for key in ("confidence", "min_windows", "screen_keep"):
        if message.HasField(key):
            data[key] = getattr(message, key)
    return data


def decision_to_proto(decision: Decision) -> pb.StoppingDecision:
    return pb.StoppingDecision(stop=decision.stop, reason=decision.reason, windows=decision.windows)


def decision_from_proto(message: pb.StoppingDecision) -> Decision:
    return Decision(message.stop, message.reason, message.windows)


def spec_from_proto(message: pb.StudySpec, path: str = "spec") -> StudySpec:
    """Build and validate a study spec from its wire form.

    Args:
        message: The wire form.
        path: Field path of ``message`` in its request, prefixed to every error's field.

    Raises:
        ValidationError: naming the field at fault, e.g. ``spec.knobs[0].kind``.
    """
    try:
        knobs = tuple(_knob_from_proto(k, f"knobs[{i}]") for i, k in enumerate(message.knobs))
        data: dict[str, Any] = {
            "name": message.name,
            "objectives": [_objective_from_proto(o, i) for i, o in enumerate(message.objectives)],
            "outcome_constraints": list(message.outcome_constraints),
            "parameter_constraints": list(message.parameter_constraints),
            "allow_unsafe": message.allow_unsafe,
        }
        if message.HasField("designer"):
            data["designer"] = _designer_from_proto(message.designer)
        if message.HasField("embedding"):
            data["embedding"] = _embedding_from_proto(message.embedding)
        if message.HasField("stopping"):
            data["stopping"] = _stopping_from_proto(message.stopping)
        if message.transfer_from:
            data["transfer_from"] = [
                {"study": t.study, **({"knobs": dict(t.knobs)} if t.knobs else {})}
                for t in message.transfer_from
            ]
        if message.candidates:
            data["candidates"] = [
                config_from_proto(c.config, f"candidates[{i}].config")
                for i, c in enumerate(message.candidates)
            ]
            if any(c.features for c in message.candidates):
                data["candidate_features"] = [dict(c.features) for c in message.candidates]
        return StudySpec.from_dict(data, knobs=knobs)
    except ValidationError as error:
        raise _under(path, error) from None


def spec_from_request(request: pb.CreateStudyRequest) -> StudySpec:
    """The spec of a ``CreateStudyRequest``, which must be set."""
    if not request.HasField("spec"):
        raise ValidationError("spec", "is required")
    return spec_from_proto(request.spec, "spec")


def study_to_proto(info: StudyInfo) -> pb.Study:
    """The wire form of a stored study."""
    counts = sorted(
        ((TrialStatus(key), count) for key, count in info.trial_counts.items()),
        key=lambda item: list(TrialStatus).index(item[0]),
    )
    return pb.Study(
        spec=spec_to_proto(info.spec),
        created_at=_timestamp_to_proto(info.created_at),
        trial_counts=[pb.TrialCount(status=_STATUSES[s], count=n) for s, n in counts],
        best_trial_id=info.best_trial_id,
    )


def study_from_proto(message: pb.Study) -> StudyInfo:
    """The domain form of a stored study (client side)."""
    return StudyInfo(
        spec=spec_from_proto(message.spec, "spec"),
        created_at=_timestamp_from_proto(message, "created_at"),
        trial_counts={
            status_from_proto(c.status, f"trial_counts[{i}].status").value: c.count
            for i, c in enumerate(message.trial_counts)
        },
        best_trial_id=message.best_trial_id if message.HasField("best_trial_id") else None,
    )


# -- knobs and values --------------------------------------------------------------------


def knob_to_proto(knob: Knob) -> pb.Knob:
    """The wire form of one knob of any kind."""
    message = pb.Knob(
        name=knob.name,
        special_values=[value_to_proto(v) for v in knob.special_values],
        unsafe_values=[value_to_proto(v) for v in knob.unsafe_values],
        unit=knob.unit,
        description=knob.description,
        restart=knob.restart,
        recommended=[value_to_proto(v) for v in knob.recommended],
        recommended_source=knob.recommended_source,
        active_when=knob.active_when,
    )
    if knob.default is not None:
        message.default_value.CopyFrom(value_to_proto(knob.default))
    if isinstance(knob, FloatKnob):
        message.float_range.CopyFrom(pb.FloatRange(low=knob.low, high=knob.high, log=knob.log))
    elif isinstance(knob, IntKnob):
        low, high = int(knob.low), int(knob.high)
        message.int_range.CopyFrom(pb.IntRange(low=low, high=high, log=knob.log))
    elif isinstance(knob, BoolKnob):
        message.bool_knob.SetInParent()
    elif isinstance(knob, CategoricalKnob):
        message.categorical.values.extend(value_to_proto(v) for v in knob.choices)
    elif isinstance(knob, OrdinalKnob):
        message.ordinal.values.extend(value_to_proto(v) for v in knob.choices)
    else:
        raise TypeError(f"no wire form for knob kind {type(knob).__name__}")
    return message


def value_to_proto(value: Scalar) -> pb.Value:
    """The wire form of one knob value, in the field of its Python type."""
    if isinstance(value, bool):
        return pb.Value(flag=value)
    if isinstance(value, int):
        return pb.Value(integer=value)
    if isinstance(value, float):
        return pb.Value(number=value)
    if isinstance(value, str):
        return pb.Value(text=value)
    raise TypeError(f"no wire form for value {value!r} of type {type(value).__name__}")


def value_from_proto(message: pb.Value, path: str) -> Scalar:
    """The Python value of a ``Value``; ``ValidationError`` at ``path`` when none is set."""
    kind = message.WhichOneof("kind")
    if kind is None:
        raise ValidationError(path, "no value set", VALUE_KINDS)
    value: Scalar = getattr(message, kind)
    return value


def config_to_proto(config: Mapping[str, Scalar]) -> list[pb.Parameter]:
    """A configuration as parameters, in the mapping's (the space's) order."""
    return [pb.Parameter(name=name, value=value_to_proto(v)) for name, v in config.items()]


def config_from_proto(parameters: Sequence[pb.Parameter], path: str = "config") -> Config:
    """A configuration from parameters; a repeated or unnamed knob is a ``ValidationError``."""
    config: Config = {}
    for i, parameter in enumerate(parameters):
        if not parameter.name:
            raise ValidationError(f"{path}[{i}].name", "is required")
        if parameter.name in config:
            raise ValidationError(f"{path}[{i}].name", f"knob {parameter.name!r} appears twice")
        if not parameter.HasField("value"):
            raise ValidationError(f"{path}[{i}].value", "is required")
        config[parameter.name] = value_from_proto(parameter.value, f"{path}[{i}].value")
    return config


# -- trials ------------------------------------------------------------------------------


def trial_to_proto(trial: Trial, study: str) -> pb.Trial:
    """The wire form of a trial of the study named ``study``."""
    return pb.Trial(
        id=trial.id,
        study=study,
        config=config_to_proto(trial.config),
        status=_STATUSES[trial.status],
        metrics=dict(trial.metrics),
        reason=trial.reason,
        client_id=trial.client_id,
        source=trial.source,
        warning=trial.warning,
        embedded_point=list(trial.embedded),
        created_at=_timestamp_to_proto(trial.created_at),
        updated_at=_timestamp_to_proto(trial.updated_at),
        lease_expires_at=_timestamp_to_proto(trial.lease_expires_at or 0.0),
        expired_at=_timestamp_to_proto(trial.expired_at or 0.0),
        reported_late=trial.reported_late,
        reoffered_as=trial.reoffered_as or 0,
        step=_STEPS[trial.step],
        repeats=trial.repeats,
        windows=trial.windows,
        spread=dict(trial.spread),
        transfer=dict(trial.transfer),
    )


def trial_from_proto(message: pb.Trial) -> Trial:
    """The domain form of a trial (client side); the study name is dropped."""
    return Trial(
        id=message.id,
        config=config_from_proto(message.config),
        status=status_from_proto(message.status, "status"),
        metrics=dict(message.metrics),
        reason=message.reason,
        client_id=message.client_id,
        source=message.source,
        warning=message.warning,
        embedded=tuple(message.embedded_point),
        created_at=_timestamp_from_proto(message, "created_at"),
        updated_at=_timestamp_from_proto(message, "updated_at"),
        lease_expires_at=_timestamp_from_proto(message, "lease_expires_at") or None,
        expired_at=_timestamp_from_proto(message, "expired_at") or None,
        reported_late=message.reported_late,
        reoffered_as=message.reoffered_as or None,
        step=_STEPS_BACK.get(message.step, StepKind.IMPORT),  # unset: an older server
        repeats=message.repeats or 1,  # unset: an older server, which measures once
        windows=message.windows,
        spread=dict(message.spread),
        transfer=tuple(sorted(message.transfer.items())),
    )


def imported_from_proto(message: pb.ImportedTrial, path: str) -> ImportedTrial:
    """An imported trial from its wire form (``path`` names it in errors)."""
    return ImportedTrial(
        config=config_from_proto(message.config, f"{path}.config"),
        status=outcome_from_proto(message.status, f"{path}.status"),
        metrics=metrics_from_proto(message.metrics),
        reason=message.reason,
        source=message.source,
    )


def imported_to_proto(trial: ImportedTrial) -> pb.ImportedTrial:
    return pb.ImportedTrial(
        config=config_to_proto(dict(trial.config)),
        status=outcome_to_proto(trial.status),
        metrics=dict(trial.metrics),
        reason=trial.reason,
        source=trial.source,
    )


def status_to_proto(status: TrialStatus) -> pb.TrialStatus:
    """The wire value of a trial status."""
    return _STATUSES[TrialStatus(status)]


def status_from_proto(value: int, path: str) -> TrialStatus:
    """A trial status from its wire value; unset or unknown is a ``ValidationError``."""
    return _enum_from_proto(value, path, {v: k for k, v in _STATUSES.items()}, pb.TrialStatus)


def statuses_from_proto(values: Sequence[int], path: str) -> list[TrialStatus] | None:
    """A status filter: ``None`` (no filter) when empty."""
    if not values:
        return None
    return [status_from_proto(v, f"{path}[{i}]") for i, v in enumerate(values)]


def outcome_to_proto(status: TrialStatus, path: str = "status") -> pb.TrialOutcome:
    """The wire value of a final status a client reports (not PENDING or ACTIVE)."""
    outcome = _OUTCOMES.get(TrialStatus(status))
    if outcome is None:
        raise ValidationError(
            path, f"a trial cannot be completed as {status}", [s.value for s in _OUTCOMES]
        )
    return outcome


def outcome_from_proto(value: int, path: str = "status") -> TrialStatus:
    """The final status a ``CompleteTrialRequest`` asks for; unset or unknown is an error."""
    return _enum_from_proto(value, path, {v: k for k, v in _OUTCOMES.items()}, pb.TrialOutcome)


def metrics_from_proto(metrics: Mapping[str, float]) -> dict[str, float]:
    """Reported metrics as a plain dict (values are checked by the service)."""
    return {name: float(value) for name, value in metrics.items()}


# -- measurements ------------------------------------------------------------------------


def measurement_to_proto(measurement: Measurement, path: str = "measurement") -> pb.Measurement:
    """The wire form of a measurement; a kind that is not a ``MeasurementKind`` is a
    ``ValidationError`` at ``path.kind``."""
    return pb.Measurement(
        trial_id=measurement.trial_id,
        kind=measurement_kind_to_proto(measurement.kind, f"{path}.kind"),
        metrics=dict(measurement.metrics),
        at=_timestamp_to_proto(measurement.at),
        round=measurement.round,
    )


def measurement_from_proto(
    message: pb.Measurement,
    path: str,
    unspecified: MeasurementKind | None = None,
    accepted: Collection[MeasurementKind] | None = None,
) -> Measurement:
    """A measurement from its wire form (``path`` names it in errors: ``measurements[2]``).

    Args:
        message: The wire form.
        path: Field path of ``message`` in its request or reply.
        unspecified: The kind an unset ``kind`` stands for (REPEAT in a
            ``CompleteTrialRequest``); None: an unset kind is a ``ValidationError``.
        accepted: The kinds the request takes (None: every kind). Another kind is a
            ``ValidationError`` saying which request takes it; every error about the kind
            lists the accepted ones as the allowed values.

    Raises:
        ValidationError: An unset, unknown or unaccepted kind, a time before 1970, or a
            negative round. Metric values are checked by the service.
    """
    table = {v: k for k, v in _KINDS.items() if accepted is None or k in accepted}
    if message.kind == pb.MEASUREMENT_KIND_UNSPECIFIED and unspecified is not None:
        kind = unspecified
    elif message.kind in _KINDS_BACK and message.kind not in table:
        raise ValidationError(
            f"{path}.kind",
            f"{pb.MeasurementKind.Name(message.kind)} is not taken here: "
            f"{_KIND_HOMES[_KINDS_BACK[message.kind]]}",
            [pb.MeasurementKind.Name(v) for v in table],
        )
    else:
        kind = _enum_from_proto(message.kind, f"{path}.kind", table, pb.MeasurementKind)
    at = _timestamp_from_proto(message, "at")
    if at < 0:
        raise ValidationError(f"{path}.at", f"got {at!r}", "unset or a time from 1970 on")
    if message.round < 0:
        raise ValidationError(f"{path}.round", f"got {message.round}", ">= 0")
    return Measurement(
        metrics=metrics_from_proto(message.metrics),
        kind=kind,
        at=at,
        round=message.round,
        trial_id=message.trial_id,
    )


def measurements_from_request(
    request: pb.CompleteTrialRequest | pb.AddMeasurementsRequest,
) -> list[Measurement]:
    """The measurements of a request for one trial (``request.trial_id``).

    A ``CompleteTrialRequest`` takes REPEAT (a trial's repeats; an unset kind means
    REPEAT), an ``AddMeasurementsRequest`` CONTROL and CONFIRM (an unset kind is an error
    listing them). Each measurement may name its trial only as 0 or the request's
    ``trial_id``.

    Raises:
        ValidationError: naming the measurement's field, e.g. ``measurements[2].kind``.
    """
    unspecified: MeasurementKind | None = None
    accepted: tuple[MeasurementKind, ...] = (MeasurementKind.CONTROL, MeasurementKind.CONFIRM)
    if isinstance(request, pb.CompleteTrialRequest):
        unspecified, accepted = MeasurementKind.REPEAT, (MeasurementKind.REPEAT,)
    measurements = []
    for i, message in enumerate(request.measurements):
        path = f"measurements[{i}]"
        if message.trial_id not in (0, request.trial_id):
            raise ValidationError(
                f"{path}.trial_id",
                f"got {message.trial_id} in a request for trial {request.trial_id}",
                f"0 or {request.trial_id}",
            )
        measurement = measurement_from_proto(message, path, unspecified, accepted)
        measurements.append(replace(measurement, trial_id=request.trial_id))
    return measurements


def measurement_kind_to_proto(kind: MeasurementKind, path: str = "kind") -> pb.MeasurementKind:
    """The wire value of a measurement kind (``MeasurementKind`` or its value)."""
    try:
        return _KINDS[MeasurementKind(kind)]
    except ValueError:
        raise ValidationError(path, f"got {kind!r}", [k.value for k in MeasurementKind]) from None


def measurement_kind_from_proto(value: int, path: str) -> MeasurementKind:
    """A measurement kind from its wire value; unset or unknown is a ``ValidationError``."""
    return _enum_from_proto(value, path, _KINDS_BACK, pb.MeasurementKind)


def measurement_kinds_from_proto(values: Sequence[int], path: str) -> list[MeasurementKind] | None:
    """A kind filter: ``None`` (no filter) when empty."""
    if not values:
        return None
    return [measurement_kind_from_proto(v, f"{path}[{i}]") for i, v in enumerate(values)]


# -- private helpers ---------------------------------------------------------------------


def _knob_from_proto(message: pb.Knob, path: str) -> Knob:
    kind = message.WhichOneof("kind")
    if kind is None:
        raise ValidationError(f"{path}.kind", "no knob kind set", KNOB_KINDS)
    data: dict[str, Any] = {"name": message.name, "restart": message.restart}
    if kind in ("float_range", "int_range"):
        bounds = getattr(message, kind)
        for key in ("low", "high"):
            value = getattr(bounds, key)
            if not math.isfinite(value):
                raise ValidationError(f"{path}.{kind}.{key}", f"must be finite, got {value}")
            data[key] = value
        data.update(kind="float" if kind == "float_range" else "int", log=bounds.log)
    elif kind in ("categorical", "ordinal"):
        choices = getattr(message, kind).values
        data.update(
            kind=kind,
            choices=[
                value_from_proto(v, f"{path}.{kind}.values[{i}]") for i, v in enumerate(choices)
            ],
        )
    else:
        data["kind"] = "bool"
    if message.HasField("default_value"):
        data["default"] = value_from_proto(message.default_value, f"{path}.default_value")
    for key in ("special_values", "unsafe_values", "recommended"):
        values = getattr(message, key)
        data[key] = [value_from_proto(v, f"{path}.{key}[{i}]") for i, v in enumerate(values)]
    for key in ("unit", "description", "recommended_source", "active_when"):
        if getattr(message, key):
            data[key] = getattr(message, key)
    return knob_from_dict(data, path)


def _designer_from_proto(message: pb.DesignerSettings) -> dict[str, Any]:
    data: dict[str, Any] = {
        "seed": message.seed,
        "random_fraction": message.random_fraction,
        "expert_priors": message.expert_priors,
        "retry_failed": message.retry_failed,
        "portfolio": message.portfolio,
    }
    if message.algorithm:
        data["algorithm"] = message.algorithm
    if message.HasField("initial_trials"):
        data["initial_trials"] = message.initial_trials
    if message.HasField("start_with_default"):
        data["start_with_default"] = message.start_with_default
    return data


def _objective_from_proto(message: pb.Objective, i: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": message.name,
        "goal": _goal_from_proto(message.goal, f"objectives[{i}].goal"),
    }
    if message.HasField("reference"):
        out["reference"] = message.reference
    return out


def _goal_from_proto(value: int, path: str) -> str:
    goals = {v: k.value for k, v in _GOALS.items()}
    return _enum_from_proto(value, path, goals, pb.Goal)


def _enum_from_proto(value: int, path: str, table: Mapping[Any, Any], enum: Any) -> Any:
    if value in table:
        return table[value]
    allowed = [enum.Name(v) for v in table]
    if value == 0:
        raise ValidationError(path, f"is required; {enum.Name(0)} is not a value", allowed)
    raise ValidationError(path, f"unknown value {value}", allowed)


def _exact_number(value: float) -> str:
    """``value`` written as briefly as ``%g`` when that is exact, else in full precision."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def _timestamp_to_proto(seconds: float) -> timestamp_pb2.Timestamp | None:
    if not seconds:
        return None
    whole = math.floor(seconds)
    nanos = round((seconds - whole) * 1e9)
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    return timestamp_pb2.Timestamp(seconds=whole, nanos=nanos)


def _timestamp_from_proto(message: Any, key: str) -> float:
    if not message.HasField(key):
        return 0.0
    stamp = getattr(message, key)
    return float(stamp.seconds + stamp.nanos / 1e9)


def _under(prefix: str, error: ValidationError) -> ValidationError:
    """``error`` with its field moved under ``prefix`` (``knobs[0]`` -> ``spec.knobs[0]``).

    The spec's ``candidate_features[3]`` is the wire's ``candidates[3].features``.

    The search space's own paths (``space.knobs[1]``) become the message's (``knobs[1]``).
    """
    own = f"{error.field}: "
    text = str(error)
    message = text[len(own) :] if text.startswith(own) else text
    field = error.field.removeprefix("space.")
    # the spec's parallel list is the wire's per-candidate map
    field = re.sub(r"^candidate_features\[(\d+)\]", r"candidates[\1].features", field)
    field = "candidates" if field == "candidate_features" else field
    moved = ValidationError(f"{prefix}.{field}" if prefix else field, message)
    moved.allowed = error.allowed
    return moved
