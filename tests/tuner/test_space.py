"""Tests for tuner.space: knob kinds, validation, safety, dictionary round trips, spaces."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tuner.errors import ValidationError
from tuner.space import (
    BoolKnob,
    CategoricalKnob,
    FloatKnob,
    IntKnob,
    Knob,
    OrdinalKnob,
    SearchSpace,
    knob_from_dict,
)

# -- float ------------------------------------------------------------------------------


def test_float_knob_accepts_values_in_range_as_floats() -> None:
    knob = FloatKnob("ratio", low=0, high=2)
    assert (knob.low, knob.high) == (0.0, 2.0)
    assert isinstance(knob.low, float)
    for value in (0, 0.0, 1, 1.5, 2):
        out = knob.validate(value)
        assert out == value and isinstance(out, float)


@pytest.mark.parametrize("value", [-0.1, 2.1, math.nan, math.inf, -math.inf, "1.0", True, None])
def test_float_knob_rejects_values(value: Any) -> None:
    knob = FloatKnob("ratio", low=0.0, high=2.0)
    with pytest.raises(ValidationError, match=r"config\.ratio: value .* is not allowed") as info:
        knob.validate(value)
    assert info.value.field == "config.ratio"
    assert "[0.0, 2.0]" in str(info.value)


def test_validate_uses_the_given_field() -> None:
    with pytest.raises(ValidationError, match=r"^trial\.config\.x:") as info:
        FloatKnob("x").validate(5.0, "trial.config.x")
    assert info.value.field == "trial.config.x"


def test_float_log_knob_describes_its_scale() -> None:
    knob = FloatKnob("lr", low=1e-4, high=1.0, log=True)
    assert knob.validate(1e-3) == 1e-3
    with pytest.raises(ValidationError, match=r"log scale"):
        knob.validate(2.0)


@pytest.mark.parametrize("cls", [FloatKnob, IntKnob])
@pytest.mark.parametrize(("low", "high"), [(5, 1), (3, 3)])
def test_range_knob_rejects_reversed_or_equal_bounds(cls: type[Knob], low: int, high: int) -> None:
    with pytest.raises(ValidationError, match=r"must be greater than low") as info:
        cls("x", low=low, high=high)  # type: ignore[call-arg]
    assert info.value.field == "knobs.x.high"


@pytest.mark.parametrize(
    ("low", "high", "field"),
    [
        (math.nan, 1.0, "low"),
        (0.0, math.nan, "high"),
        (-math.inf, 1.0, "low"),
        (0.0, math.inf, "high"),
    ],
)
def test_float_knob_rejects_non_finite_bounds(low: float, high: float, field: str) -> None:
    with pytest.raises(ValidationError, match=r"must be finite") as info:
        FloatKnob("x", low=low, high=high)
    assert info.value.field == f"knobs.x.{field}"


@pytest.mark.parametrize(("low", "field"), [("0", "low"), (True, "low"), (None, "low")])
def test_float_knob_rejects_non_numeric_bounds(low: Any, field: str) -> None:
    with pytest.raises(ValidationError, match=r"must be a number") as info:
        FloatKnob("x", low=low, high=1.0)
    assert info.value.field == f"knobs.x.{field}"


@pytest.mark.parametrize("cls", [FloatKnob, IntKnob])
@pytest.mark.parametrize("low", [0, -1])
def test_log_knob_needs_positive_low(cls: type[Knob], low: int) -> None:
    with pytest.raises(ValidationError, match=r"log-scaled knob needs low > 0") as info:
        cls("x", low=low, high=10, log=True)  # type: ignore[call-arg]
    assert info.value.field == "knobs.x.low"
    assert "allowed: low > 0, or log = false" in str(info.value)


# -- int --------------------------------------------------------------------------------


def test_int_knob_accepts_integers_and_integral_floats() -> None:
    knob = IntKnob("threads", low=1, high=8)
    assert knob.validate(1) == 1
    out = knob.validate(8.0)
    assert out == 8 and isinstance(out, int)
    assert knob.size == 8


def test_int_knob_bounds_may_be_integral_floats() -> None:
    knob = IntKnob("n", low=1.0, high=4.0)
    assert (knob.low, knob.high) == (1, 4)
    assert isinstance(knob.low, int) and isinstance(knob.high, int)


@pytest.mark.parametrize(
    ("low", "high", "field"), [(1.5, 4, "low"), (1, "4", "high"), (True, 4, "low")]
)
def test_int_knob_rejects_non_integer_bounds(low: Any, high: Any, field: str) -> None:
    with pytest.raises(ValidationError, match=r"must be an integer") as info:
        IntKnob("n", low=low, high=high)
    assert info.value.field == f"knobs.n.{field}"


@pytest.mark.parametrize(
    ("low", "high", "field"), [(0, 2**64 - 1, "high"), (-(2**63) - 1, 0, "low")]
)
def test_int_knob_bounds_fit_the_wire_formats_64_bits(low: int, high: int, field: str) -> None:
    """MySQL has knobs up to 2^64 - 1: the error names the bound and the allowed integers
    (protobuf's "Value out of range" came later, from deep inside a client call)."""
    with pytest.raises(ValidationError, match=r"does not fit a 64-bit signed integer") as info:
        IntKnob("n", low=low, high=high)
    assert info.value.field == f"knobs.n.{field}"
    assert "9223372036854775807" in str(info.value)
    widest = IntKnob("n", low=-(2**63), high=2**63 - 1)
    assert widest.validate(2**63 - 1) == 2**63 - 1


def test_a_range_whose_width_overflows_is_rejected() -> None:
    with pytest.raises(ValidationError, match=r"too wide") as info:
        FloatKnob("x", low=-1e308, high=1e308)
    assert info.value.field == "knobs.x.high"
    assert FloatKnob("x", low=-8e307, high=8e307).validate(0.0) == 0.0


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"description": "d" * 4097}, "description"),
        ({"unit": "u" * 65}, "unit"),
        ({"description": b"bytes"}, "description"),
    ],
)
def test_a_knobs_text_is_bounded(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        FloatKnob("x", low=0, high=1, **fields)
    assert info.value.field == f"knobs.x.{field}"


def test_names_with_a_trailing_newline_are_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        FloatKnob("x\n", low=0, high=1)
    assert info.value.field == "knob.name"


@pytest.mark.parametrize("value", [0, 9, 2.5, "3", True, False, None, math.nan])
def test_int_knob_rejects_values(value: Any) -> None:
    knob = IntKnob("threads", low=1, high=8)
    with pytest.raises(ValidationError, match=r"int knob 'threads'") as info:
        knob.validate(value)
    assert info.value.field == "config.threads"
    assert "(allowed: [1, 8])" in str(info.value)


# -- choices: categorical, ordinal, bool -----------------------------------------------


@pytest.mark.parametrize("cls", [CategoricalKnob, OrdinalKnob])
def test_choice_knob_accepts_its_choices_in_canonical_form(cls: type[Knob]) -> None:
    knob = cls("mode", choices=("wal", 4, 2.5))  # type: ignore[call-arg]
    assert knob.validate("wal") == "wal"
    out = knob.validate(4.0)  # numbers compare by value...
    assert out == 4 and isinstance(out, int)  # ...and come back as the listed choice
    assert knob.validate(2.5) == 2.5


@pytest.mark.parametrize("cls", [CategoricalKnob, OrdinalKnob])
@pytest.mark.parametrize("value", ["WAL", "delete", 3, True, None, [1]])
def test_choice_knob_rejects_other_values_and_lists_choices(cls: type[Knob], value: Any) -> None:
    knob = cls("mode", choices=("wal", 4, 1))  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match=r"is not allowed for") as info:
        knob.validate(value)
    assert info.value.field == "config.mode"
    assert "(allowed: 'wal', 4, 1)" in str(info.value)


