"""Tests for tuner.study: objectives, designer settings, StudySpec round trips and fingerprints."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from tuner.constraints import LinearConstraint, OutcomeConstraint
from tuner.errors import ValidationError
from tuner.space import BoolKnob, CategoricalKnob, FloatKnob, IntKnob, SearchSpace
from tuner.study import DesignerSettings, Goal, Objective, StudySpec


def _data() -> dict[str, Any]:
    return {
        "name": "sqlite-oltp",
        "knobs": [
            {"name": "cache", "kind": "int", "low": 16, "high": 4096, "log": True, "default": 64},
            {"name": "a", "kind": "float", "low": 0.0, "high": 10.0, "default": 1.0},
            {"name": "b", "kind": "int", "low": 0, "high": 10, "unit": "ms"},
            {
                "name": "journal",
                "kind": "categorical",
                "choices": ["delete", "wal", "off"],
                "default": "wal",
                "unsafe_values": ["off"],
            },
            {"name": "sync", "kind": "ordinal", "choices": ["off", "normal", "full"]},
            {"name": "mmap", "kind": "bool", "default": True, "restart": True},
        ],
        "objectives": [{"name": "tps", "goal": "maximize"}],
        "outcome_constraints": ["p95_ms <= 20", "errors <= 0.5", "tps >= 10"],
        "parameter_constraints": ["a + 2*b <= 10"],
        "designer": {"algorithm": "bo", "initial_trials": 6, "seed": 7},
        "allow_unsafe": False,
    }


def _spec(**changes: Any) -> StudySpec:
    data = _data()
    data.update(changes)
    return StudySpec.from_dict(data)


# -- round trip and fingerprint ---------------------------------------------------------


def test_from_dict_builds_the_spec() -> None:
    spec = _spec()
    assert spec.name == "sqlite-oltp"
    assert spec.space.names == ("cache", "a", "b", "journal", "sync", "mmap")
    assert spec.objective == Objective("tps", Goal.MAXIMIZE)
    assert spec.outcome_constraints[0] == OutcomeConstraint("p95_ms", "<=", 20.0)
    assert dict(spec.parameter_constraints[0].terms) == {"a": 1.0, "b": 2.0}
    assert spec.designer == DesignerSettings("bo", 6, 7)
    assert spec.allow_unsafe is False


def test_dict_round_trip_is_equal() -> None:
    spec = _spec()
    data = spec.to_dict()
    again = StudySpec.from_dict(data)
    assert again == spec
    assert again.to_dict() == data
    assert again.fingerprint() == spec.fingerprint()


def test_minimal_dict_gets_defaults_and_round_trips() -> None:
    spec = StudySpec.from_dict(
        {"name": "s", "knobs": [{"name": "x", "kind": "float"}], "objectives": [{"name": "y"}]}
    )
    assert spec.objective.goal is Goal.MAXIMIZE
    assert spec.designer == DesignerSettings()
    assert (spec.outcome_constraints, spec.parameter_constraints) == ((), ())
    assert StudySpec.from_dict(spec.to_dict()) == spec


def test_round_trip_with_unsafe_values_allowed() -> None:
    spec = _spec(allow_unsafe=True)
    assert spec.space["journal"].choices == ("delete", "wal", "off")  # type: ignore[attr-defined]
    assert StudySpec.from_dict(spec.to_dict()) == spec


def test_round_trip_of_a_directly_built_spec() -> None:
    space = SearchSpace((FloatKnob("x", low=0.0, high=2.0), IntKnob("n", low=1, high=5)))
    spec = StudySpec(
        "direct",
        space,
        (Objective("lat", Goal.MINIMIZE),),
        (OutcomeConstraint.parse("mem <= 512"),),
        (LinearConstraint.parse("x + n <= 6", space),),
        DesignerSettings("sobol", seed=3, random_fraction=0.25),
    )
    assert StudySpec.from_dict(spec.to_dict()) == spec


def test_fingerprint_is_stable() -> None:
    assert _spec().fingerprint() == _spec().fingerprint()
    fingerprint = _spec().fingerprint()
    assert len(fingerprint) == 64 and int(fingerprint, 16) >= 0


def _mutations() -> list[tuple[str, Any]]:
    def edit(path: str, value: Any) -> tuple[str, Any]:
        return (path, value)

    return [
        edit("name", "other"),
        edit("knobs.0.high", 8192),
        edit("knobs.0.default", 128),
        edit("knobs.1.low", 0.5),
        edit("knobs.2.unit", "s"),
        edit("knobs.3.choices", ["delete", "wal", "truncate", "off"]),
        edit("knobs.5.restart", False),
        edit("knobs.5.description", "memory map"),
        edit("knobs.4.special_values", ["off"]),
        edit("objectives.0.goal", "minimize"),
        edit("objectives.0.name", "qps"),
        edit("outcome_constraints", ["p95_ms <= 21", "errors <= 0.5", "tps >= 10"]),
        edit("outcome_constraints", ["p95_ms <= 20", "errors <= 0.5"]),
        edit("outcome_constraints", ["p95_ms <= 20.0000001", "errors <= 0.5", "tps >= 10"]),
        edit("parameter_constraints", ["a + 3*b <= 10"]),
        edit("parameter_constraints", []),
        edit("designer.algorithm", "sobol"),
        edit("designer.initial_trials", 7),
        edit("designer.seed", 8),
        edit("designer.start_with_default", False),
        edit("designer.random_fraction", 0.1),
        edit("allow_unsafe", True),
    ]


@pytest.mark.parametrize(("path", "value"), _mutations(), ids=lambda v: str(v)[:40])
def test_fingerprint_changes_when_any_field_changes(path: str, value: Any) -> None:
    data = _data()
    target: Any = data
    *parents, last = path.split(".")
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[int(last) if last.isdigit() else last] = copy.deepcopy(value)
    changed = StudySpec.from_dict(data)
    assert changed != _spec()
    assert changed.fingerprint() != _spec().fingerprint()


# -- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "-lead", "a b", "x" * 129, "ü", None, 3])
def test_bad_study_name(name: Any) -> None:
    with pytest.raises(ValidationError, match=r"^name: invalid study name") as info:
        _spec(name=name)
    assert info.value.field == "name"
    assert "letters, digits" in str(info.value)


@pytest.mark.parametrize("count", [0, 5])
def test_one_to_four_objectives(count: int) -> None:
    objectives = [{"name": f"m{i}"} for i in range(count)]
    with pytest.raises(ValidationError, match=rf"got {count} objectives") as info:
        _spec(objectives=objectives)
    assert info.value.field == "objectives"
    assert "allowed: 1 to 4 objectives" in str(info.value)


def test_several_objectives_round_trip_with_reference_points() -> None:
    spec = _spec(
        objectives=[
            {"name": "energy", "goal": "minimize", "reference": 12},
            {"name": "p99", "goal": "minimize"},
        ]
    )
    assert spec.multi_objective
    assert spec.objectives[0].reference == 12.0 and spec.objectives[1].reference is None
    assert StudySpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["objectives"][1] == {"name": "p99", "goal": "minimize"}


@pytest.mark.parametrize(
    ("objectives", "field", "message"),
    [
        ([{"name": "a"}, {"name": "a", "goal": "minimize"}], "objectives[1].name", "already"),
        ([{"name": "a", "reference": 1.0}], "objectives.a.reference", "several objectives"),
        ([{"name": "a"}, {"name": "b", "reference": "x"}], "objectives[1].reference", "finite"),
        ([{"name": "a"}, {"name": "b", "reference": math.nan}], "objectives[1].reference", "nan"),
        ([{"name": "a", "weight": 2}], "objectives[0].weight", "unknown objective setting"),
    ],
)
def test_bad_objectives_name_the_field(objectives: list[Any], field: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        _spec(objectives=objectives)
    assert info.value.field == field


def test_unknown_goal_lists_goals() -> None:
    with pytest.raises(ValidationError, match=r"unknown goal 'fastest'") as info:
        _spec(objectives=[{"name": "tps", "goal": "fastest"}])
    assert info.value.field == "objectives[0].goal"
    assert "(allowed: 'minimize', 'maximize')" in str(info.value)


@pytest.mark.parametrize("objective", [{"goal": "maximize"}, "tps", ["tps"]])
def test_malformed_objective(objective: Any) -> None:
    with pytest.raises(ValidationError, match=r"must be a table with 'name' and 'goal'") as info:
        _spec(objectives=[objective])
    assert info.value.field == "objectives[0]"


def test_bad_objective_name() -> None:
    with pytest.raises(ValidationError, match=r"invalid metric name 'a b'") as info:
        _spec(objectives=[{"name": "a b"}])
    assert info.value.field == "objectives.name"


@pytest.mark.parametrize(
    ("designer", "field", "fragment"),
    [
        ({"algo": "bo"}, "designer.algo", "unknown designer setting"),
        ({"algorithm": "tpe"}, "designer.algorithm", "allowed: 'bo', 'sobol', 'random'"),
        ({"seed": -1}, "designer.seed", "an integer in [0, 2**31)"),
        ({"seed": 2**31}, "designer.seed", "an integer in [0, 2**31)"),
        ({"seed": True}, "designer.seed", "got True"),
        ({"seed": "1"}, "designer.seed", "got '1'"),
        ({"seed": 1.0}, "designer.seed", "got 1.0"),
        ({"initial_trials": 0}, "designer.initial_trials", "an integer in [1, 10000]"),
        ({"initial_trials": 10_001}, "designer.initial_trials", "an integer in [1, 10000]"),
        ({"initial_trials": 2.0}, "designer.initial_trials", "got 2.0"),
        ({"start_with_default": "yes"}, "designer.start_with_default", "must be true or false"),
        ({"random_fraction": 1.5}, "designer.random_fraction", "a number in [0, 1]"),
        ({"random_fraction": -0.1}, "designer.random_fraction", "a number in [0, 1]"),
        ({"random_fraction": True}, "designer.random_fraction", "got True"),
    ],
)
def test_bad_designer_settings(designer: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(ValidationError, match=r"^designer\.") as info:
        _spec(designer=designer)
    assert info.value.field == field
    assert fragment in str(info.value)


def test_unknown_designer_setting_lists_settings() -> None:
    with pytest.raises(ValidationError, match=r"unknown designer setting") as info:
        _spec(designer={"seed": 1, "batch": 4})
    assert "'algorithm', 'initial_trials', 'seed', 'start_with_default', 'random_fraction'" in str(
        info.value
    )


def test_designer_must_be_a_table() -> None:
    with pytest.raises(ValidationError, match=r"must be a table/object") as info:
        _spec(designer="bo")
    assert info.value.field == "designer"


def test_unknown_top_level_field_lists_fields() -> None:
    data = _data()
    data["objective"] = "tps"
    with pytest.raises(ValidationError, match=r"^objective: unknown study field") as info:
        StudySpec.from_dict(data)
    assert info.value.field == "objective"
    assert "'name', 'knobs', 'objectives'" in str(info.value)


@pytest.mark.parametrize(
    ("key", "value", "field", "fragment"),
    [
        ("knobs", None, "knobs", "must be a list of knob tables"),
        (
            "knobs",
            [{"name": "x", "kind": "float", "low": 2.0, "high": 1.0}],
            "knobs[0].high",
            "knob 'x': high (1.0) must be greater",
        ),
        ("knobs", [{"name": "x", "kind": "strange"}], "knobs[0].kind", "unknown knob kind"),
        ("objectives", "tps", "objectives", "must be a list"),
        ("outcome_constraints", "p95 <= 3", "outcome_constraints", "must be a list"),
        ("outcome_constraints", ["p95 <= 20", "p99 < 3"], "outcome_constraints[1]", "cannot parse"),
        ("parameter_constraints", ["a + z <= 1"], "parameter_constraints[0]", "unknown knob 'z'"),
        ("parameter_constraints", ["cache <= 100"], "parameter_constraints[0]", "log-scaled"),
        ("allow_unsafe", "yes", "allow_unsafe", "must be true or false"),
    ],
)
def test_from_dict_errors_name_the_field(key: str, value: Any, field: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        _spec(**{key: value})
    assert info.value.field == field
    assert fragment in str(info.value)


def test_from_dict_requires_a_table() -> None:
    with pytest.raises(ValidationError, match=r"^study: must be a table/object"):
        StudySpec.from_dict(["name"])


def test_from_dict_with_knobs_given() -> None:
    data = _data()
    del data["knobs"]
    data["parameter_constraints"] = []
    knobs = (BoolKnob("x"), CategoricalKnob("y", choices=("p", "q", "r"), unsafe_values=("q",)))
    spec = StudySpec.from_dict(data, knobs=knobs)
    assert spec.space.names == ("x", "y")
    assert spec.space["y"].choices == ("p", "r")  # type: ignore[attr-defined]


def test_parameter_constraint_knob_must_survive_the_space() -> None:
    space = SearchSpace((FloatKnob("a"), FloatKnob("b")))
    constraint = LinearConstraint.parse("a + b <= 1", space)
    other = SearchSpace((FloatKnob("a"), FloatKnob("c")))
    with pytest.raises(ValidationError, match=r"names unknown knob 'b'") as info:
        StudySpec("s", other, (Objective("y"),), parameter_constraints=(constraint,))
    assert info.value.field == "parameter_constraints"


# -- behaviour --------------------------------------------------------------------------


def test_allow_unsafe_false_strips_unsafe_values() -> None:
    spec = _spec()
    journal = spec.space["journal"]
    assert journal.choices == ("delete", "wal")  # type: ignore[attr-defined]
    assert journal.unsafe_values == ()
    with pytest.raises(ValidationError, match=r"config\.journal.*allowed: 'delete', 'wal'"):
        spec.space.validate_config(
            {"cache": 64, "a": 1.0, "b": 0, "journal": "off", "sync": "full", "mmap": True}
        )


def test_allow_unsafe_false_strips_when_built_directly() -> None:
    knob = CategoricalKnob("j", choices=("a", "b", "c"), default="c", unsafe_values=("c",))
    spec = StudySpec("s", SearchSpace((knob,)), (Objective("y"),))
    assert spec.space["j"].choices == ("a", "b")  # type: ignore[attr-defined]
    assert spec.space["j"].default is None
    unsafe = StudySpec("s", SearchSpace((knob,)), (Objective("y"),), allow_unsafe=True)
    assert unsafe.space["j"].choices == ("a", "b", "c")  # type: ignore[attr-defined]
    assert unsafe.space["j"].unsafe_values == ("c",)


def test_metric_names_objective_first_then_constraints_in_order() -> None:
    assert _spec().metric_names == ("tps", "p95_ms", "errors")
    spec = _spec(outcome_constraints=["z <= 1", "a >= 0", "z >= -1"])
    assert spec.metric_names == ("tps", "z", "a")


def test_objective_better() -> None:
    assert Objective("y", Goal.MAXIMIZE).better(2.0, 1.0)
    assert not Objective("y", Goal.MAXIMIZE).better(1.0, 1.0)
    assert Objective("y", Goal.MINIMIZE).better(1.0, 2.0)
    assert not Objective("y", Goal.MINIMIZE).better(2.0, 2.0)


def test_initial_size() -> None:
    assert DesignerSettings().initial_size(1) == 5
    assert DesignerSettings().initial_size(6) == 7
    assert DesignerSettings().initial_size(40) == 10
    assert DesignerSettings(initial_trials=3).initial_size(40) == 3


def test_satisfies_parameter_constraints_and_with_name() -> None:
    spec = _spec()
    config = {"cache": 64, "a": 2.0, "b": 4, "journal": "wal", "sync": "full", "mmap": True}
    assert spec.satisfies_parameter_constraints(config)
    assert not spec.satisfies_parameter_constraints({**config, "b": 5})
    renamed = spec.with_name("copy")
    assert renamed.name == "copy" and renamed.space == spec.space
    with pytest.raises(ValidationError, match=r"invalid study name"):
        spec.with_name("bad name")


def test_dict_round_trip_keeps_outcome_bound_precision() -> None:
    spec = _spec(outcome_constraints=["p95_ms <= 20.0000001", "mem_mb <= 123456789"])
    again = StudySpec.from_dict(spec.to_dict())
    assert again.outcome_constraints == spec.outcome_constraints
    assert again == spec


def test_relative_constraints_need_the_default_configuration_measured() -> None:
    knobs = [
        {"name": "x", "kind": "float", "default": 0.5},
        {"name": "y", "kind": "int", "high": 9},
    ]
    relative = ["tps >= 0.99 * default"]
    with pytest.raises(ValidationError, match="knob 'y' has no default") as info:
        _spec(knobs=knobs, outcome_constraints=relative, parameter_constraints=[])
    assert info.value.field == "outcome_constraints"
    knobs[1]["default"] = 3
    with pytest.raises(ValidationError, match="start_with_default = true") as info:
        _spec(
            knobs=knobs,
            outcome_constraints=relative,
            parameter_constraints=[],
            designer={"start_with_default": False},
        )
    assert info.value.field == "designer.start_with_default"
    spec = _spec(knobs=knobs, outcome_constraints=relative, parameter_constraints=[])
    assert spec.to_dict()["outcome_constraints"] == ["tps >= 0.99 * default"]
    assert StudySpec.from_dict(spec.to_dict()) == spec
