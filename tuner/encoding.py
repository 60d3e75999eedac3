"""Unit-box encoding: configurations <-> points of ``[0, 1]^d``, one dimension per knob.

The BO core only ever sees the unit box. Each knob becomes one coordinate:

* float knobs: affine map of ``[low, high]`` (or of ``[log low, log high]`` when log-scaled);
  continuous;
* int knobs with at most ``MAX_LISTED_LEVELS`` values: *discrete*, the allowed coordinates are
  listed so the acquisition optimizer steps between integers; larger int ranges are
  continuous and rounded to the nearest integer on decoding (log-scaled ones in log space);
* ordinal knobs and bools: *discrete*, level ``i`` of ``n`` at ``i / (n - 1)``;
* categorical knobs: *categorical*, choice ``i`` at ``i / (n - 1)``; the model compares these
  coordinates only for equality, so their order carries no meaning.

``decode(encode(c)) == c`` for every valid configuration ``c`` (float values up to the last
bits of rounding; bounds exactly); ``snap`` maps any point of the box onto the nearest
representable configuration.

The acquisition optimizer handles thousands of points per round, so ``snap`` and
``point_keys`` work on whole tensors: a knob's coordinate is snapped column-wise with tensor
operations that repeat ``decode``/``encode``'s float operations one for one (the same IEEE
operations in the same order, so the results are equal to the last bit). Log-scaled knobs
and integer ranges beyond 2**53 go through ``decode``/``encode`` value by value, because
torch's ``exp``/``log`` need not round as the C library's do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tuner.config_key import KEY_GRID as _KEY_GRID
from tuner.config_key import ConfigKey, config_key
from tuner.config_key import unit_value as _encode_value
from tuner.space import (
    CategoricalKnob,
    Config,
    FloatKnob,
    IntKnob,
    Knob,
    SearchSpace,
    _ChoiceKnob,
    value_key,
)

MAX_LISTED_LEVELS = 64
CONTINUOUS, DISCRETE, CATEGORICAL = "continuous", "discrete", "categorical"
#: The same identity computed from a point of the box (see ``UnitBoxEncoder.point_keys``).
PointKey = bytes
# How a coordinate is snapped and keyed with tensor operations (``_Columns``)
_LEVEL, _LINEAR_INT, _LINEAR_FLOAT, _BY_VALUE = 0, 1, 2, 3
_EXACT_INT = 2**53  # integers up to this size are exact in float64


@dataclass(frozen=True)
class Dim:
    """How one knob is laid out on its unit-box coordinate."""

    knob: Knob
    layout: str
    levels: tuple[float, ...] = ()  # allowed coordinates of discrete/categorical dims


class UnitBoxEncoder:
    """Encodes configurations of ``space`` as ``d``-vectors in ``[0, 1]^d`` (``d = len(space)``)."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.dims = tuple(_layout(k) for k in space.knobs)
        self._columns = _Columns(self.dims)

    @property
    def d(self) -> int:
        return len(self.dims)

    @property
    def discrete_dims(self) -> dict[int, list[float]]:
        return {i: list(dim.levels) for i, dim in enumerate(self.dims) if dim.layout == DISCRETE}

    @property
    def cat_dims(self) -> dict[int, list[float]]:
        return {i: list(dim.levels) for i, dim in enumerate(self.dims) if dim.layout == CATEGORICAL}

    def encode(self, config: Config) -> list[float]:
        """Configuration -> list of ``d`` coordinates in ``[0, 1]``."""
        return [_encode_value(dim.knob, config[dim.knob.name]) for dim in self.dims]

    def encode_many(self, configs: Sequence[Config]) -> torch.Tensor:
        """``n`` configurations -> ``n x d`` float64 tensor."""
        rows = [self.encode(c) for c in configs]
        return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), self.d)

    def decode(self, point: Sequence[float]) -> Config:
        """A point of the box (clipped into it) -> the nearest valid configuration."""
        if len(point) != self.d:
            raise ValueError(f"expected {self.d} coordinates, got {len(point)}")
        return {
            dim.knob.name: _decode_value(dim.knob, min(1.0, max(0.0, float(u))))
            for dim, u in zip(self.dims, point, strict=True)
        }

    def snap(self, points: torch.Tensor) -> torch.Tensor:
        """``n x d`` points -> the encodings of their decoded configurations (``n x d``):
        ``encode(decode(row))`` for each row, computed column-wise."""
        return self.snap_columns(points, torch.arange(self.d))

    def snap_columns(self, values: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """Snap ``... x k`` coordinates, column ``j`` holding coordinates of knob ``columns[j]``.

        Each entry becomes ``encode(decode(.))`` of the knob's coordinate, equal to the last
        bit to what ``snap`` of a whole point gives in that knob's coordinate.
        """
        return self._columns.snap(values, columns)

    def point_keys(self, points: torch.Tensor) -> list[PointKey]:
        """The identity of each row of ``n x d`` points, without decoding them.

        Two rows get the same ``PointKey`` exactly when ``key(decode(row))`` is the same, and
        ``point_key(key(config))`` is the ``PointKey`` of every row that decodes to a
        configuration with that key (so taken configurations can be looked up by key).
        """
        return code_keys(self.key_codes(points, torch.arange(self.d)))

    def key_codes(self, values: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """Codes of ``... x k`` coordinates (column ``j`` of knob ``columns[j]``): float64
        numbers in one-to-one correspondence with the knob's part of ``key(decode(.))`` (a
        choice knob's level index, an int knob's value, a float knob's key). ``code_keys``
        of a full row of codes is its ``PointKey``."""
        return self._columns.codes(values, columns)

    def point_key(self, key: ConfigKey) -> PointKey | None:
        """The ``PointKey`` of configurations with ``key``; None when no point of the box
        decodes to such a configuration (a value outside the space)."""
        return self._columns.code_of(key)

    def key(self, config: Config) -> ConfigKey:
        """A hashable identity of a configuration, used to detect duplicates
        (``tuner.config_key.config_key``): discrete values compare exactly; float knobs
        compare on a grid of 1e-9 of their (possibly log-scaled) range, so values that
        differ only by rounding noise coincide."""
        return config_key(self.space, config)


class _Columns:
    """Column-wise snapping and keys: ``decode``/``encode`` of one coordinate, as tensors.

    Every formula mirrors ``_decode_value``/``_encode_value`` operation by operation
    (``torch.where`` for Python's ``min``/``max``, ``torch.round`` for ``round``: both round
    half to even), so results equal theirs to the last bit; knobs where that cannot hold
    (log scale, integers beyond 2**53) go value by value through the Python functions.
    """

    def __init__(self, dims: tuple[Dim, ...]) -> None:
        self.knobs = [dim.knob for dim in dims]
        kinds, low, high, span, steps = [], [], [], [], []
        self.choice_index: list[dict[object, int]] = []
        for knob in self.knobs:
            kind, lo, hi, width, n = _BY_VALUE, 0.0, 1.0, 1.0, 1.0
            if isinstance(knob, _ChoiceKnob):
                kind, n = _LEVEL, float(len(knob.choices) - 1)
            elif isinstance(knob, FloatKnob) and not knob.log:
                kind, lo, hi, width = _LINEAR_FLOAT, knob.low, knob.high, knob.high - knob.low
            elif isinstance(knob, IntKnob) and not knob.log and _exact(knob):
                kind, lo, hi = _LINEAR_INT, float(knob.low), float(knob.high)
                width = float(knob.high - knob.low)
            kinds.append(kind)
            low.append(lo)
            high.append(hi)
            span.append(width)
            steps.append(n)
            choices = knob.choices if isinstance(knob, _ChoiceKnob) else ()
            self.choice_index.append({value_key(c): i for i, c in enumerate(choices)})
        self.kind = torch.tensor(kinds)
        self.low = torch.tensor(low, dtype=torch.float64)
        self.high = torch.tensor(high, dtype=torch.float64)
        self.span = torch.tensor(span, dtype=torch.float64)
        self.steps = torch.tensor(steps, dtype=torch.float64)

    def snap(self, values: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        shape = values.shape
        u, kind, low, span, high, steps = self._prepare(values.reshape(-1, shape[-1]), columns)
        level = torch.round(u * steps) / steps
        integer = (_clip(torch.round(low + u * span), low, high) - low) / span
        real = (self._real(u, low, span, high) - low) / span
        out = torch.where(kind == _LEVEL, level, torch.where(kind == _LINEAR_INT, integer, real))
        for j in (kind == _BY_VALUE).nonzero().flatten().tolist():
            knob = self.knobs[int(columns[j])]
            snapped = [_encode_value(knob, _decode_value(knob, x)) for x in u[:, j].tolist()]
            out[:, j] = torch.tensor(snapped, dtype=torch.float64)
        return (out + 0.0).reshape(shape)  # + 0.0: -0.0 -> 0.0, as Python's min/max give

    def codes(self, values: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        shape = values.shape
        u, kind, low, span, high, steps = self._prepare(values.reshape(-1, shape[-1]), columns)
        level = torch.round(u * steps)
        integer = _clip(torch.round(low + u * span), low, high)
        real = torch.round((self._real(u, low, span, high) - low) / span * _KEY_GRID)
        out = torch.where(kind == _LEVEL, level, torch.where(kind == _LINEAR_INT, integer, real))
        for j in (kind == _BY_VALUE).nonzero().flatten().tolist():
            knob = self.knobs[int(columns[j])]
            if isinstance(knob, FloatKnob):
                code = [
                    float(round(_encode_value(knob, _decode_value(knob, x)) * _KEY_GRID))
                    for x in u[:, j].tolist()
                ]
            else:
                code = [float(_decode_value(knob, x)) for x in u[:, j].tolist()]
            out[:, j] = torch.tensor(code, dtype=torch.float64)
        return (out + 0.0).reshape(shape)

    def code_of(self, key: ConfigKey) -> PointKey | None:
        if len(key) != len(self.knobs):
            return None
        code: list[float] = []
        for knob, part, index in zip(self.knobs, key, self.choice_index, strict=True):
            if isinstance(knob, FloatKnob):  # an int on the key grid of [0, 1]
                if not isinstance(part, int) or not 0 <= part <= _KEY_GRID:
                    return None
                code.append(float(part))
            elif isinstance(knob, IntKnob):  # ("num", float(value))
                if not (isinstance(part, tuple) and part[0] == "num"):
                    return None
                code.append(float(part[1]))
            elif part in index:
                code.append(float(index[part]))
            else:
                return None
        return (np.array(code, dtype=np.float64) + 0.0).tobytes()

    def _prepare(self, values: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Coordinates clipped as ``decode`` clips them (NaN -> 0), and the columns' knobs."""
        u = values.to(torch.float64)
        u = torch.where(u > 0.0, u, 0.0)
        u = torch.where(u < 1.0, u, 1.0)
        return (
            u,
            self.kind[columns],
            self.low[columns],
            self.span[columns],
            self.high[columns],
            self.steps[columns],
        )

    @staticmethod
    def _real(
        u: torch.Tensor, low: torch.Tensor, span: torch.Tensor, high: torch.Tensor
    ) -> torch.Tensor:
        """A linear float knob's decoded value (the bounds exactly at 0 and 1)."""
        inside = _clip(low + u * span, low, high)
        return torch.where(u == 0.0, low, torch.where(u == 1.0, high, inside))


def _clip(value: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """``min(high, max(low, value))`` as Python evaluates it."""
    value = torch.where(value > low, value, low)
    return torch.where(value < high, value, high)


def _exact(knob: IntKnob) -> bool:
    """Whether the knob's integers and range are exact in float64."""
    return max(abs(knob.low), abs(knob.high), knob.high - knob.low) < _EXACT_INT


def code_keys(codes: torch.Tensor) -> list[PointKey]:
    """The ``PointKey`` of each row of ``n x d`` codes (``UnitBoxEncoder.key_codes``)."""
    array = np.ascontiguousarray(codes.to(torch.float64).numpy())
    raw, width = array.tobytes(), array.itemsize * array.shape[-1]
    return [raw[i * width : (i + 1) * width] for i in range(array.shape[0])]


def _layout(knob: Knob) -> Dim:
    if isinstance(knob, FloatKnob):
        return Dim(knob, CONTINUOUS)
    if isinstance(knob, IntKnob):
        if knob.size <= MAX_LISTED_LEVELS:
            values = range(int(knob.low), int(knob.high) + 1)
            return Dim(knob, DISCRETE, tuple(_encode_value(knob, v) for v in values))
        return Dim(knob, CONTINUOUS)
    assert isinstance(knob, _ChoiceKnob)
    n = len(knob.choices)
    levels = tuple(i / (n - 1) for i in range(n))
    layout = CATEGORICAL if isinstance(knob, CategoricalKnob) else DISCRETE
    return Dim(knob, layout, levels)


def _decode_value(knob: Knob, u: float) -> float | int | str | bool:
    if isinstance(knob, FloatKnob):
        if u in (0.0, 1.0):  # the bounds exactly, without exp/log rounding
            return knob.high if u else knob.low
        if knob.log:
            value = math.exp(math.log(knob.low) + u * (math.log(knob.high) - math.log(knob.low)))
        else:
            value = knob.low + u * (knob.high - knob.low)
        return min(knob.high, max(knob.low, value))
    if isinstance(knob, IntKnob):
        if knob.log:
            raw = math.exp(math.log(knob.low) + u * (math.log(knob.high) - math.log(knob.low)))
            # round in log space: pick the nearer of the two neighbouring integers by ratio
            lo, hi = math.floor(raw), math.ceil(raw)
            value = (
                lo
                if lo >= 1 and math.log(raw) - math.log(lo) <= math.log(hi) - math.log(raw)
                else hi
            )
        else:
            value = round(knob.low + u * (knob.high - knob.low))
        return int(min(knob.high, max(knob.low, value)))
    assert isinstance(knob, _ChoiceKnob)
    index = round(u * (len(knob.choices) - 1))
    return knob.choices[index]