def test_choice_knob_keeps_true_apart_from_one() -> None:
    knob = CategoricalKnob("c", choices=(1, True, "x"))
    assert knob.validate(True) is True
    out = knob.validate(1)
    assert out == 1 and not isinstance(out, bool)
    assert knob.index(True) == 1 and knob.index(1.0) == 0


@pytest.mark.parametrize("choices", [(), ("only",)])
@pytest.mark.parametrize("cls", [CategoricalKnob, OrdinalKnob])
def test_choice_knob_needs_two_choices(cls: type[Knob], choices: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError, match=r"needs at least 2 values") as info:
        cls("c", choices=choices)  # type: ignore[call-arg]
    assert info.value.field == "knobs.c.choices"


@pytest.mark.parametrize("choices", [("a", "a"), (1, 1.0), ("x", 2, 2)])
@pytest.mark.parametrize("cls", [CategoricalKnob, OrdinalKnob])
def test_choice_knob_rejects_duplicate_choices(cls: type[Knob], choices: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError, match=r"values must be distinct") as info:
        cls("c", choices=choices)  # type: ignore[call-arg]
    assert info.value.field == "knobs.c.choices"


@pytest.mark.parametrize("choices", ["ab", 5, None])
def test_choice_knob_rejects_non_list_choices(choices: Any) -> None:
    with pytest.raises(ValidationError, match=r"must be a list of values"):
        CategoricalKnob("c", choices=choices)


