"""LlamaTune's search-space reduction: a HeSBO random embedding with special-value biasing
and bucketization (Kanellis et al., "LlamaTune: Sample-Efficient DBMS Configuration Tuning",
PVLDB 15(11), 2022; HeSBO: Nayebi, Munteanu, Poloczek, ICML 2019).

The optimizer searches the low-dimensional box ``[-1, 1]^d``. A point ``z`` becomes a
configuration in three steps:

1. **Bucketization.** Each coordinate is snapped to one of ``buckets`` evenly spaced values,
   so no knob takes more than ``buckets`` distinct values (LlamaTune: 10,000). A knob with
   2^31 integer values is otherwise searched with meaningless precision.
2. **Count-sketch projection.** Knob ``i`` reads one coordinate ``h(i)`` with a sign
   ``s(i)``: ``x_i = s(i) * z[h(i)]``, mapped from ``[-1, 1]`` to the knob's unit interval.
   Unlike REMBO, every projected point lies inside the box; nothing is clipped.
   ``h`` is a *balanced* random hash (a random permutation dealt round-robin), so every
   coordinate drives ``floor(D/d)`` or ``ceil(D/d)`` knobs and none is wasted; HeSBO's
   independent ``h(i)`` leaves a coordinate empty with probability ``(1 - 1/d)^D``, which
   matters for the small spaces a study may also reduce.
3. **Special-value biasing.** A numeric knob with special values (``0`` = "off", ``-1`` =
   "auto" or "use another setting") gives each of them a share ``special_bias`` of its axis,
   taken from the low end; the rest of the axis spans the knob's range as usual. Without it,
   ``-1`` in ``[-1, 1048576]`` would practically never be tried. Choice knobs (categorical,
   ordinal, bool) split their axis into equal parts, one per choice, by truncation, as in
   LlamaTune (rounding would halve the share of the first and last choice).

**Levels.** ``HeSBOEmbedding(space, settings, level)`` at level ``k > 0`` splits coordinates
of level ``k - 1`` in two (the largest first; each keeps a random half of its knobs and gives
the rest to a new coordinate), doubling the dimension up to the number of knobs. A new
coordinate starts as a copy of the one it was split from, so ``lift`` maps any point of an
earlier level to a point of this one with the same projection.

The map is deterministic given the seed, which is stored with the study: a restarted server
rebuilds the same embedding, and each trial stores its (bucketized) low-dimensional point, so
the model is refitted on exactly the points it suggested.

``inverse`` maps a configuration back to a low-dimensional point. For a configuration that
the projection produced it recovers the point wherever a coordinate drives a knob that
resolves it (a float, or a linear integer range with at least as many values as there are
buckets), so that
``project(inverse(project(z))) == project(z)``; for others (the knobs' defaults, imported
trials) it is a least-squares estimate: the mean over the coordinate's knobs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.encoding import _decode_value, _encode_value
from tuner.space import Config, FloatKnob, IntKnob, Knob, SearchSpace, _ChoiceKnob, value_key
from tuner.study import EmbeddingSettings

LOW_NAME = "z{}"


@dataclass(frozen=True)
class _Row:
    """How one knob reads the low-dimensional point."""

    knob: Knob
    dim: int
    sign: float
    specials: tuple[float | int, ...]  # numeric knobs' special values, biased


class HeSBOEmbedding:
    """The projection of a study's knobs onto a ``dims``-dimensional box (see module doc)."""

    def __init__(self, space: SearchSpace, settings: EmbeddingSettings, level: int = 0) -> None:
        if settings.dims is None or settings.seed is None:
            raise ValueError("settings must be resolved by StudySpec (dims and seed set)")
        self.space = space
        self.settings = settings
        self.sizes = level_sizes(settings.dims, len(space))
        if not 0 <= level < len(self.sizes):
            raise ValueError(f"level must be in [0, {len(self.sizes) - 1}], got {level}")
        self.level = level
        self.d = self.sizes[level]
        rng = random.Random(f"hesbo:{settings.seed}:{len(space)}:{settings.dims}")
        order = list(range(len(space)))
        rng.shuffle(order)
        dim_of = [0] * len(space)
        for position, i in enumerate(order):
            dim_of[i] = position % settings.dims
        signs = [rng.choice((-1.0, 1.0)) for _ in space.knobs]
        self.parents: tuple[tuple[int, ...], ...] = tuple(
            _split(dim_of, self.sizes[k - 1], self.sizes[k], f"{settings.seed}:{len(space)}:{k}")
            for k in range(1, level + 1)
        )
        rows = []
        for i, knob in enumerate(space.knobs):
            specials: tuple[float | int, ...] = ()
            if isinstance(knob, FloatKnob | IntKnob):
                specials = tuple(sorted(float(v) if isinstance(knob, FloatKnob) else int(v)
                                        for v in knob.special_values))  # fmt: skip
            rows.append(_Row(knob, dim_of[i], signs[i], specials))
        self.rows = tuple(rows)
        self.low_names = tuple(LOW_NAME.format(j) for j in range(self.d))

    def lift(self, point: Sequence[float]) -> tuple[float, ...]:
        """A point of an earlier level, as the point of this level with the same projection.

        Splitting coordinate ``j`` gives the new coordinate the value of ``j``, so every knob
        reads what it read before: a point measured at any earlier level is a point of this
        embedding, exactly.
        """
        z = list(point)
        if len(z) not in self.sizes[: self.level + 1]:
            raise ValueError(
                f"a point of {len(z)} coordinates belongs to no level up to {self.level} "
                f"(sizes {list(self.sizes[: self.level + 1])})"
            )
        for k, parents in enumerate(self.parents):
            if len(z) == self.sizes[k]:
                z += [z[j] for j in parents]
        return tuple(z)

    # -- forward ------------------------------------------------------------------------
    def bucketize(self, z: Sequence[float]) -> tuple[float, ...]:
        """``z`` clipped to ``[-1, 1]`` and snapped to the bucket grid of each coordinate."""
        if len(z) != self.d:
            raise ValueError(f"expected {self.d} coordinates, got {len(z)}")
        steps = self.settings.buckets - 1
        out = []
        for value in z:
            u = (min(1.0, max(-1.0, float(value))) + 1.0) / 2.0
            out.append(2.0 * round(u * steps) / steps - 1.0)
        return tuple(out)

    def levels(self, z: Sequence[float]) -> tuple[int, ...]:
        """The bucket index ``0 .. buckets - 1`` of each coordinate of ``z``."""
        steps = self.settings.buckets - 1
        return tuple(round((min(1.0, max(-1.0, float(v))) + 1.0) / 2.0 * steps) for v in z)

    def point(self, levels: Sequence[int]) -> tuple[float, ...]:
        """The low-dimensional point of bucket indexes ``levels`` (inverse of ``levels``)."""
        steps = self.settings.buckets - 1
        return tuple(2.0 * int(i) / steps - 1.0 for i in levels)

    def project(self, z: Sequence[float]) -> Config:
        """The configuration of low-dimensional point ``z`` (bucketized first)."""
        zq = self.bucketize(z)
        return {row.knob.name: self._value(row, (row.sign * zq[row.dim] + 1.0) / 2.0)
                for row in self.rows}  # fmt: skip

    def axis_table(self, grid: int) -> list[tuple[int, float, list[float]]]:
        """Per knob, how ``project`` moves its unit-box coordinate (``tuner.encoding``): the
        coordinate it reads, its sign, and its encoded value at ``grid`` evenly spaced points
        of its axis ``u = (sign * z + 1) / 2`` from 0 to 1 (for a vectorized projection)."""
        out = []
        for row in self.rows:
            values = [
                _encode_value(row.knob, self._value(row, i / (grid - 1))) for i in range(grid)
            ]
            out.append((row.dim, row.sign, values))
        return out

    def _value(self, row: _Row, u: float) -> float | int | str | bool:
        u = min(1.0, max(0.0, u))
        knob = row.knob
        if isinstance(knob, _ChoiceKnob):
            n = len(knob.choices)
            return knob.choices[min(int(u * n), n - 1)]
        if row.specials:
            share = self.settings.special_bias
            band = share * len(row.specials)
            if u < band:
                return row.specials[min(int(u / share), len(row.specials) - 1)]
            u = (u - band) / (1.0 - band) if band < 1.0 else 0.0
        return _decode_value(knob, u)

    # -- inverse ------------------------------------------------------------------------
    def inverse(self, config: Config) -> tuple[float, ...]:
        """A low-dimensional point whose projection is ``config`` or close to it."""
        exact: list[list[float]] = [[] for _ in range(self.d)]
        rough: list[list[float]] = [[] for _ in range(self.d)]
        for row in self.rows:
            u, resolves = self._position(row, config[row.knob.name])
            value = row.sign * (2.0 * u - 1.0)
            (exact if resolves else rough)[row.dim].append(value)
        z = []
        for j in range(self.d):
            values = exact[j] or rough[j]
            z.append(
                _median(values) if exact[j] else (sum(values) / len(values) if values else 0.0)
            )
        return self.bucketize(z)

    def _position(self, row: _Row, value: object) -> tuple[float, bool]:
        """Where on its unit axis the knob's ``value`` sits, and whether that is exact."""
        knob = row.knob
        if isinstance(knob, _ChoiceKnob):
            n = len(knob.choices)
            return (knob.index(value) + 0.5) / n, False  # type: ignore[arg-type]
        share = self.settings.special_bias
        band = share * len(row.specials)
        key = value_key(value)  # type: ignore[arg-type]
        for k, special in enumerate(row.specials):
            if value_key(special) == key:
                return (k + 0.5) * share, False
        u = _encode_value(knob, value)
        u = band + u * (1.0 - band)
        # a float resolves any bucket; a linear integer range does when it has at least as
        # many values as there are buckets (a log-scaled one is coarse at its low end)
        resolves = isinstance(knob, FloatKnob) or (
            isinstance(knob, IntKnob) and not knob.log and knob.size >= self.settings.buckets
        )
        return u, resolves

    def describe(self) -> dict[int, list[str]]:
        """Low-dimensional coordinate -> the knobs it drives (``-name``: opposite sign)."""
        out: dict[int, list[str]] = {j: [] for j in range(self.d)}
        for row in self.rows:
            out[row.dim].append(("" if row.sign > 0 else "-") + row.knob.name)
        return out


