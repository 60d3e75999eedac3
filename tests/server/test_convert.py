"""Wire <-> domain conversions: round trips keep every field and every value's type."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest

from server import convert
from server.api.v1 import tuner_pb2 as pb
from server.service import StudyInfo
from tuner.constraints import LinearConstraint, OutcomeConstraint
from tuner.errors import ValidationError
from tuner.space import (
    BoolKnob,
    CategoricalKnob,
    Config,
    FloatKnob,
    IntKnob,
    Knob,
    OrdinalKnob,
    SearchSpace,
)
from tuner.study import DesignerSettings, Goal, Objective, StoppingSettings, StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, Trial, TrialStatus

KNOBS: tuple[Knob, ...] = (
    FloatKnob(
        "shared_buffers_frac",
        low=0.05,
        high=0.8,
        default=0.25,
        special_values=(0.05,),
        unit="fraction",
        description="share of RAM",
        restart=True,
    ),
    FloatKnob("lr", low=1e-5, high=1.0, log=True),
    IntKnob("cache_kib", low=-1, high=1 << 40, default=-1, special_values=(-1, 0)),
    IntKnob("threads", low=1, high=256, log=True, default=8),
    CategoricalKnob("journal_mode", choices=("wal", "delete", "off"), unsafe_values=("off",)),
    CategoricalKnob("mixed", choices=("auto", 3, 2.5, True), default=3),
    OrdinalKnob("page_size", choices=(512, 1024, 4096, 65536), default=4096),
    OrdinalKnob("level", choices=(0.5, 1.0, 2.0), special_values=(1.0,)),
    BoolKnob("fsync", default=True, unsafe_values=(False,)),
)


def make_spec(**changes: object) -> StudySpec:
    space = SearchSpace(KNOBS)
    fields: dict[str, object] = {
        "name": "sqlite-tps",
        "space": space,
        "objectives": (Objective("tps", Goal.MAXIMIZE),),
        "outcome_constraints": (
            OutcomeConstraint.parse("p95_ms <= 20"),
            OutcomeConstraint("rss_mib", "<=", 1234.56789012),
            OutcomeConstraint("err_rate", ">=", -0.25),
        ),
        "parameter_constraints": (
            LinearConstraint.parse("shared_buffers_frac + 0.001*cache_kib <= 100", space),
        ),
        "designer": DesignerSettings(
            algorithm="sobol",
            initial_trials=7,
            seed=42,
            start_with_default=False,
            random_fraction=0.125,
            portfolio=True,
        ),
        "allow_unsafe": True,
    }
    fields.update(changes)
    return StudySpec(**fields)  # type: ignore[arg-type]


def round_trip(spec: StudySpec) -> StudySpec:
    wire = pb.StudySpec.FromString(convert.spec_to_proto(spec).SerializeToString())
    return convert.spec_from_proto(wire)


# -- study specs -------------------------------------------------------------------------


def test_spec_round_trip_keeps_every_knob_kind_and_field() -> None:
    spec = make_spec()
    back = round_trip(spec)
    assert back == spec
    assert back.to_dict() == spec.to_dict()
    kinds = [convert.knob_to_proto(k).WhichOneof("kind") for k in spec.space.knobs]
    assert set(kinds) == set(convert.KNOB_KINDS)


def test_a_knobs_condition_travels_over_the_wire() -> None:
    conditional = OrdinalKnob("level_2", choices=(1, 2), active_when="shared_buffers_frac >= 0.5")
    spec = make_spec(space=SearchSpace((*KNOBS, conditional)))
    back = round_trip(spec)
    assert back == spec and back.space["level_2"].active_when == "shared_buffers_frac >= 0.5"
    assert back.space.inactive({"shared_buffers_frac": 0.25}) == {"level_2"}


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_knob_round_trip_keeps_value_types(knob: Knob) -> None:
    spec = make_spec(space=SearchSpace((knob,)), parameter_constraints=())
    (back,) = round_trip(spec).space.knobs
    assert back == knob
    assert type(back) is type(knob)
    for key in ("default", "special_values", "unsafe_values", "choices", "low", "high"):
        if hasattr(knob, key):
            assert repr(getattr(back, key)) == repr(getattr(knob, key)), key


def test_spec_round_trip_with_default_designer_and_safe_space() -> None:
    # a bool knob with an unsafe value cannot be tuned safely (one value left): left out here
    safe_space = SearchSpace(tuple(k for k in KNOBS if k.name != "fsync"))
    spec = make_spec(
        space=safe_space, designer=DesignerSettings(), allow_unsafe=False, parameter_constraints=()
    )
    back = round_trip(spec)
    assert back == spec
    assert back.designer.initial_trials is None
    assert back.designer.start_with_default is True
    assert "off" not in back.space["journal_mode"].choices  # type: ignore[attr-defined]


def test_outcome_constraint_bounds_keep_full_precision() -> None:
    wire = convert.spec_to_proto(make_spec())
    assert list(wire.outcome_constraints) == [
        "p95_ms <= 20",
        "rss_mib <= 1234.56789012",
        "err_rate >= -0.25",
    ]


def test_unset_designer_means_defaults() -> None:
    wire = convert.spec_to_proto(make_spec(parameter_constraints=()))
    wire.ClearField("designer")
    assert convert.spec_from_proto(wire).designer == DesignerSettings()


def _no_kind(wire: pb.StudySpec) -> None:
    wire.knobs[0].ClearField("kind")


def _nan_low(wire: pb.StudySpec) -> None:
    wire.knobs[0].float_range.low = math.nan


def _reversed(wire: pb.StudySpec) -> None:
    wire.knobs[0].float_range.low, wire.knobs[0].float_range.high = 0.9, 0.1


def _duplicate(wire: pb.StudySpec) -> None:
    wire.knobs[1].name = wire.knobs[0].name


def _empty_value(wire: pb.StudySpec) -> None:
    wire.knobs[4].categorical.values[1].Clear()


def _unset_goal(wire: pb.StudySpec) -> None:
    wire.objectives[0].goal = pb.GOAL_UNSPECIFIED


def _unknown_goal(wire: pb.StudySpec) -> None:
    wire.objectives[0].goal = 9  # type: ignore[assignment]


def _bad_algorithm(wire: pb.StudySpec) -> None:
    wire.designer.algorithm = "cma"


@pytest.mark.parametrize(
    ("mutate", "field", "fragment"),
    [
        (_no_kind, "spec.knobs[0].kind", "no knob kind set"),
        (_nan_low, "spec.knobs[0].float_range.low", "must be finite"),
        (_reversed, "spec.knobs[0].high", "must be greater than low"),
        (_duplicate, "spec.knobs[1].name", "duplicate knob name"),
        (_empty_value, "spec.knobs[4].categorical.values[1]", "no value set"),
        (_unset_goal, "spec.objectives[0].goal", "GOAL_UNSPECIFIED is not a value"),
        (_unknown_goal, "spec.objectives[0].goal", "unknown value 9"),
        (_bad_algorithm, "spec.designer.algorithm", "unknown algorithm 'cma'"),
    ],
)
def test_malformed_spec_names_the_field(
    mutate: Callable[[pb.StudySpec], None], field: str, fragment: str
) -> None:
    wire = convert.spec_to_proto(make_spec(parameter_constraints=()))
    mutate(wire)
    with pytest.raises(ValidationError, match=fragment) as info:
        convert.spec_from_proto(wire)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_create_request_without_spec_is_rejected() -> None:
    with pytest.raises(ValidationError, match="spec: is required"):
        convert.spec_from_request(pb.CreateStudyRequest())


# -- trials, statuses, studies -----------------------------------------------------------


def test_trial_round_trip_keeps_exact_value_types_and_order() -> None:
    config: Config = {"z_float": 8.0, "a_int": 8, "m_text": "wal", "b_flag": True, "c_zero": 0.0}
    trial = Trial(
        id=3,
        config=config,
        status=TrialStatus.INFEASIBLE,
        metrics={"tps": 1234.5, "p95_ms": 21.0},
        reason="p95 above the SLO",
        client_id="worker-1",
        source="sobol",
        warning="fell back to Sobol",
        step=StepKind.SOBOL,
        created_at=1_700_000_000.123456,
        updated_at=1_700_000_042.987654,
    )
    wire = pb.Trial.FromString(convert.trial_to_proto(trial, "s").SerializeToString())
    assert wire.study == "s"
    assert [p.value.WhichOneof("kind") for p in wire.config] == [
        "number",
        "integer",
        "text",
        "flag",
        "number",
    ]
    assert wire.step == pb.STEP_KIND_SOBOL
    back = convert.trial_from_proto(wire)
    assert back == trial
    assert all(  # every step kind has its wire value and back
        convert.trial_from_proto(convert.trial_to_proto(replace(trial, step=k), "s")).step is k
        for k in StepKind
    )
    assert list(back.config) == list(config)
    assert [type(v) for v in back.config.values()] == [float, int, str, bool, float]


def test_unset_timestamps_stay_zero() -> None:
    wire = convert.trial_to_proto(Trial(id=1, config={"x": 1}), "s")
    assert not wire.HasField("created_at")
    assert convert.trial_from_proto(wire).created_at == 0.0


@pytest.mark.parametrize("status", list(TrialStatus))
def test_every_status_round_trips(status: TrialStatus) -> None:
    wire = convert.status_to_proto(status)
    assert pb.TrialStatus.Name(wire) == f"TRIAL_STATUS_{status.value}"
    assert convert.status_from_proto(wire, "status") is status


def test_unknown_or_unset_status_is_rejected() -> None:
    with pytest.raises(ValidationError, match=r"statuses\[1\]: unknown value 42"):
        convert.statuses_from_proto([pb.TRIAL_STATUS_ACTIVE, 42], "statuses")
    with pytest.raises(ValidationError, match="TRIAL_STATUS_UNSPECIFIED is not a value"):
        convert.status_from_proto(0, "status")
    assert convert.statuses_from_proto([], "statuses") is None


def test_outcomes_are_the_final_statuses() -> None:
    final = [s for s in TrialStatus if s.is_final]
    for status in final:
        assert convert.outcome_from_proto(convert.outcome_to_proto(status)) is status
    assert {pb.TrialOutcome.Name(convert.outcome_to_proto(s)) for s in final} == {
        name for name, number in pb.TrialOutcome.items() if number != 0
    }
    with pytest.raises(ValidationError, match="status: a trial cannot be completed as ACTIVE"):
        convert.outcome_to_proto(TrialStatus.ACTIVE)
    with pytest.raises(ValidationError, match="status: is required"):
        convert.outcome_from_proto(pb.TRIAL_OUTCOME_UNSPECIFIED)


def test_config_with_a_repeated_knob_is_rejected() -> None:
    params = [pb.Parameter(name="x", value=pb.Value(integer=1))] * 2
    with pytest.raises(ValidationError, match=r"config\[1\]\.name: knob 'x' appears twice"):
        convert.config_from_proto(params)


def test_study_info_round_trip() -> None:
    info = StudyInfo(
        spec=make_spec(),
        created_at=1_700_000_000.5,
        trial_counts={"COMPLETED": 4, "ACTIVE": 2},
        best_trial_id=3,
    )
    wire = pb.Study.FromString(convert.study_to_proto(info).SerializeToString())
    assert [pb.TrialStatus.Name(c.status) for c in wire.trial_counts] == [
        "TRIAL_STATUS_ACTIVE",
        "TRIAL_STATUS_COMPLETED",
    ]
    assert convert.study_from_proto(wire) == info
    empty = StudyInfo(spec=make_spec(), created_at=1.0, trial_counts={}, best_trial_id=None)
    assert convert.study_from_proto(convert.study_to_proto(empty)) == empty


# -- measurements ------------------------------------------------------------------------


def test_trial_round_trip_keeps_repeats_and_spread() -> None:
    trial = Trial(
        id=2,
        config={"x": 1},
        status=TrialStatus.COMPLETED,
        metrics={"tps": 102.0, "p95_ms": 9.5},
        repeats=3,
        spread={"tps": 7.2111, "p95_ms": 0.5},
    )
    wire = pb.Trial.FromString(convert.trial_to_proto(trial, "s").SerializeToString())
    assert (wire.repeats, dict(wire.spread)) == (3, {"tps": 7.2111, "p95_ms": 0.5})
    assert convert.trial_from_proto(wire) == trial


def test_a_trial_from_an_older_server_was_measured_once() -> None:
    wire = pb.Trial(id=1, status=pb.TRIAL_STATUS_COMPLETED, metrics={"tps": 1.0})
    assert wire.repeats == 0
    back = convert.trial_from_proto(wire)
    assert (back.repeats, back.spread) == (1, {})


@pytest.mark.parametrize("kind", list(MeasurementKind))
def test_measurement_round_trip_keeps_every_field(kind: MeasurementKind) -> None:
    measurement = Measurement(
        metrics={"tps": 1234.5, "p95_ms": 0.25},
        kind=kind,
        at=1_700_000_000.123456,
        round=4,
        trial_id=7,
    )
    wire = pb.Measurement.FromString(convert.measurement_to_proto(measurement).SerializeToString())
    assert pb.MeasurementKind.Name(wire.kind) == f"MEASUREMENT_KIND_{kind.name}"
    assert convert.measurement_from_proto(wire, "measurement") == measurement
    unstamped = Measurement({"tps": 1.0}, kind)
    assert not convert.measurement_to_proto(unstamped).HasField("at")
    assert convert.measurement_from_proto(convert.measurement_to_proto(unstamped), "m") == unstamped


def test_measurement_kinds_on_the_wire() -> None:
    unset = pb.Measurement(metrics={"tps": 1.0})
    repeat = convert.measurement_from_proto(unset, "m", unspecified=MeasurementKind.REPEAT)
    assert repeat.kind is MeasurementKind.REPEAT
    with pytest.raises(ValidationError, match=r"m\.kind: is required") as info:
        convert.measurement_from_proto(unset, "m")
    assert info.value.field == "m.kind"
    with pytest.raises(ValidationError, match=r"m\.kind: unknown value 42"):
        convert.measurement_from_proto(pb.Measurement(kind=42), "m")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="kinds: got 'often'"):
        convert.measurement_kind_to_proto("often", "kinds")  # type: ignore[arg-type]
    assert convert.measurement_kind_to_proto("control") == pb.MEASUREMENT_KIND_CONTROL  # type: ignore[arg-type]
    assert convert.measurement_kinds_from_proto([], "kinds") is None
    assert convert.measurement_kinds_from_proto([pb.MEASUREMENT_KIND_CONFIRM], "kinds") == [
        MeasurementKind.CONFIRM
    ]
    with pytest.raises(ValidationError, match=r"kinds\[1\]: is required"):
        convert.measurement_kinds_from_proto([pb.MEASUREMENT_KIND_REPEAT, 0], "kinds")


def test_measurements_of_a_request_take_its_trial_and_kinds() -> None:
    complete = pb.CompleteTrialRequest(
        trial_id=3,
        measurements=[
            pb.Measurement(metrics={"tps": 1.0}),
            pb.Measurement(trial_id=3, kind=pb.MEASUREMENT_KIND_REPEAT, metrics={"tps": 2.0}),
        ],
    )
    repeats = convert.measurements_from_request(complete)
    assert [(m.kind, m.trial_id) for m in repeats] == [(MeasurementKind.REPEAT, 3)] * 2

    add = pb.AddMeasurementsRequest(
        trial_id=3,
        measurements=[pb.Measurement(kind=pb.MEASUREMENT_KIND_CONFIRM, round=1), pb.Measurement()],
    )
    with pytest.raises(ValidationError, match="MEASUREMENT_KIND_CONTROL") as info:
        convert.measurements_from_request(add)
    assert info.value.field == "measurements[1].kind"
    add.measurements[1].kind = pb.MEASUREMENT_KIND_REPEAT
    with pytest.raises(ValidationError, match="REPEAT is not taken here") as info:
        convert.measurements_from_request(add)
    assert info.value.field == "measurements[1].kind"
    complete.measurements[1].kind = pb.MEASUREMENT_KIND_CONTROL
    with pytest.raises(ValidationError, match="CONTROL is not taken here") as info:
        convert.measurements_from_request(complete)
    assert info.value.field == "measurements[1].kind"


def _other_trial(wire: pb.Measurement) -> None:
    wire.trial_id = 4


def _negative_round(wire: pb.Measurement) -> None:
    wire.round = -2


def _before_1970(wire: pb.Measurement) -> None:
    wire.at.FromSeconds(-1)


@pytest.mark.parametrize(
    ("corrupt", "field_"),
    [
        (_other_trial, "measurements[1].trial_id"),
        (_negative_round, "measurements[1].round"),
        (_before_1970, "measurements[1].at"),
    ],
    ids=["other-trial", "negative-round", "before-1970"],
)
def test_a_malformed_measurement_names_the_field(
    corrupt: Callable[[pb.Measurement], None], field_: str
) -> None:
    request = pb.AddMeasurementsRequest(
        trial_id=3,
        measurements=[pb.Measurement(kind=pb.MEASUREMENT_KIND_CONTROL)] * 2,
    )
    corrupt(request.measurements[1])
    with pytest.raises(ValidationError) as info:
        convert.measurements_from_request(request)
    assert info.value.field == field_


def test_the_confirmation_rule_travels_over_the_wire() -> None:
    """``[study.stopping] confirm = "sequential"``: stored with the study and sent with its
    spec, so ``tuner best`` over gRPC reads the verdict with the same interval."""
    sequential = make_spec(stopping=StoppingSettings(confirm="sequential"))
    assert round_trip(sequential).stopping.sequential
    wire = convert.spec_to_proto(make_spec(stopping=StoppingSettings(early_stop=True)))
    assert wire.stopping.confirm == "" and not convert.spec_from_proto(wire).stopping.sequential