@pytest.mark.parametrize("bad", [None, math.nan, [1], {"a": 1}])
def test_choice_knob_rejects_non_scalar_choices(bad: Any) -> None:
    with pytest.raises(ValidationError, match=r"is not a string, number or bool") as info:
        CategoricalKnob("c", choices=("a", bad))
    assert info.value.field == "knobs.c.choices"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        ("true", True),
        ("TRUE", True),
        ("on", True),
        ("false", False),
        ("Off", False),
    ],
)
def test_bool_knob_coercions(value: Any, expected: bool) -> None:
    assert BoolKnob("flag").validate(value) is expected


@pytest.mark.parametrize("value", [2, -1, 1.0, "yes", "1", "", None])
def test_bool_knob_rejects_other_values(value: Any) -> None:
    with pytest.raises(ValidationError, match=r"bool knob 'flag'") as info:
        BoolKnob("flag").validate(value)
    assert info.value.field == "config.flag"
    assert "(allowed: true, false)" in str(info.value)


def test_bool_knob_choices_are_fixed() -> None:
    assert BoolKnob("flag").choices == (False, True)
    assert BoolKnob("flag", default="on").default is True


# -- shared fields: names, defaults, special and unsafe values -------------------------


@pytest.mark.parametrize("name", ["", "1abc", "a b", "a/b", "x" * 129, None, 3])
def test_knob_rejects_bad_names(name: Any) -> None:
    with pytest.raises(ValidationError, match=r"invalid knob name") as info:
        FloatKnob(name)
    assert info.value.field == "knob.name"


@pytest.mark.parametrize("name", ["a", "_a", "shared_buffers", "gpu.clock-mhz", "x" * 128])
def test_knob_accepts_good_names(name: str) -> None:
    assert BoolKnob(name).name == name


def test_default_is_validated_and_canonicalised() -> None:
    assert IntKnob("n", low=1, high=9, default=3.0).default == 3
    with pytest.raises(ValidationError, match=r"value 10 is not allowed") as info:
        IntKnob("n", low=1, high=9, default=10)
    assert info.value.field == "knobs.n.default"


@pytest.mark.parametrize("key", ["special_values", "unsafe_values"])
def test_special_and_unsafe_values_are_validated(key: str) -> None:
    knob = IntKnob("n", low=-1, high=9, **{key: [-1, 0.0]})  # type: ignore[arg-type]
    assert getattr(knob, key) == (-1, 0)
    with pytest.raises(ValidationError, match=r"is not allowed") as info:
        IntKnob("n", low=0, high=9, **{key: (10,)})  # type: ignore[arg-type]
    assert info.value.field == f"knobs.n.{key}"
    with pytest.raises(ValidationError, match=r"must be a list of values"):
        IntKnob("n", low=0, high=9, **{key: 3})  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [CategoricalKnob, OrdinalKnob])
def test_safe_removes_unsafe_choices_default_and_specials(cls: type[Knob]) -> None:
    knob = cls(  # type: ignore[call-arg]
        "journal",
        choices=("delete", "wal", "memory", "off"),
        default="off",
        special_values=("off", "wal"),
        unsafe_values=("memory", "off"),
    )
    safe = knob.safe()
    assert safe.choices == ("delete", "wal")  # type: ignore[attr-defined]
    assert safe.default is None
    assert safe.special_values == ("wal",)
    assert safe.unsafe_values == ()
    with pytest.raises(ValidationError, match=r"'delete', 'wal'"):
        safe.validate("memory")
    assert knob.validate("memory") == "memory"  # the original is unchanged