def level_sizes(dims: int, knobs: int) -> tuple[int, ...]:
    """Coordinates per level: ``dims``, then doubled at each split, up to ``knobs``."""
    sizes = [min(dims, knobs)]
    while sizes[-1] < knobs:
        sizes.append(min(knobs, 2 * sizes[-1]))
    return tuple(sizes)


def _split(dim_of: list[int], before: int, after: int, seed: str) -> tuple[int, ...]:
    """Split ``after - before`` coordinates in two (in place on ``dim_of``); returns the
    coordinate each new coordinate ``before, before + 1, ...`` was split from.

    The largest coordinates are split first (ties in random order); a split coordinate keeps
    a random half of its knobs (rounded up) and gives the rest to the new one. With
    ``after <= knobs`` there are always enough coordinates with two knobs or more.
    """
    rng = random.Random(f"hesbo-split:{seed}")
    members: list[list[int]] = [[] for _ in range(before)]
    for i, j in enumerate(dim_of):
        members[j].append(i)
    ties = [rng.random() for _ in range(before)]
    order = sorted(range(before), key=lambda j: (-len(members[j]), ties[j]))
    parents = []
    for offset, j in enumerate(order[: after - before]):
        knobs = members[j][:]
        rng.shuffle(knobs)
        for i in knobs[: len(knobs) // 2]:
            dim_of[i] = before + offset
        parents.append(j)
    return tuple(parents)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def low_point_is_valid(point: Sequence[float], sizes: Sequence[int]) -> bool:
    """A stored low-dimensional point has as many coordinates as some level in ``sizes``,
    each finite and in ``[-1, 1]``."""
    return len(point) in sizes and all(math.isfinite(v) and -1.0 <= v <= 1.0 for v in point)
