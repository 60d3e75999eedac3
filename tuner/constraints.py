"""Outcome constraints (``"p95_ms <= 20"``) and linear parameter constraints (``"a + 2*b <= 10"``).

Both are written as strings, the way Ax writes them, and parsed into frozen dataclasses with
errors that quote the text and say what was expected. A linear constraint is normalised to
``sum(coef_i * knob_i) <= bound``; only numeric range knobs on a linear scale may appear in
one, because the constraint must stay linear in the unit box the optimizer searches.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tuner.errors import ValidationError
from tuner.space import FloatKnob, IntKnob, SearchSpace

OPERATORS = ("<=", ">=")
_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)"
    r"|(?P<op><=|>=)|(?P<sym>[+\-*]))"
)
#: Names of metrics (objectives and constrained outcomes).
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")  # always fullmatch


#: The word that makes an outcome constraint relative to the default configuration.
DEFAULT_WORD = "default"


@dataclass(frozen=True)
class OutcomeConstraint:
    """A bound on a measured metric: ``metric <= bound`` or ``metric >= bound``.

    ``relative``: the bound is a multiple of the value the knobs' default configuration
    measured (``"samples_per_s >= 0.99 * default"``: at most 1 % slower than the default).
    Such a constraint is unresolved until the default trial completes; ``resolved`` turns it
    into an absolute one.
    """

    metric: str
    op: str
    bound: float
    relative: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not METRIC_NAME.fullmatch(self.metric):
            raise ValidationError(
                "outcome_constraints.metric", f"invalid metric name {self.metric!r}"
            )
        if self.op not in OPERATORS:
            raise ValidationError(
                "outcome_constraints.op", f"unknown operator {self.op!r}", OPERATORS
            )
        if isinstance(self.bound, bool) or not isinstance(self.bound, int | float):
            raise ValidationError(
                "outcome_constraints.bound", f"must be a number, got {self.bound!r}"
            )
        if not math.isfinite(self.bound):
            raise ValidationError("outcome_constraints.bound", "must be finite")
        object.__setattr__(self, "bound", float(self.bound))
        if not isinstance(self.relative, bool):
            raise ValidationError("outcome_constraints.relative", "must be true or false")
        if self.relative and self.bound <= 0:
            raise ValidationError(
                "outcome_constraints.bound",
                f"a multiple of the default must be positive, got {self.bound!r}",
            )

    @classmethod
    def parse(cls, text: Any, field: str = "outcome_constraints") -> OutcomeConstraint:
        """Parse ``"metric <= number"``, ``"metric >= number"``, or a bound relative to the
        default configuration: ``"metric >= 0.99 * default"``, ``"metric <= default"``."""
        if not isinstance(text, str):
            raise ValidationError(field, f"must be a string like 'p95_ms <= 20', got {text!r}")
        tokens = _tokenize(text, field)
        shape = [kind for kind, _ in tokens]
        words = [value for _, value in tokens]
        if shape == ["name", "op", "name"] and words[2] == DEFAULT_WORD:
            return cls(words[0], words[1], 1.0, relative=True)
        if shape == ["name", "op", "num", "sym", "name"] and words[3:] == ["*", DEFAULT_WORD]:
            return cls(words[0], words[1], float(words[2]), relative=True)
        sign = 1.0
        if shape[:3] == ["name", "op", "sym"] and tokens[2][1] == "-" and len(tokens) == 4:
            sign, tokens = -1.0, [*tokens[:2], tokens[3]]
            shape = [kind for kind, _ in tokens]
        if shape != ["name", "op", "num"]:
            raise ValidationError(
                field,
                f"cannot parse {text!r}",
                "'<metric> <= <number>', '<metric> >= <number>' or "
                "'<metric> >= <number> * default'",
            )
        return cls(tokens[0][1], tokens[1][1], sign * float(tokens[2][1]))

    def resolved(self, default_value: float) -> OutcomeConstraint:
        """The absolute constraint, given the default configuration's value of the metric."""
        if not self.relative:
            return self
        return OutcomeConstraint(self.metric, self.op, self.bound * default_value)

    def slack(self, value: float) -> float:
        """Signed distance to the bound; ``>= 0`` means satisfied."""
        return self.bound - value if self.op == "<=" else value - self.bound

    def satisfied(self, value: float) -> bool:
        """Whether ``value`` meets the bound; never for a relative constraint still waiting
        for the default configuration's value."""
        return not self.relative and self.slack(value) >= 0.0

    def __str__(self) -> str:
        return self.text()

    def text(self, digits: int | None = None) -> str:
        """``"p95_ms <= 20"``: with every digit of the bound by default, so the text parses
        back to this constraint; with ``digits``, the bound to that many significant digits,
        for people (a bound resolved against the default is ``tps >= 10853.986193590785``
        otherwise)."""
        bound = self.bound if digits is None else _significant(self.bound, digits)
        if self.relative:
            factor = "" if bound == 1.0 else f"{_number(bound)} * "
            return f"{self.metric} {self.op} {factor}{DEFAULT_WORD}"
        return f"{self.metric} {self.op} {_number(bound)}"