def test_safe_keeps_a_safe_default() -> None:
    knob = CategoricalKnob("c", choices=("a", "b", "c"), default="a", unsafe_values=("c",))
    assert knob.safe().default == "a"


def test_safe_without_unsafe_values_is_identity() -> None:
    knob = CategoricalKnob("c", choices=("a", "b"))
    assert knob.safe() is knob


def test_safe_of_a_bool_knob_rejects_the_unsafe_value() -> None:
    # Turning off fsync is the archetypal unsafe bool: the safe knob must not allow it.
    # Either safe() refuses (a bool with one safe value cannot be tuned) or the safe knob
    # rejects False; today safe() silently resets choices to (False, True).
    knob = BoolKnob("fsync", default=True, unsafe_values=(False,))
    try:
        safe = knob.safe()
    except ValidationError as err:
        assert err.field.startswith("knobs.fsync")
        return
    with pytest.raises(ValidationError, match=r"config\.fsync"):
        safe.validate(False)


def test_safe_leaving_one_choice_is_an_error() -> None:
    knob = CategoricalKnob("c", choices=("a", "b"), unsafe_values=("b",))
    with pytest.raises(ValidationError, match=r"single value 'a' left") as info:
        knob.safe()
    assert info.value.field == "knobs.c.unsafe_values"
    assert "allow_unsafe = true" in str(info.value)


# -- dictionary form --------------------------------------------------------------------

ALL_KINDS: list[Knob] = [
    FloatKnob("f", low=-1.5, high=2.0),
    FloatKnob(
        "flog",
        low=1e-4,
        high=1.0,
        log=True,
        default=0.01,
        special_values=(1e-4,),
        unit="s",
        description="a log float",
        restart=True,
    ),
    IntKnob("i", low=0, high=100, default=7, special_values=(0,), unsafe_values=(100,)),
    IntKnob("ilog", low=1, high=1 << 20, log=True, unit="KiB"),
    CategoricalKnob("cat", choices=("a", 2, 3.5, True), default=2, unsafe_values=("a",)),
    OrdinalKnob("page", choices=(512, 1024, 4096), default=4096, special_values=(512,)),
    OrdinalKnob("sync", choices=("off", "normal", "full"), active_when="i >= 1"),
    BoolKnob("flag", default=False, restart=True, description="on/off"),
]


@pytest.mark.parametrize("knob", ALL_KINDS, ids=lambda k: k.name)
def test_knob_dict_round_trip(knob: Knob) -> None:
    data = knob.to_dict()
    assert data["kind"] == knob.kind and data["name"] == knob.name
    again = knob_from_dict(data)
    assert again == knob and type(again) is type(knob)
    assert again.to_dict() == data


def test_to_dict_omits_empty_fields() -> None:
    assert FloatKnob("f").to_dict() == {"name": "f", "kind": "float", "low": 0.0, "high": 1.0}
    assert BoolKnob("b").to_dict() == {"name": "b", "kind": "bool"}
    assert OrdinalKnob("o", choices=(1, 2)).to_dict() == {
        "name": "o",
        "kind": "ordinal",
        "choices": [1, 2],
    }


def test_knob_from_dict_accepts_list_fields() -> None:
    knob = knob_from_dict(
        {"name": "c", "kind": "categorical", "choices": ["a", "b"], "special_values": ["a"]}
    )
    assert knob == CategoricalKnob("c", choices=("a", "b"), special_values=("a",))


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "x", "kind": "float", "choices": [1, 2]}, "knob.choices"),
        ({"name": "x", "kind": "bool", "low": 0}, "knob.low"),
        ({"name": "x", "kind": "categorical", "choices": [1, 2], "log": True}, "knob.log"),
        ({"name": "x", "kind": "int", "low": 0, "high": 3, "colour": "red"}, "knob.colour"),
    ],
)
def test_knob_from_dict_rejects_unknown_fields(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=r"unknown field for a \w+ knob") as info:
        knob_from_dict(data)
    assert info.value.field == field
    assert "'name'" in str(info.value) and "'kind'" in str(info.value)


