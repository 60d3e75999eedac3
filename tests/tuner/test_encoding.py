"""Tests for tuner.encoding: the unit-box encoding of configurations."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.encoding import (
    CATEGORICAL,
    CONTINUOUS,
    DISCRETE,
    MAX_LISTED_LEVELS,
    UnitBoxEncoder,
)
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

SPACE = SearchSpace(
    (
        FloatKnob("f", low=-2.5, high=7.25),
        FloatKnob("flog", low=1e-4, high=10.0, log=True),
        IntKnob("ismall", low=-3, high=20),
        IntKnob("ilarge", low=0, high=100_000),
        IntKnob("ilog_small", low=1, high=50, log=True),
        IntKnob("ilog_large", low=1, high=2**30, log=True),
        OrdinalKnob("ord_num", choices=(512, 1024, 4096, 8192)),
        OrdinalKnob("ord_str", choices=("off", "normal", "full", "extra")),
        CategoricalKnob("cat", choices=("a", 2, 3.5, True)),
        BoolKnob("flag"),
    )
)
ENCODER = UnitBoxEncoder(SPACE)
FLOATS = {"f", "flog"}


def _value(knob: Knob) -> st.SearchStrategy[Any]:
    if isinstance(knob, FloatKnob):
        return st.floats(knob.low, knob.high, allow_nan=False, allow_infinity=False)
    if isinstance(knob, IntKnob):
        return st.integers(int(knob.low), int(knob.high))
    return st.sampled_from(knob.choices)  # type: ignore[attr-defined]


CONFIGS = st.fixed_dictionaries({k.name: _value(k) for k in SPACE.knobs})


def _same(a: Config, b: Config) -> bool:
    """Exactly equal (and of the same type) except floats, which may differ in the last bits."""
    for name in SPACE.names:
        x, y = a[name], b[name]
        if name in FLOATS:
            if not math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12):  # type: ignore[arg-type]
                return False
        elif x != y or type(x) is not type(y):
            return False
    return True


# -- layout -----------------------------------------------------------------------------


def test_layouts() -> None:
    layouts = {dim.knob.name: dim.layout for dim in ENCODER.dims}
    assert layouts == {
        "f": CONTINUOUS,
        "flog": CONTINUOUS,
        "ismall": DISCRETE,
        "ilarge": CONTINUOUS,
        "ilog_small": DISCRETE,
        "ilog_large": CONTINUOUS,
        "ord_num": DISCRETE,
        "ord_str": DISCRETE,
        "cat": CATEGORICAL,
        "flag": DISCRETE,
    }
    assert ENCODER.d == len(SPACE) == 10


def test_discrete_and_categorical_dims() -> None:
    discrete = ENCODER.discrete_dims
    assert sorted(discrete) == [2, 4, 6, 7, 9]
    assert discrete[2] == [(v + 3) / 23 for v in range(-3, 21)]
    assert discrete[4][0] == 0.0 and discrete[4][-1] == 1.0 and len(discrete[4]) == 50
    assert discrete[4][1] == pytest.approx(math.log(2) / math.log(50))
    assert discrete[6] == discrete[7] == [0.0, 1 / 3, 2 / 3, 1.0]
    assert discrete[9] == [0.0, 1.0]
    assert ENCODER.cat_dims == {8: [0.0, 1 / 3, 2 / 3, 1.0]}


def test_every_listed_level_decodes_to_a_distinct_value() -> None:
    for i, levels in {**ENCODER.discrete_dims, **ENCODER.cat_dims}.items():
        knob = ENCODER.dims[i].knob
        base = ENCODER.decode([0.5] * ENCODER.d)
        values = [ENCODER.decode(_with(base, i, u))[knob.name] for u in levels]
        assert len({repr(v) for v in values}) == len(levels), knob.name


def _with(config: Config, i: int, u: float) -> list[float]:
    point = ENCODER.encode(config)
    point[i] = u
    return point


@pytest.mark.parametrize(
    ("high", "layout"), [(MAX_LISTED_LEVELS, DISCRETE), (MAX_LISTED_LEVELS + 1, CONTINUOUS)]
)
def test_int_layout_threshold(high: int, layout: str) -> None:
    encoder = UnitBoxEncoder(SearchSpace((IntKnob("n", low=1, high=high),)))
    assert encoder.dims[0].layout == layout
    assert bool(encoder.discrete_dims) is (layout == DISCRETE)


# -- encode / decode --------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(CONFIGS)
def test_decode_encode_round_trip(config: Config) -> None:
    point = ENCODER.encode(config)
    assert len(point) == ENCODER.d
    assert all(0.0 <= u <= 1.0 for u in point)
    decoded = ENCODER.decode(point)
    assert _same(decoded, config), (config, decoded)
    assert SPACE.validate_config(decoded) == decoded


def test_round_trip_of_the_bounds_and_known_values() -> None:
    low: Config = {
        "f": -2.5,
        "flog": 1e-4,
        "ismall": -3,
        "ilarge": 0,
        "ilog_small": 1,
        "ilog_large": 1,
        "ord_num": 512,
        "ord_str": "off",
        "cat": "a",
        "flag": False,
    }
    high: Config = {
        "f": 7.25,
        "flog": 10.0,
        "ismall": 20,
        "ilarge": 100_000,
        "ilog_small": 50,
        "ilog_large": 2**30,
        "ord_num": 8192,
        "ord_str": "extra",
        "cat": True,
        "flag": True,
    }
    assert ENCODER.encode(low) == [0.0] * 10
    assert ENCODER.encode(high) == [1.0] * 10
    assert _same(ENCODER.decode([0.0] * 10), low)  # exp(log(1e-4)) is 1e-4 + 1 ulp
    assert _same(ENCODER.decode([1.0] * 10), high)


def test_encode_choice_values_by_value() -> None:
    config = {**ENCODER.decode([0.0] * 10), "ord_num": 1024.0, "cat": 2.0}
    point = ENCODER.encode(config)
    assert point[6] == pytest.approx(1 / 3) and point[8] == pytest.approx(1 / 3)
    decoded = ENCODER.decode(point)
    assert decoded["ord_num"] == 1024 and isinstance(decoded["ord_num"], int)
    assert decoded["cat"] == 2 and not isinstance(decoded["cat"], bool)


def test_int_decoding_rounds_to_the_nearest_integer() -> None:
    encoder = UnitBoxEncoder(
        SearchSpace((IntKnob("n", low=0, high=1000), IntKnob("m", low=1, high=1000, log=True)))
    )
    assert encoder.decode([0.0104, 0.0])["n"] == 10
    assert encoder.decode([0.0106, 0.0])["n"] == 11
    # in log space, 10.4 is nearer to 10 than to 11 by ratio, 10.6 nearer to 11
    u = math.log(10.4) / math.log(1000)
    assert encoder.decode([0.0, u])["m"] == 10
    u = math.log(10.6) / math.log(1000)
    assert encoder.decode([0.0, u])["m"] == 11
    decoded = encoder.decode([0.5, 0.5])
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in decoded.values())


def test_decode_clips_points_outside_the_box() -> None:
    assert ENCODER.decode([-0.5] * 10) == ENCODER.decode([0.0] * 10)
    assert ENCODER.decode([math.nan] * 10) == ENCODER.decode([0.0] * 10)
    assert ENCODER.decode([7.0] * 10) == ENCODER.decode([1.0] * 10)
    mixed = [-1.0, 2.0] * 5
    assert ENCODER.decode(mixed) == ENCODER.decode([0.0, 1.0] * 5)


def test_decode_rejects_the_wrong_number_of_coordinates() -> None:
    with pytest.raises(ValueError, match=r"expected 10 coordinates, got 3"):
        ENCODER.decode([0.5, 0.5, 0.5])


def test_encode_many_shape() -> None:
    configs = [ENCODER.decode([0.25] * 10), ENCODER.decode([0.75] * 10)]
    X = ENCODER.encode_many(configs)
    assert X.shape == (2, 10) and X.dtype == torch.float64
    assert X[1].tolist() == ENCODER.encode(configs[1])
    assert ENCODER.encode_many([]).shape == (0, 10)


# -- snap and keys ----------------------------------------------------------------------

POINTS = st.lists(
    st.lists(st.floats(-0.25, 1.25, allow_nan=False), min_size=10, max_size=10),
    min_size=1,
    max_size=5,
)


@settings(max_examples=100, deadline=None)
@given(POINTS)
def test_snap_is_idempotent_and_lands_on_configurations(rows: list[list[float]]) -> None:
    X = torch.tensor(rows, dtype=torch.float64)
    snapped = ENCODER.snap(X)
    assert snapped.shape == X.shape
    assert bool(((snapped >= 0.0) & (snapped <= 1.0)).all())
    again = ENCODER.snap(snapped)
    assert torch.allclose(again, snapped, rtol=0.0, atol=1e-12)
    for row, point in zip(rows, snapped, strict=True):
        assert ENCODER.decode(point.tolist()) == pytest.approx(ENCODER.decode(row))
        assert ENCODER.key(ENCODER.decode(point.tolist())) == ENCODER.key(ENCODER.decode(row))
    for i, levels in {**ENCODER.discrete_dims, **ENCODER.cat_dims}.items():
        for u in snapped[:, i].tolist():
            assert min(abs(u - level) for level in levels) < 1e-12


@settings(max_examples=100, deadline=None)
@given(CONFIGS, st.data())
def test_key_is_equal_for_equal_configs_and_differs_otherwise(config: Config, data: Any) -> None:
    assert ENCODER.key(config) == ENCODER.key(dict(config))
    assert ENCODER.key(config) == ENCODER.key(ENCODER.decode(ENCODER.encode(config)))
    hash(ENCODER.key(config))
    # change one knob to a clearly different value (ilog_large excluded: see the next test)
    knob = data.draw(st.sampled_from([k for k in SPACE.knobs if k.name != "ilog_large"]))
    other = data.draw(_value(knob))
    changed = {**config, knob.name: other}
    u_old = ENCODER.encode(config)[SPACE.names.index(knob.name)]
    u_new = ENCODER.encode(changed)[SPACE.names.index(knob.name)]
    if abs(u_old - u_new) > 2e-6:
        assert ENCODER.key(changed) != ENCODER.key(config)
    if knob.name not in FLOATS and other != config[knob.name]:
        assert ENCODER.key(changed) != ENCODER.key(config)


def test_key_tells_neighbouring_integers_apart() -> None:
    base = ENCODER.decode([0.5] * 10)
    for name, value in (("ismall", 4), ("ilarge", 50_000), ("ilog_small", 7)):
        assert ENCODER.key({**base, name: value}) != ENCODER.key({**base, name: value + 1})


def test_key_merges_floats_closer_than_the_grid() -> None:
    base = ENCODER.decode([0.5] * 10)
    span = 7.25 - -2.5
    near = {**base, "f": base["f"] + 1e-11 * span}  # type: ignore[operator]
    far = {**base, "f": base["f"] + 1e-7 * span}  # type: ignore[operator]
    assert ENCODER.key(near) == ENCODER.key(base)
    assert ENCODER.key(far) != ENCODER.key(base)


def test_key_keeps_true_apart_from_one() -> None:
    encoder = UnitBoxEncoder(SearchSpace((CategoricalKnob("c", choices=(1, True, "x")),)))
    assert encoder.key({"c": 1}) != encoder.key({"c": True})
    assert encoder.key({"c": 1}) == encoder.key({"c": 1.0})
