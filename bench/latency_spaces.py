"""The search spaces of the latency benchmark: a continuous box and a MySQL-shaped mixed space.

* ``box``: float knobs ``x1..xd`` on ``[0, 1]``, valued by ``bench.problems.smooth`` plus
  N(0, 0.05²) noise (the benchmark's original space; the same points for the same seed).
* ``mixed``: int, float and categorical knobs in the proportions of KnobsTuningEA's MySQL 5.7
  knob sets (``shared/benchdata/dbtune_knobsTuningEA``). The 20-knob SYSBENCH set has 3
  categorical knobs (2, 3 and 2 choices) and 17 int knobs; the 100-knob TPC-C and YCSB sets
  (``mysql197_*.res``, the same 100 knobs, whose first 20 are SYSBENCH's) have 54
  categorical knobs (44 with 2 choices, 9 with 3, 1 with 6) and 46 int knobs, 12 of them
  with at most 64 values and 34 with more (byte sizes, counts, timeouts up to 2^64).

``mixed_shape(d)`` turns those counts into a rule for any ``d``:

* categorical knobs: ``max(1, round(3 d / 20))`` up to ``d = 20`` (SYSBENCH's share), then
  ``3 + round(51 (d - 20) / 80)`` up to ``d = 100`` (the 100-knob sets' next 80 knobs), then
  ``round(0.54 d)``; the ``k``-th categorical knob (from 0) has 6 choices when ``k = 3``,
  3 when ``k % 6 = 1`` and 2 otherwise, which gives SYSBENCH's (2, 3) order and exactly
  44/9/1 at ``d = 100``;
* the other ``m = d - c`` knobs: ``round(12 m / 46)`` small int knobs (at most 64 values:
  the encoder lists their levels, so the local search steps between them), and of the rest
  a third (rounded) float knobs and the others wide int knobs (more than 64 values, which
  the encoder treats as continuous and rounds). The MySQL files store every numeric knob as
  an integer; floats are included so that each peer's float path is measured too, and to
  our encoder a wide int and a float are the same continuous coordinate.

``box+c`` and ``mixed+c`` are the same spaces and histories under one outcome constraint,
``c <= 0.45``, where ``c`` is the mean of the numeric knobs' unit coordinates plus the same
noise (about half of a uniform history is feasible, and the unconstrained minimum of
``smooth``, whose coordinates average 0.5, is not). A constrained study is what a database
study with a latency or resource bound is; it fits one more GP per step (the step found in
``41670e4`` that had refitted every GP from the priors).

So ``d = 6``: 1 categorical (2 choices), 1 small int, 1 float, 3 wide int; ``d = 16``: 2
categorical (2, 3), 4 small int, 3 float, 7 wide int; ``d = 100``: 54 categorical (44 x 2,
9 x 3, 1 x 6), 12 small int, 11 float, 23 wide int. Ranges cycle through values seen in the
MySQL sets (below), byte sizes in KiB: Optuna's ``GPSampler`` (``search_space.py``,
``np.arange``) and Ax (``adapter_utils.extract_search_space_digest``, ``list(range)``) list
every value of an int knob, which for a range of 2^30 bytes (``max_allowed_packet``,
``innodb_log_file_size``) ran both out of this machine's 23 GB; in KiB it is 2^20 values.
To our encoder either is one continuous coordinate. The value of a configuration is
``smooth`` of the numeric knobs' unit coordinates plus a share of 0.1 per categorical knob
that depends on its choice, plus the same noise; a history is ``size`` configurations drawn
uniformly and independently per knob.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.problems import smooth
from tuner.space import Config, Scalar
from tuner.study import StudySpec

KINDS = ("box", "mixed", "box+c", "mixed+c")
CONSTRAINED_SUFFIX = "+c"
CONSTRAINT_METRIC = "c"
CONSTRAINT_BOUND = 0.45  # c <= CONSTRAINT_BOUND (module doc)
NOISE_STD = 0.05
CATEGORICAL_EFFECT = 0.1
# (low, high) of the int knobs, cycled; read off the MySQL knob JSON's ranges
SMALL_INT_RANGES = ((0, 2), (0, 7), (1, 16), (0, 30), (1, 64))
# byte sizes in KiB (1 KiB .. 1 GiB): Optuna's GPSampler and Ax list every value of an int
# knob (np.arange, list(range)), 8 GiB and more for a range of 2^30 bytes (module doc)
WIDE_INT_RANGES = ((0, 99), (100, 40_000), (0, 1_000_000), (1, 1_048_576))
FLOAT_RANGES = ((0.0, 99.999), (0.0, 20.0))  # innodb_max_dirty_pages_pct, long_query_time


@dataclass(frozen=True)
class Shape:
    """Counts of each knob kind in a mixed space.

    Attributes:
        choices: Number of choices of each categorical knob, in order.
        small_int: Int knobs with at most 64 values.
        wide_int: Int knobs with more than 64 values.
        floats: Float knobs.
    """

    choices: tuple[int, ...]
    small_int: int
    wide_int: int
    floats: int

    @property
    def d(self) -> int:
        return len(self.choices) + self.small_int + self.wide_int + self.floats


def mixed_shape(d: int) -> Shape:
    """The mixed space's shape in ``d`` knobs (module doc)."""
    if d < 1:
        raise ValueError(f"d must be at least 1, got {d}")
    if d <= 20:  # at least one: the space is mixed
        categorical = max(1, _round(3 * d / 20))
    elif d <= 100:
        categorical = 3 + _round(51 * (d - 20) / 80)
    else:
        categorical = _round(0.54 * d)
    choices = tuple(6 if k == 3 else 3 if k % 6 == 1 else 2 for k in range(categorical))
    numeric = d - categorical
    small = _round(12 * numeric / 46)
    floats = _round((numeric - small) / 3)
    return Shape(choices, small, numeric - small - floats, floats)