@dataclass(frozen=True)
class LinearConstraint:
    """``sum(coef * knob) <= bound`` over numeric knobs of a search space."""

    terms: tuple[tuple[str, float], ...]
    bound: float
    text: str = ""

    @classmethod
    def parse(
        cls, text: Any, space: SearchSpace, field: str = "parameter_constraints"
    ) -> LinearConstraint:
        """Parse e.g. ``"a + 2*b <= 10"`` or ``"x1 >= x2"`` against ``space``."""
        if not isinstance(text, str):
            raise ValidationError(field, f"must be a string like 'a + 2*b <= 10', got {text!r}")
        tokens = _split_hyphens(_tokenize(text, field), space)
        ops = [i for i, (kind, _) in enumerate(tokens) if kind == "op"]
        if len(ops) != 1:
            raise ValidationError(field, f"{text!r} needs exactly one of <=, >=", OPERATORS)
        split = ops[0]
        left = _linear_terms(tokens[:split], text, field)
        right = _linear_terms(tokens[split + 1 :], text, field)
        coefs: dict[str, float] = {}
        const = 0.0
        for sign, terms in ((1.0, left), (-1.0, right)):
            for name, coef in terms:
                if name is None:
                    const += sign * coef
                else:
                    coefs[name] = coefs.get(name, 0.0) + sign * coef
        if tokens[split][1] == ">=":
            coefs = {k: -v for k, v in coefs.items()}
            const = -const
        coefs = {k: v for k, v in coefs.items() if v != 0.0}
        if not coefs:
            raise ValidationError(field, f"{text!r} names no knob with a non-zero coefficient")
        for name in coefs:
            _check_linear_knob(space, name, text, field)
        return cls(tuple(coefs.items()), -const, text)

    def value(self, config: dict[str, Any]) -> float:
        return sum(coef * float(config[name]) for name, coef in self.terms)

    def satisfied(self, config: dict[str, Any], tol: float = 1e-9) -> bool:
        scale = max(1.0, abs(self.bound))
        return self.value(config) <= self.bound + tol * scale

    def __str__(self) -> str:
        if self.text:
            return self.text
        terms = " + ".join(f"{_number(c)}*{n}" for n, c in self.terms)
        return f"{terms} <= {_number(self.bound)}"


def _number(value: float) -> str:
    """The shortest text that parses back to exactly ``value``."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def _significant(value: float, digits: int) -> float:
    """``value`` rounded to ``digits`` significant digits (10853.986 to 5: 10854.0)."""
    if value == 0:
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


#: What a constraint is made of, for the errors that find something else.
_SYNTAX = (
    "names, numbers, + - * and one comparison, <= or >= (not <, > or =); "
    "e.g. 'p95_ms <= 20', 'tps >= 0.95 * default', 'a + 2*b <= 10'"
)


def _tokenize(text: str, field: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    stripped = text.rstrip()
    while pos < len(stripped):
        match = _TOKEN.match(stripped, pos)
        if not match:
            raise ValidationError(
                field,
                f"cannot parse {text!r} at position {pos}: unexpected {stripped[pos : pos + 10]!r}",
                _SYNTAX,
            )
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    if not tokens:
        raise ValidationError(field, "is empty")
    return tokens


def _split_hyphens(tokens: list[tuple[str, str]], space: SearchSpace) -> list[tuple[str, str]]:
    """Read ``a-b`` as ``a - b`` when ``a-b`` is not a knob but its parts are knobs or numbers."""
    out: list[tuple[str, str]] = []
    for kind, value in tokens:
        parts = value.split("-")
        if (
            kind != "name"
            or value in space
            or len(parts) < 2
            or not all(p in space or is_number(p) for p in parts)
        ):
            out.append((kind, value))
            continue
        for i, part in enumerate(parts):
            if i:
                out.append(("sym", "-"))
            out.append(("num" if is_number(part) else "name", part))
    return out


def is_number(text: str) -> bool:
    """Whether ``text`` parses as a float."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _linear_terms(
    tokens: list[tuple[str, str]], text: str, field: str
) -> list[tuple[str | None, float]]:
    """Parse ``[+|-] [num *] name | num`` terms joined by + and -."""
    terms: list[tuple[str | None, float]] = []
    i = 0
    expect_term = True
    sign = 1.0
    if not tokens:
        raise ValidationError(field, f"{text!r} has an empty side")
    while i < len(tokens):
        kind, value = tokens[i]
        if expect_term and kind == "sym" and value in "+-":
            sign = sign * (-1.0 if value == "-" else 1.0)
            i += 1
            continue
        if not expect_term:
            if kind != "sym" or value not in "+-":
                raise ValidationError(
                    field, f"cannot parse {text!r}: expected + or - before {value!r}"
                )
            sign = -1.0 if value == "-" else 1.0
            expect_term = True
            i += 1
            continue
        if kind == "num":
            coef = float(value)
            if (
                i + 2 < len(tokens) + 0
                and tokens[i + 1] == ("sym", "*")
                and tokens[i + 2][0] == "name"
            ):
                terms.append((tokens[i + 2][1], sign * coef))
                i += 3
            else:
                terms.append((None, sign * coef))
                i += 1
        elif kind == "name":
            if i + 2 < len(tokens) and tokens[i + 1] == ("sym", "*") and tokens[i + 2][0] == "num":
                terms.append((value, sign * float(tokens[i + 2][1])))
                i += 3
            else:
                terms.append((value, sign))
                i += 1
        else:
            raise ValidationError(field, f"cannot parse {text!r}: unexpected {value!r}", _SYNTAX)
        expect_term = False
        sign = 1.0
    if expect_term:
        raise ValidationError(field, f"cannot parse {text!r}: ends with an operator")
    return terms


def _check_linear_knob(space: SearchSpace, name: str, text: str, field: str) -> None:
    if name not in space:
        raise ValidationError(field, f"{text!r} names unknown knob {name!r}", space.names)
    knob = space[name]
    if not isinstance(knob, FloatKnob | IntKnob) or knob.log:
        allowed = [k.name for k in space.knobs if isinstance(k, FloatKnob | IntKnob) and not k.log]
        raise ValidationError(
            field,
            f"{text!r} uses {knob.kind}{' log-scaled' if getattr(knob, 'log', False) else ''} "
            f"knob {name!r}; linear constraints need linear-scale float or int knobs",
            allowed or "no knob of this space",
        )
