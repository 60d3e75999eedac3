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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tuner.space import (
    BoolKnob,
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
_KEY_GRID = 1e9  # float values closer than 1e-9 of the knob's range are the same value
#: Identity of a configuration for de-duplication (see ``UnitBoxEncoder.key``).
ConfigKey = tuple[object, ...]


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
        """``n x d`` points -> the encodings of their decoded configurations (``n x d``)."""
        return self.encode_many([self.decode(row.tolist()) for row in points])

    def key(self, config: Config) -> ConfigKey:
        """A hashable identity of a configuration, used to detect duplicates.

        Discrete values compare exactly; float knobs compare on a grid of 1e-9 of their
        (possibly log-scaled) range, so values that differ only by rounding noise coincide.
        """
        return tuple(
            round(_encode_value(dim.knob, config[dim.knob.name]) * _KEY_GRID)
            if isinstance(dim.knob, FloatKnob)
            else value_key(config[dim.knob.name])
            for dim in self.dims
        )


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


def _encode_value(knob: Knob, value: object) -> float:
    if isinstance(knob, FloatKnob | IntKnob):
        v = float(value)  # type: ignore[arg-type]
        if knob.log:
            return (math.log(v) - math.log(knob.low)) / (math.log(knob.high) - math.log(knob.low))
        return (v - knob.low) / (knob.high - knob.low)
    assert isinstance(knob, _ChoiceKnob)
    if isinstance(knob, BoolKnob):
        return 1.0 if value else 0.0
    return knob.index(value) / (len(knob.choices) - 1)  # type: ignore[arg-type]


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