def base_kind(kind: str) -> str:
    """The space of ``kind`` without its constraint (``box+c`` -> ``box``)."""
    if kind not in KINDS:
        raise ValueError(f"space kind must be one of {KINDS}, got {kind!r}")
    return kind.removesuffix(CONSTRAINED_SUFFIX)


def constrained(kind: str) -> bool:
    """Whether a ``kind`` study has the outcome constraint ``c <= CONSTRAINT_BOUND``."""
    return base_kind(kind) != kind


def knobs(kind: str, d: int) -> list[dict[str, Any]]:
    """Knob dictionaries (``tuner.space.knob_from_dict`` form) of a ``kind`` space of ``d``."""
    kind = base_kind(kind)
    if kind == "box":
        return [{"name": f"x{i + 1}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(d)]
    shape = mixed_shape(d)
    out: list[dict[str, Any]] = []
    for i in range(shape.floats):
        low, high = FLOAT_RANGES[i % len(FLOAT_RANGES)]
        out.append({"name": f"float{i + 1}", "kind": "float", "low": low, "high": high})
    for i in range(shape.wide_int):
        low, high = WIDE_INT_RANGES[i % len(WIDE_INT_RANGES)]
        out.append({"name": f"wide{i + 1}", "kind": "int", "low": low, "high": high})
    for i in range(shape.small_int):
        low, high = SMALL_INT_RANGES[i % len(SMALL_INT_RANGES)]
        out.append({"name": f"int{i + 1}", "kind": "int", "low": low, "high": high})
    for i, n in enumerate(shape.choices):
        choices = [f"v{j}" for j in range(n)]
        out.append({"name": f"cat{i + 1}", "kind": "categorical", "choices": choices})
    return out


def spec(kind: str, d: int, seed: int = 0) -> StudySpec:
    """The space as a study minimizing ``f`` with the product's designer defaults (under
    ``c <= CONSTRAINT_BOUND`` for a constrained kind)."""
    study: dict[str, Any] = {
        "name": f"latency-{kind.replace('+', '-')}-d{d}",
        "knobs": knobs(kind, d),
        "objectives": [{"name": "f", "goal": "minimize"}],
        "designer": {"algorithm": "bo", "seed": seed},
    }
    if constrained(kind):
        study["outcome_constraints"] = [f"{CONSTRAINT_METRIC} <= {CONSTRAINT_BOUND}"]
    return StudySpec.from_dict(study)


def history(kind: str, d: int, size: int, seed: int) -> tuple[list[Config], list[float]]:
    """``size`` seeded configurations and their noisy values of ``f`` (module doc); the same
    for a kind with and without the constraint."""
    kind = base_kind(kind)
    if kind == "box":  # as the benchmark always drew them: one ``size x d`` matrix
        rng = np.random.default_rng([seed, d])
        X = rng.random((size, d))
        y = [smooth(x) + NOISE_STD * float(rng.standard_normal()) for x in X]
        return [{f"x{j + 1}": float(v) for j, v in enumerate(x)} for x in X], y
    space = knobs(kind, d)
    rng = np.random.default_rng([seed, d, 1])
    configs = [{k["name"]: _draw(rng, k) for k in space} for _ in range(size)]
    values = [value(space, c) + NOISE_STD * float(rng.standard_normal()) for c in configs]
    return configs, values


def constraint_values(kind: str, d: int, configs: list[Config], seed: int) -> list[float]:
    """The noisy constraint metric ``c`` of ``configs`` (module doc), seeded apart from
    ``history``'s draws so that ``f`` is the same with and without the constraint."""
    space = knobs(kind, d)
    rng = np.random.default_rng([seed, d, 2])
    out = []
    for config in configs:
        unit = [
            (float(config[k["name"]]) - k["low"]) / (k["high"] - k["low"])
            for k in space
            if k["kind"] != "categorical"
        ]
        out.append(float(np.mean(unit)) + NOISE_STD * float(rng.standard_normal()))
    return out


def value(space: list[dict[str, Any]], config: Config) -> float:
    """The noiseless value of a mixed-space configuration."""
    unit, total = [], 0.0
    for k, knob in enumerate(space):
        v = config[knob["name"]]
        if knob["kind"] == "categorical":
            n = len(knob["choices"])
            total += CATEGORICAL_EFFECT * ((knob["choices"].index(v) + k) % n) / (n - 1)
        else:
            unit.append((float(v) - knob["low"]) / (knob["high"] - knob["low"]))
    return total + (smooth(unit) if unit else 0.0)


def describe(kind: str, d: int) -> str:
    """A short description of the space, for tables."""
    bound = f", c <= {CONSTRAINT_BOUND}" if constrained(kind) else ""
    if base_kind(kind) == "box":
        return f"{d} float{bound}"
    shape = mixed_shape(d)
    counts = {n: shape.choices.count(n) for n in sorted(set(shape.choices))}
    cats = "+".join(f"{c}x{n}" for n, c in counts.items()) or "0"
    return (
        f"{len(shape.choices)} cat ({cats} choices), {shape.small_int} small int, "
        f"{shape.wide_int} wide int, {shape.floats} float{bound}"
    )


def _draw(rng: np.random.Generator, knob: dict[str, Any]) -> Scalar:
    if knob["kind"] == "float":
        return float(knob["low"] + (knob["high"] - knob["low"]) * rng.random())
    if knob["kind"] == "int":
        return int(rng.integers(knob["low"], knob["high"], endpoint=True))
    return str(knob["choices"][int(rng.integers(len(knob["choices"])))])


def _round(x: float) -> int:
    """Round half up (Python's ``round`` rounds half to even)."""
    return math.floor(x + 0.5)
