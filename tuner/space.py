"""Knobs and search spaces: frozen, validated descriptions of what may be tuned.

A knob is one tunable setting of a system. Kinds:

* ``FloatKnob``   a real range ``[low, high]``, optionally log-scaled;
* ``IntKnob``     an integer range ``[low, high]``, optionally log-scaled;
* ``CategoricalKnob`` unordered choices (strings or numbers);
* ``BoolKnob``    on/off;
* ``OrdinalKnob`` ordered levels (e.g. page sizes, supported clock frequencies).

Every knob may carry a default, *special values* (values with a meaning of their own, such
as ``0`` = "off" or ``-1`` = "auto"; used by the LlamaTune embedding), a unit, whether a
change needs a restart, and *unsafe values* (durability or hardware risks) that a study must
opt into. Values are plain Python scalars (``float``, ``int``, ``str``, ``bool``).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from tuner.errors import ValidationError, relocate

if TYPE_CHECKING:
    from tuner.constraints import LinearConstraint

Scalar = float | int | str | bool
Config = dict[str, Scalar]

KNOB_KINDS = ("float", "int", "categorical", "bool", "ordinal")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")  # always fullmatch
# The largest space a study may have: 5x the 1,000-knob problems the benchmarks search.
MAX_KNOBS = 5_000


@dataclass(frozen=True)
class Knob:
    """Fields shared by every knob kind (use a concrete subclass).

    Attributes:
        name: The knob's name: a letter or ``_`` then up to 127 letters, digits, ``_``,
            ``.``, ``-``. Required.
        default: The system's own value, measured first; none if the system has none.
        special_values: Values with a meaning of their own (``0`` = off, ``-1`` = auto),
            which the LlamaTune embedding samples on purpose.
        unsafe_values: Values that risk durability or hardware; used only with
            ``allow_unsafe = true``.
        unit: The unit of the values, for people (``MiB``, ``ms``).
        description: What the knob does, for people.
        restart: A change needs the system restarted (the target says what that costs).
        recommended: Where guides say good values lie: ``[low, high]`` inside a range
            knob's domain, or some of a choice knob's choices; searched first with
            ``designer.expert_priors = true``.
        recommended_source: Where ``recommended`` comes from (a document, a URL).
        active_when: When the knob matters at all: a linear condition on other numeric knobs
            (the grammar of ``parameter_constraints``), such as ``"num_queues >= 5"``. A
            configuration that does not meet it leaves the knob unused: results do not
            list its value as a change, though the designer still sets it. Empty: always.
    """

    name: str
    default: Scalar | None = None
    special_values: tuple[Scalar, ...] = ()
    unsafe_values: tuple[Scalar, ...] = ()
    unit: str = ""
    description: str = ""
    restart: bool = False
    # Expert prior: where documentation or tuning guides say good values lie. For range
    # knobs ``(low, high)`` inside the domain; for choice knobs the recommended choices.
    recommended: tuple[Scalar, ...] = ()
    recommended_source: str = ""
    active_when: str = ""

    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValidationError(
                "knob.name",
                f"invalid knob name {self.name!r}",
                "a letter or '_' then up to 127 letters, digits, '_', '.', '-'",
            )
        self._check_domain()
        field_ = f"knobs.{self.name}"
        for key, limit in TEXT_LIMITS.items():
            text = getattr(self, key)
            if not isinstance(text, str):
                raise ValidationError(f"{field_}.{key}", f"must be text, got {type(text).__name__}")
            if len(text) > limit:
                raise ValidationError(
                    f"{field_}.{key}", f"is {len(text)} characters long", f"at most {limit}"
                )
        if self.default is not None:
            object.__setattr__(self, "default", self.validate(self.default, f"{field_}.default"))
        object.__setattr__(
            self, "special_values", self._validate_all(self.special_values, "special_values")
        )
        object.__setattr__(
            self, "unsafe_values", self._validate_all(self.unsafe_values, "unsafe_values")
        )
        object.__setattr__(self, "recommended", self._validate_all(self.recommended, "recommended"))
        self._check_recommended()

    def _check_recommended(self) -> None:
        field_ = f"knobs.{self.name}.recommended"
        if not self.recommended:
            if self.recommended_source:
                raise ValidationError(
                    f"knobs.{self.name}.recommended_source", "given without recommended values"
                )
            return
        if not self.recommended_source.strip():
            raise ValidationError(
                f"knobs.{self.name}.recommended_source",
                "is required with recommended values: say where the recommendation comes from",
            )
        if isinstance(self, _RangeKnob):
            low, high = (
                (float(v) for v in self.recommended) if len(self.recommended) == 2 else (1, 0)
            )
            if len(self.recommended) != 2 or low > high:
                raise ValidationError(
                    field_,
                    "must be [low, high] with low <= high inside the knob's range",
                    self.describe_domain(),
                )

    # -- to be provided by kinds -------------------------------------------------------
    def _check_domain(self) -> None:
        raise NotImplementedError

    def validate(self, value: Any, field_: str | None = None) -> Scalar:
        """Return ``value`` in canonical form, or raise ``ValidationError`` naming the knob."""
        raise NotImplementedError

    def describe_domain(self) -> str:
        """A short human description of the allowed values."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------
    @property
    def is_discrete(self) -> bool:
        return True

    def safe(self) -> Knob:
        """The same knob without its unsafe values (discrete kinds only)."""
        return self

    def to_dict(self) -> dict[str, Any]:
        """A JSON/TOML-friendly description; ``knob_from_dict`` inverts it."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        out.update(self._domain_dict())
        if self.default is not None:
            out["default"] = self.default
        for key in ("special_values", "unsafe_values", "recommended"):
            if getattr(self, key):
                out[key] = list(getattr(self, key))
        for key in ("unit", "description", "recommended_source", "active_when"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.restart:
            out["restart"] = True
        return out

    def _domain_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def _validate_all(self, values: Any, key: str) -> tuple[Scalar, ...]:
        if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
            raise ValidationError(f"knobs.{self.name}.{key}", "must be a list of values")
        return tuple(self.validate(v, f"knobs.{self.name}.{key}") for v in values)

    def _bad(self, value: Any, field_: str | None) -> ValidationError:
        return ValidationError(
            field_ or f"config.{self.name}",
            f"value {value!r} is not allowed for {self.kind} knob {self.name!r}",
            self.describe_domain(),
        )


@dataclass(frozen=True)
class _RangeKnob(Knob):
    """A ``float`` or ``int`` knob.

    Attributes:
        low: The smallest value (``kind = "float"`` or ``"int"``).
        high: The largest value.
        log: Search the range on a log scale (needs ``low > 0``); for ranges that span
            orders of magnitude, such as buffer sizes.
    """

    low: float = 0.0
    high: float = 1.0
    log: bool = False

    @property
    def is_discrete(self) -> bool:
        return False

    def _check_domain(self) -> None:
        for key in ("low", "high"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationError(
                    f"knobs.{self.name}.{key}", f"must be a number, got {value!r}"
                )
            if not math.isfinite(value):
                raise ValidationError(
                    f"knobs.{self.name}.{key}", "must be finite", "finite numbers"
                )
        if not self.low < self.high:
            raise ValidationError(
                f"knobs.{self.name}.high",
                f"high ({self.high}) must be greater than low ({self.low})",
            )
        if not math.isfinite(float(self.high) - float(self.low)):
            raise ValidationError(
                f"knobs.{self.name}.high",
                f"the range [{self.low}, {self.high}] is too wide: its width overflows a "
                "64-bit float, so no point of it can be encoded",
                "a range whose width high - low is below 1.7e308",
            )
        if self.log and self.low <= 0:
            raise ValidationError(
                f"knobs.{self.name}.low",
                f"a log-scaled knob needs low > 0, got {self.low}",
                "low > 0, or log = false",
            )

    def describe_domain(self) -> str:
        return f"[{self.low}, {self.high}]" + (" (log scale)" if self.log else "")

    def _domain_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.log:
            out["log"] = True
        return out


@dataclass(frozen=True)
class FloatKnob(_RangeKnob):
    """A real-valued knob in ``[low, high]``."""

    kind: ClassVar[str] = "float"

    def __post_init__(self) -> None:
        object.__setattr__(self, "low", _as_float(self.low, f"knobs.{self.name}.low"))
        object.__setattr__(self, "high", _as_float(self.high, f"knobs.{self.name}.high"))
        super().__post_init__()

    def validate(self, value: Any, field_: str | None = None) -> Scalar:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(value, field_)
        value = float(value)
        if not (math.isfinite(value) and self.low <= value <= self.high):
            raise self._bad(value, field_)
        return value


#: Longest text of a knob's descriptive fields (they are stored and listed with the study).
TEXT_LIMITS = {"unit": 64, "description": 4096, "recommended_source": 1024}
#: Most values of a choice knob, and the longest text of one.
MAX_CHOICES, MAX_CHOICE_TEXT = 10_000, 256

#: The integers a knob's bounds may take: those of the wire format (``sint64``).
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class IntKnob(_RangeKnob):
    """An integer knob in ``[low, high]`` (both inclusive)."""

    kind: ClassVar[str] = "int"

    def __post_init__(self) -> None:
        for key in ("low", "high"):
            value = getattr(self, key)
            if isinstance(value, float) and value.is_integer():
                object.__setattr__(self, key, int(value))
            elif isinstance(value, bool) or not isinstance(value, int):
                raise ValidationError(
                    f"knobs.{self.name}.{key}", f"must be an integer, got {value!r}"
                )
            if not INT_MIN <= getattr(self, key) <= INT_MAX:
                raise ValidationError(
                    f"knobs.{self.name}.{key}",
                    f"{getattr(self, key)} does not fit a 64-bit signed integer (the wire "
                    "format's sint64); a knob beyond it can be tuned as a float knob",
                    f"integers in [{INT_MIN}, {INT_MAX}]",
                )
        super().__post_init__()

    def validate(self, value: Any, field_: str | None = None) -> Scalar:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(value, field_)
        if not self.low <= value <= self.high:
            raise self._bad(value, field_)
        return value

    @property
    def size(self) -> int:
        return int(self.high - self.low) + 1


@dataclass(frozen=True)
class _ChoiceKnob(Knob):
    """A ``categorical``, ``ordinal`` or ``bool`` knob.

    Attributes:
        choices: The values, at least 2 (ordinal: from lowest to highest; bool: always
            ``[false, true]``, not given).
    """

    choices: tuple[Scalar, ...] = ()

    def _check_domain(self) -> None:
        choices = self.choices
        if isinstance(choices, str | bytes) or not hasattr(choices, "__iter__"):
            raise ValidationError(f"knobs.{self.name}.choices", "must be a list of values")
        choices = tuple(choices)
        if len(choices) < 2:
            raise ValidationError(
                f"knobs.{self.name}.choices", f"needs at least 2 values, got {len(choices)}"
            )
        if len(choices) > MAX_CHOICES:
            raise ValidationError(
                f"knobs.{self.name}.choices", f"got {len(choices)} values", f"at most {MAX_CHOICES}"
            )
        for value in choices:
            if not _is_scalar(value):
                raise ValidationError(
                    f"knobs.{self.name}.choices",
                    f"value {value!r} is not a string, number or bool",
                )
            if isinstance(value, str) and len(value) > MAX_CHOICE_TEXT:
                raise ValidationError(
                    f"knobs.{self.name}.choices",
                    f"a value is {len(value)} characters long",
                    f"at most {MAX_CHOICE_TEXT}",
                )
        if len(set(map(value_key, choices))) != len(choices):
            raise ValidationError(f"knobs.{self.name}.choices", "values must be distinct")
        object.__setattr__(self, "choices", choices)

    def validate(self, value: Any, field_: str | None = None) -> Scalar:
        key = value_key(value) if _is_scalar(value) else None
        for choice in self.choices:
            if value_key(choice) == key:
                return choice
        raise self._bad(value, field_)

    def index(self, value: Scalar) -> int:
        key = value_key(value)
        return next(i for i, c in enumerate(self.choices) if value_key(c) == key)

    def describe_domain(self) -> str:
        return ", ".join(repr(c) if isinstance(c, str) else str(c) for c in self.choices)

    def safe(self) -> Knob:
        if not self.unsafe_values:
            return self
        unsafe = {value_key(v) for v in self.unsafe_values}
        kept = tuple(c for c in self.choices if value_key(c) not in unsafe)
        if len(kept) < 2:
            left = f"the single value {kept[0]!r}" if kept else "no value"
            raise ValidationError(
                f"knobs.{self.name}.unsafe_values",
                f"without its unsafe values ({', '.join(map(repr, self.unsafe_values))}) the "
                f"knob {self.name!r} has {left} left and cannot be tuned",
                "leave the knob out of the study, or set allow_unsafe = true",
            )
        default = (
            self.default if self.default is None or value_key(self.default) not in unsafe else None
        )
        specials = tuple(v for v in self.special_values if value_key(v) not in unsafe)
        recommended = tuple(v for v in self.recommended if value_key(v) not in unsafe)
        return replace(
            self,
            choices=kept,
            default=default,
            special_values=specials,
            unsafe_values=(),
            recommended=recommended,
            recommended_source=self.recommended_source if recommended else "",
        )

    def _domain_dict(self) -> dict[str, Any]:
        return {"choices": list(self.choices)}


@dataclass(frozen=True)
class CategoricalKnob(_ChoiceKnob):
    """Unordered choices; the model compares them only for equality."""

    kind: ClassVar[str] = "categorical"


@dataclass(frozen=True)
class OrdinalKnob(_ChoiceKnob):
    """Ordered levels, listed from lowest to highest."""

    kind: ClassVar[str] = "ordinal"


@dataclass(frozen=True)
class BoolKnob(_ChoiceKnob):
    """An on/off knob; ``choices`` is always ``(False, True)``."""

    choices: tuple[Scalar, ...] = field(default=(False, True))
    kind: ClassVar[str] = "bool"

    def _check_domain(self) -> None:
        object.__setattr__(self, "choices", (False, True))

    def validate(self, value: Any, field_: str | None = None) -> Scalar:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false", "on", "off"):
            return value.lower() in ("true", "on")
        raise self._bad(value, field_)

    def describe_domain(self) -> str:
        return "true, false"

    def safe(self) -> Knob:
        """A bool knob with an unsafe value has one safe value left: it cannot be tuned."""
        if not self.unsafe_values:
            return self
        raise ValidationError(
            f"knobs.{self.name}.unsafe_values",
            f"without its unsafe value {self.unsafe_values[0]!r} the bool knob {self.name!r} "
            "has a single value left and cannot be tuned",
            "leave the knob out of the study, or set allow_unsafe = true",
        )

    def _domain_dict(self) -> dict[str, Any]:
        return {}


KNOB_CLASSES: dict[str, type[Knob]] = {
    "float": FloatKnob,
    "int": IntKnob,
    "categorical": CategoricalKnob,
    "bool": BoolKnob,
    "ordinal": OrdinalKnob,
}
_FIELDS_BY_KIND = {
    "float": {"low", "high", "log"},
    "int": {"low", "high", "log"},
    "categorical": {"choices"},
    "ordinal": {"choices"},
    "bool": set(),
}
_COMMON_FIELDS = {
    "name",
    "kind",
    "default",
    "special_values",
    "unsafe_values",
    "unit",
    "description",
    "restart",
    "recommended",
    "recommended_source",
    "active_when",
}


def knob_from_dict(data: Any, where: str = "knob") -> Knob:
    """Build a knob from its ``to_dict`` form (also the TOML catalog and config form)."""
    if not isinstance(data, dict):
        raise ValidationError(where, f"must be a table/object, got {type(data).__name__}")
    kind = data.get("kind")
    if kind not in KNOB_CLASSES:
        raise ValidationError(f"{where}.kind", f"unknown knob kind {kind!r}", KNOB_KINDS)
    unknown = set(data) - _COMMON_FIELDS - _FIELDS_BY_KIND[kind]
    if unknown:
        raise ValidationError(
            f"{where}.{sorted(unknown)[0]}",
            f"unknown field for a {kind} knob",
            sorted(_COMMON_FIELDS | _FIELDS_BY_KIND[kind]),
        )
    kwargs = {k: v for k, v in data.items() if k != "kind"}
    for key in ("choices", "special_values", "unsafe_values", "recommended"):
        if key in kwargs and isinstance(kwargs[key], list):
            kwargs[key] = tuple(kwargs[key])
    if "name" not in kwargs:
        raise ValidationError(f"{where}.name", "is required")
    for key, typ in (
        ("log", bool),
        ("restart", bool),
        ("unit", str),
        ("description", str),
        ("recommended_source", str),
        ("active_when", str),
    ):
        if key in kwargs and not isinstance(kwargs[key], typ):
            raise ValidationError(f"{where}.{key}", f"must be a {typ.__name__}")
    try:
        return KNOB_CLASSES[kind](**kwargs)
    except ValidationError as error:
        if error.field == "knob.name":
            # a knob without a valid name is named by its place (``spec.knobs[3].name``)
            raise ValidationError(f"{where}.name", error.message, error.allowed) from None
        if where == "knob":
            raise
        # one path for every error of a knob given in a list: its place, as in the file
        # (``study.knobs[3].high``), with its name in the message
        name = kwargs["name"]
        raise relocate(error, f"knobs.{name}", where, f"knob {name!r}") from None


@dataclass(frozen=True)
class SearchSpace:
    """An ordered set of knobs with unique names."""

    knobs: tuple[Knob, ...]

    def __post_init__(self) -> None:
        knobs = tuple(self.knobs)
        if not knobs:
            raise ValidationError("space.knobs", "needs at least one knob")
        if len(knobs) > MAX_KNOBS:
            raise ValidationError(
                "space.knobs",
                f"{len(knobs)} knobs",
                f"at most {MAX_KNOBS} (a many-knob space is searched in a LlamaTune embedding)",
            )
        seen: set[str] = set()
        for i, knob in enumerate(knobs):
            if not isinstance(knob, Knob):
                raise ValidationError(f"space.knobs[{i}]", "is not a knob")
            if knob.name in seen:
                raise ValidationError(
                    f"space.knobs[{i}].name", f"duplicate knob name {knob.name!r}"
                )
            seen.add(knob.name)
        object.__setattr__(self, "knobs", knobs)
        _ = self.conditions  # a condition that does not parse fails here

    @functools.cached_property
    def conditions(self) -> dict[str, LinearConstraint]:
        """Each conditional knob's ``active_when``, parsed against this space."""
        from tuner.constraints import LinearConstraint  # it imports this module

        found: dict[str, LinearConstraint] = {}
        for knob in self.knobs:
            if not knob.active_when:
                continue
            where = f"knobs.{knob.name}.active_when"
            if not isinstance(knob.active_when, str):
                raise ValidationError(where, f"got {knob.active_when!r}", "a string like 'n >= 5'")
            condition = LinearConstraint.parse(knob.active_when, self, where)
            if any(name == knob.name for name, _ in condition.terms):
                raise ValidationError(
                    where, f"{knob.active_when!r} names the knob itself", "other knobs"
                )
            found[knob.name] = condition
        return found

    def inactive(self, config: Mapping[str, Any]) -> frozenset[str]:
        """The knobs that do not matter in ``config``: those whose ``active_when`` it does
        not meet (a condition on a knob the configuration lacks counts as met)."""
        return frozenset(
            name
            for name, condition in self.conditions.items()
            if all(k in config for k, _ in condition.terms)
            and not condition.satisfied(dict(config))
        )

    def __len__(self) -> int:
        return len(self.knobs)

    def __getitem__(self, name: str) -> Knob:
        for knob in self.knobs:
            if knob.name == name:
                return knob
        raise ValidationError("knob", f"unknown knob {name!r}", self.names)

    def __contains__(self, name: object) -> bool:
        return any(k.name == name for k in self.knobs)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def validate_config(self, config: Any, field_: str = "config") -> Config:
        """Check a full configuration: every knob present, no extras, every value allowed."""
        if not isinstance(config, dict):
            raise ValidationError(field_, "must be a mapping of knob name to value")
        extra = set(config) - set(self.names)
        if extra:
            raise ValidationError(f"{field_}.{sorted(extra)[0]}", "unknown knob", self.names)
        out: Config = {}
        for knob in self.knobs:
            if knob.name not in config:
                raise ValidationError(f"{field_}.{knob.name}", "is missing")
            out[knob.name] = knob.validate(config[knob.name], f"{field_}.{knob.name}")
        return out

    def default_config(self) -> Config | None:
        """The knobs' defaults, or None when some knob has no default."""
        if any(k.default is None for k in self.knobs):
            return None
        return {k.name: k.default for k in self.knobs}  # type: ignore[misc]


def _as_float(value: Any, field_: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field_, f"must be a number, got {value!r}")
    return float(value)


def _is_scalar(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str | int | bool)


def value_key(value: Scalar) -> tuple[str, Any]:
    """Equality key that keeps True apart from 1 and 1 together with 1.0."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("num", float(value))
    return ("str", value)
