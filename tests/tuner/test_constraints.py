"""Tests for tuner.constraints: outcome constraints and linear parameter constraints."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tuner.constraints import LinearConstraint, OutcomeConstraint
from tuner.errors import ValidationError
from tuner.space import BoolKnob, CategoricalKnob, FloatKnob, IntKnob, SearchSpace

# -- outcome constraints ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "metric", "op", "bound"),
    [
        ("p95_ms <= 20", "p95_ms", "<=", 20.0),
        ("tps >= 1000.5", "tps", ">=", 1000.5),
        ("delta >= -3", "delta", ">=", -3.0),
        ("delta>=- 3", "delta", ">=", -3.0),
        ("x>=1e-3", "x", ">=", 1e-3),
        ("  err.rate <= .5  ", "err.rate", "<=", 0.5),
        ("gpu-power_w<=2E2", "gpu-power_w", "<=", 200.0),
        ("_hidden <= 0", "_hidden", "<=", 0.0),
    ],
)
def test_outcome_constraint_parses(text: str, metric: str, op: str, bound: float) -> None:
    constraint = OutcomeConstraint.parse(text)
    assert constraint == OutcomeConstraint(metric, op, bound)
    assert isinstance(constraint.bound, float)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("p95_ms 20", "cannot parse 'p95_ms 20'"),
        ("p95_ms <= 20 >= 3", "cannot parse"),
        ("p95_ms <= twenty", "cannot parse 'p95_ms <= twenty'"),
        ("p95_ms < 20", "at position 6: unexpected ' < 20'"),
        ("<", "unexpected '<'"),
        ("20 >= p95_ms", "cannot parse"),
        ("p95_ms <=", "cannot parse"),
        ("p95_ms <= 2 * 10", "cannot parse"),
        ("p95_ms <= 20 ms", "cannot parse"),
        ("p95_ms == 20", "unexpected ' == 20'"),
        ("", "is empty"),
        ("   ", "is empty"),
    ],
)
def test_outcome_constraint_parse_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValidationError, match=r"^outcome_constraints\[2\]: ") as info:
        OutcomeConstraint.parse(text, "outcome_constraints[2]")
    assert info.value.field == "outcome_constraints[2]"
    assert fragment in str(info.value)


@pytest.mark.parametrize("text", ["p95_ms < 20", "p95_ms == 20", "a + 2^b <= 3"])
def test_a_constraint_with_a_foreign_symbol_lists_what_a_constraint_is_made_of(text: str) -> None:
    with pytest.raises(ValidationError) as info:
        OutcomeConstraint.parse(text, "outcome_constraints[0]")
    assert "one comparison, <= or >= (not <, > or =)" in str(info.value.allowed)


EXPECTED = r"'<metric> <= <number>', '<metric> >= <number>' or '<metric> >= <number> \* default'"


def test_outcome_constraint_parse_error_says_what_is_expected() -> None:
    with pytest.raises(ValidationError, match=EXPECTED):
        OutcomeConstraint.parse("p95_ms 20")
    with pytest.raises(ValidationError, match=EXPECTED):
        OutcomeConstraint.parse("p95_ms <= x")


@pytest.mark.parametrize("text", [None, 20, ["p95 <= 2"], b"p95 <= 2"])
def test_outcome_constraint_parse_requires_a_string(text: Any) -> None:
    with pytest.raises(ValidationError, match=r"must be a string like 'p95_ms <= 20'") as info:
        OutcomeConstraint.parse(text)
    assert info.value.field == "outcome_constraints"


@pytest.mark.parametrize(
    ("args", "field", "fragment"),
    [
        (("9lives", "<=", 1.0), "outcome_constraints.metric", "invalid metric name"),
        (("a b", "<=", 1.0), "outcome_constraints.metric", "invalid metric name"),
        (("m", "<", 1.0), "outcome_constraints.op", "allowed: '<=', '>='"),
        (("m", "<=", "1"), "outcome_constraints.bound", "must be a number"),
        (("m", "<=", True), "outcome_constraints.bound", "must be a number"),
        (("m", "<=", math.inf), "outcome_constraints.bound", "must be finite"),
        (("m", ">=", math.nan), "outcome_constraints.bound", "must be finite"),
    ],
)
def test_outcome_constraint_constructor_validates(
    args: tuple[Any, ...], field: str, fragment: str
) -> None:
    with pytest.raises(ValidationError, match=r"^outcome_constraints\.") as info:
        OutcomeConstraint(*args)
    assert info.value.field == field
    assert fragment in str(info.value)


def test_outcome_constraint_slack_and_satisfied() -> None:
    upper = OutcomeConstraint.parse("p95_ms <= 20")
    assert upper.slack(15.0) == 5.0 and upper.satisfied(15.0)
    assert upper.satisfied(20.0)
    assert upper.slack(25.0) == -5.0 and not upper.satisfied(25.0)
    lower = OutcomeConstraint.parse("tps >= 100")
    assert lower.slack(150.0) == 50.0 and lower.satisfied(100.0)
    assert not lower.satisfied(99.0)
    assert not upper.satisfied(math.nan) and not lower.satisfied(math.nan)


@pytest.mark.parametrize(
    "text", ["p95_ms <= 20", "tps >= -3", "x >= 0.001", "lat <= 0.1234567", "n <= 123456789"]
)
def test_outcome_constraint_str_parses_back_to_the_same_constraint(text: str) -> None:
    constraint = OutcomeConstraint.parse(text)
    assert OutcomeConstraint.parse(str(constraint)) == constraint


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("samples_per_s >= 10853.986193590785", "samples_per_s >= 10854"),
        ("p95_ms <= 20", "p95_ms <= 20"),
        ("lat <= 0.00123456789", "lat <= 0.00123457"),
        ("ops >= 1234567.89", "ops >= 1234570"),
        ("tps >= -3.14159265", "tps >= -3.14159"),
        ("x >= 0", "x >= 0"),
        ("samples_per_s >= 0.987654321 * default", "samples_per_s >= 0.987654 * default"),
    ],
)
def test_a_constraint_for_people_rounds_its_bound_to_significant_digits(
    text: str, shown: str
) -> None:
    constraint = OutcomeConstraint.parse(text)
    assert constraint.text(digits=6) == shown
    assert str(constraint) == constraint.text() and OutcomeConstraint.parse(str(constraint)) == (
        constraint
    )  # str keeps every digit


@pytest.mark.parametrize(
    ("text", "op", "factor", "shown"),
    [
        ("samples_per_s >= 0.99 * default", ">=", 0.99, "samples_per_s >= 0.99 * default"),
        ("p99_ms<=1.1*default", "<=", 1.1, "p99_ms <= 1.1 * default"),
        ("p99_ms <= default", "<=", 1.0, "p99_ms <= default"),
    ],
)
def test_relative_outcome_constraints_parse_resolve_and_print(
    text: str, op: str, factor: float, shown: str
) -> None:
    constraint = OutcomeConstraint.parse(text)
    assert constraint.relative and constraint.op == op and constraint.bound == factor
    assert str(constraint) == shown and OutcomeConstraint.parse(shown) == constraint
    assert not constraint.satisfied(1e9) and not constraint.satisfied(-1e9)  # unresolved
    absolute = constraint.resolved(200.0)
    assert not absolute.relative and absolute.bound == pytest.approx(200.0 * factor)
    assert absolute.satisfied(200.0)  # the default itself is feasible under any factor >= 1
    assert absolute.resolved(5.0) is absolute


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("tps >= default * 0.99", "'<metric> >= <number> * default'"),
        ("tps >= -0.5 * default", "cannot parse"),
        ("tps >= 0 * default", "a multiple of the default must be positive"),
        ("tps >= 0.9 * baseline", "cannot parse"),
    ],
)
def test_relative_outcome_constraint_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        OutcomeConstraint.parse(text)
    assert fragment in str(info.value)


# -- linear parameter constraints -------------------------------------------------------


def _space() -> SearchSpace:
    return SearchSpace(
        (
            FloatKnob("a", low=0.0, high=10.0),
            FloatKnob("b", low=-5.0, high=5.0),
            IntKnob("x1", low=0, high=100),
            IntKnob("x2", low=0, high=100),
            FloatKnob("lr", low=1e-4, high=1.0, log=True),
            IntKnob("mem", low=1, high=1024, log=True),
            CategoricalKnob("mode", choices=("a", "b")),
            BoolKnob("flag"),
        )
    )


@pytest.mark.parametrize(
    ("text", "terms", "bound"),
    [
        ("a + 2*b <= 10", {"a": 1.0, "b": 2.0}, 10.0),
        ("x1 <= x2", {"x1": 1.0, "x2": -1.0}, 0.0),
        ("x1 >= x2", {"x1": -1.0, "x2": 1.0}, 0.0),
        ("2*a - b >= -3", {"a": -2.0, "b": 1.0}, 3.0),
        ("a*2 + 3 <= b", {"a": 2.0, "b": -1.0}, -3.0),
        ("a + a + 0.5*b - b <= 4", {"a": 2.0, "b": -0.5}, 4.0),
        ("-a <= -1", {"a": -1.0}, -1.0),
        ("- -a <= 1", {"a": 1.0}, 1.0),
        ("1.5e1 >= a + x1", {"a": 1.0, "x1": 1.0}, 15.0),
        ("a + b - b <= 2", {"a": 1.0}, 2.0),
        ("3 + a <= 5 + x1 - 1", {"a": 1.0, "x1": -1.0}, 1.0),
    ],
)
def test_linear_constraint_parses_and_normalises_to_less_equal(
    text: str, terms: dict[str, float], bound: float
) -> None:
    constraint = LinearConstraint.parse(text, _space())
    assert dict(constraint.terms) == terms
    assert constraint.bound == bound
    assert constraint.text == text
    assert str(constraint) == text


def test_linear_constraint_value_and_satisfied() -> None:
    constraint = LinearConstraint.parse("a + 2*b <= 10", _space())
    assert constraint.value({"a": 4.0, "b": 3.0}) == 10.0
    assert constraint.satisfied({"a": 4.0, "b": 3.0})
    assert constraint.satisfied({"a": 4.0, "b": 3.0 + 1e-12})  # within tolerance
    assert not constraint.satisfied({"a": 4.0, "b": 3.001})
    ge = LinearConstraint.parse("x1 >= x2", _space())
    assert ge.satisfied({"x1": 5, "x2": 5}) and ge.satisfied({"x1": 6, "x2": 5})
    assert not ge.satisfied({"x1": 4, "x2": 5})


def test_linear_constraint_without_text_has_a_readable_str() -> None:
    constraint = LinearConstraint((("a", 1.0), ("b", 2.0)), 10.0)
    assert str(constraint) == "1*a + 2*b <= 10"
    assert dict(LinearConstraint.parse(str(constraint), _space()).terms) == {"a": 1.0, "b": 2.0}


def test_linear_constraint_unknown_knob_lists_allowed_names() -> None:
    with pytest.raises(ValidationError, match=r"names unknown knob 'c'") as info:
        LinearConstraint.parse("a + c <= 1", _space(), "parameter_constraints[0]")
    assert info.value.field == "parameter_constraints[0]"
    assert "(allowed: 'a', 'b', 'x1', 'x2', 'lr', 'mem', 'mode', 'flag')" in str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a + mode <= 1", "uses categorical knob 'mode'"),
        ("flag <= 0", "uses bool knob 'flag'"),
        ("a + lr <= 1", "uses float log-scaled knob 'lr'"),
        ("mem <= 100", "uses int log-scaled knob 'mem'"),
    ],
)
def test_linear_constraint_needs_linear_numeric_knobs(text: str, fragment: str) -> None:
    with pytest.raises(ValidationError, match=r"linear constraints need linear-scale") as info:
        LinearConstraint.parse(text, _space())
    assert fragment in str(info.value)
    assert "(allowed: 'a', 'b', 'x1', 'x2')" in str(info.value)


def test_linear_constraint_in_a_space_without_numeric_knobs() -> None:
    space = SearchSpace((BoolKnob("flag"), CategoricalKnob("mode", choices=("x", "y"))))
    with pytest.raises(ValidationError, match=r"allowed: no knob of this space"):
        LinearConstraint.parse("flag <= 1", space)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("3 <= 4", "names no knob with a non-zero coefficient"),
        ("a - a <= 4", "names no knob with a non-zero coefficient"),
        ("0*a <= 1", "names no knob with a non-zero coefficient"),
        ("a + <= 4", "ends with an operator"),
        ("a + b -", "needs exactly one of <=, >="),
        ("a + b - <= 3", "ends with an operator"),
        ("a + b <= 3 -", "ends with an operator"),
        ("a + b", "needs exactly one of <=, >="),
        ("a <= b <= 3", "needs exactly one of <=, >="),
        ("<= 3", "has an empty side"),
        ("a <=", "has an empty side"),
        ("a b <= 3", "expected + or - before 'b'"),
        ("2 a <= 3", "expected + or - before 'a'"),
        ("a * b <= 3", "expected + or - before '*'"),
        ("a * * 2 <= 3", "expected + or - before '*'"),
        ("a < 3", "unexpected ' < 3'"),
        ("a + 2^b <= 3", "unexpected '^b <= 3'"),
        ("", "is empty"),
    ],
)
def test_linear_constraint_parse_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValidationError, match=r"^parameter_constraints: ") as info:
        LinearConstraint.parse(text, _space())
    assert info.value.field == "parameter_constraints"
    assert fragment in str(info.value)


def test_linear_constraint_operator_error_lists_operators() -> None:
    with pytest.raises(ValidationError, match=r"\(allowed: '<=', '>='\)"):
        LinearConstraint.parse("a + b", _space())


@pytest.mark.parametrize("text", [None, 3, ("a <= 1",)])
def test_linear_constraint_parse_requires_a_string(text: Any) -> None:
    with pytest.raises(ValidationError, match=r"must be a string like 'a \+ 2\*b <= 10'"):
        LinearConstraint.parse(text, _space())


def test_a_hyphen_between_knob_names_is_a_minus_unless_a_knob_has_that_name() -> None:
    space = SearchSpace(
        (
            FloatKnob("a", low=0.0, high=1.0),
            FloatKnob("b", low=0.0, high=1.0),
            FloatKnob("x-y", low=0.0, high=1.0),
        )
    )
    assert LinearConstraint.parse("a-b <= 1", space).terms == (("a", 1.0), ("b", -1.0))
    assert LinearConstraint.parse("a-2 <= b", space).terms == (("a", 1.0), ("b", -1.0))
    assert LinearConstraint.parse("a-2 <= b", space).bound == 2.0
    assert LinearConstraint.parse("x-y + a <= 1", space).terms == (("x-y", 1.0), ("a", 1.0))
    with pytest.raises(ValidationError, match="unknown knob 'a-c'"):
        LinearConstraint.parse("a-c <= 1", space)