@pytest.mark.parametrize("kind", [None, "str", "Float"])
def test_knob_from_dict_rejects_unknown_kinds(kind: Any) -> None:
    data = {"name": "x"} if kind is None else {"name": "x", "kind": kind}
    with pytest.raises(ValidationError, match=r"unknown knob kind") as info:
        knob_from_dict(data, "knobs[3]")
    assert info.value.field == "knobs[3].kind"
    assert "'float', 'int', 'categorical', 'bool', 'ordinal'" in str(info.value)


def test_knob_from_dict_requires_a_table_and_a_name() -> None:
    with pytest.raises(ValidationError, match=r"must be a table/object, got list"):
        knob_from_dict([1, 2])
    with pytest.raises(ValidationError, match=r"is required") as info:
        knob_from_dict({"kind": "bool"})
    assert info.value.field == "knob.name"


@pytest.mark.parametrize(
    ("key", "value"), [("log", "yes"), ("restart", 1), ("unit", 3), ("description", None)]
)
def test_knob_from_dict_checks_field_types(key: str, value: Any) -> None:
    data = {"name": "x", "kind": "int", "low": 1, "high": 3, key: value}
    with pytest.raises(ValidationError, match=r"must be a (bool|str)") as info:
        knob_from_dict(data)
    assert info.value.field == f"knob.{key}"


# -- search spaces ----------------------------------------------------------------------


def _space() -> SearchSpace:
    return SearchSpace(
        (
            IntKnob("threads", low=1, high=8, default=4),
            BoolKnob("flag", default=False),
            CategoricalKnob("mode", choices=("a", "b"), default="a"),
        )
    )


def test_space_lookup_and_names() -> None:
    space = _space()
    assert len(space) == 3
    assert space.names == ("threads", "flag", "mode")
    assert space["flag"] == BoolKnob("flag", default=False)
    assert "mode" in space and "nope" not in space
    with pytest.raises(ValidationError, match=r"unknown knob 'nope'.*'threads', 'flag', 'mode'"):
        space["nope"]


def test_space_rejects_duplicate_names_empty_and_non_knobs() -> None:
    with pytest.raises(ValidationError, match=r"duplicate knob name 'a'") as info:
        SearchSpace((BoolKnob("a"), FloatKnob("b"), FloatKnob("a")))
    assert info.value.field == "space.knobs[2].name"
    with pytest.raises(ValidationError, match=r"needs at least one knob"):
        SearchSpace(())
    with pytest.raises(ValidationError, match=r"is not a knob") as info:
        SearchSpace((BoolKnob("a"), {"name": "b"}))  # type: ignore[arg-type]
    assert info.value.field == "space.knobs[1]"


def test_validate_config_canonicalises_values() -> None:
    out = _space().validate_config({"threads": 2.0, "flag": "on", "mode": "b"})
    assert out == {"threads": 2, "flag": True, "mode": "b"}
    assert isinstance(out["threads"], int)


@pytest.mark.parametrize(
    ("config", "field", "fragment"),
    [
        ({"threads": 2, "flag": True}, "config.mode", "is missing"),
        ({"threads": 2, "flag": True, "mode": "a", "zz": 1}, "config.zz", "unknown knob"),
        ({"threads": 0, "flag": True, "mode": "a"}, "config.threads", "allowed: [1, 8]"),
        ({"threads": 2, "flag": True, "mode": "c"}, "config.mode", "allowed: 'a', 'b'"),
    ],
)
def test_validate_config_errors_name_the_field(
    config: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(ValidationError, match=r"^config\.") as info:
        _space().validate_config(config)
    assert info.value.field == field
    assert fragment in str(info.value)


def test_validate_config_requires_a_mapping() -> None:
    with pytest.raises(ValidationError, match=r"must be a mapping"):
        _space().validate_config([("threads", 2)])


def test_default_config() -> None:
    assert _space().default_config() == {"threads": 4, "flag": False, "mode": "a"}
    partial = SearchSpace((IntKnob("a", low=0, high=3, default=1), FloatKnob("b")))
    assert partial.default_config() is None


def test_recommended_region_is_validated_and_round_trips() -> None:
    knob = knob_from_dict(
        {"name": "a", "kind": "int", "low": 0, "high": 10, "recommended": [2, 5],
         "recommended_source": "the manual, section 1"}
    )  # fmt: skip
    assert knob.recommended == (2, 5)
    assert knob_from_dict(knob.to_dict()) == knob
    choice = knob_from_dict(
        {"name": "m", "kind": "categorical", "choices": ["x", "y", "z"], "recommended": ["y"],
         "recommended_source": "a guide"}
    )  # fmt: skip
    assert choice.recommended == ("y",)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"recommended": [5, 2], "recommended_source": "d"}, "knobs.a.recommended"),
        ({"recommended": [2, 50], "recommended_source": "d"}, "knobs.a.recommended"),
        ({"recommended": [2]}, "knobs.a.recommended_source"),
        ({"recommended_source": "d"}, "knobs.a.recommended_source"),
    ],
)
def test_bad_recommended_region_names_its_field(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        knob_from_dict({"name": "a", "kind": "int", "low": 0, "high": 10, **extra})
    assert err.value.field == field


def test_safe_drops_unsafe_recommended_choices() -> None:
    knob = knob_from_dict(
        {"name": "m", "kind": "categorical", "choices": ["x", "y", "z"], "unsafe_values": ["z"],
         "recommended": ["y", "z"], "recommended_source": "a guide"}
    )  # fmt: skip
    assert knob.safe().recommended == ("y",)


def test_a_space_has_at_most_max_knobs_knobs() -> None:
    from tuner.space import MAX_KNOBS

    knobs = tuple(FloatKnob(f"k{i}", low=0.0, high=1.0) for i in range(MAX_KNOBS + 1))
    assert len(SearchSpace(knobs[:MAX_KNOBS]).knobs) == MAX_KNOBS
    with pytest.raises(ValidationError) as caught:
        SearchSpace(knobs)
    assert caught.value.field == "space.knobs" and f"at most {MAX_KNOBS}" in str(caught.value)


def test_a_knob_with_a_bad_name_is_named_by_its_place_in_a_config() -> None:
    from tuner.space import knob_from_dict

    with pytest.raises(ValidationError) as caught:
        knob_from_dict({"name": "größe", "kind": "bool"}, "study.knobs[3]")
    assert caught.value.field == "study.knobs[3].name" and "größe" in str(caught.value)


def test_a_knob_that_only_matters_under_a_condition() -> None:
    """``active_when``: with 3 queues the fourth queue's ratio is unused."""
    space = SearchSpace(
        (
            IntKnob("num_queues", low=1, high=5, default=4),
            FloatKnob("ratio_3", low=1.1, high=100.0, active_when="num_queues >= 4"),
            FloatKnob("ratio_4", low=1.1, high=100.0, active_when="num_queues >= 5"),
            FloatKnob("starvation", low=0.0, high=10.0),
        )
    )
    config = {"num_queues": 3, "ratio_3": 2.0, "ratio_4": 2.0, "starvation": 1.0}
    assert space.inactive(config) == {"ratio_3", "ratio_4"}
    assert space.inactive({**config, "num_queues": 4}) == {"ratio_4"}
    assert space.inactive({**config, "num_queues": 5}) == set()
    assert space.inactive({"ratio_4": 2.0}) == set()  # without num_queues: nothing to judge
    assert knob_from_dict(space["ratio_4"].to_dict()).active_when == "num_queues >= 5"


@pytest.mark.parametrize(
    "condition, message",
    [
        ("queues >= 5", "names unknown knob 'queues'"),
        ("ratio_4 >= 2", "names the knob itself"),
        ("num_queues > 5", "cannot parse"),
    ],
)
def test_a_condition_that_does_not_hold_together_names_its_field(
    condition: str, message: str
) -> None:
    with pytest.raises(ValidationError) as error:
        SearchSpace(
            (
                IntKnob("num_queues", low=1, high=5),
                FloatKnob("ratio_4", low=1.1, high=100.0, active_when=condition),
            )
        )
    assert error.value.field == "knobs.ratio_4.active_when"
    assert message in error.value.message
