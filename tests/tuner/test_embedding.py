"""The LlamaTune embedding: settings, HeSBO projection, biasing, bucketization, inverse."""

from __future__ import annotations

import random
from collections import Counter
from statistics import median
from typing import Any

import pytest

from tuner.embedding import HeSBOEmbedding
from tuner.errors import ValidationError
from tuner.study import EmbeddingSettings, StudySpec

FLOATS = [{"name": f"f{i}", "kind": "float", "low": 0.0, "high": 10.0} for i in range(6)]
MIXED = [
    *FLOATS,
    # LlamaTune's hybrid knob: -1 means "use autovacuum's own default"
    {"name": "work_mem", "kind": "int", "low": -1, "high": 1048576, "special_values": [-1]},
    {"name": "mode", "kind": "categorical", "choices": ["a", "b", "c"]},
    {"name": "flag", "kind": "bool"},
    {"name": "level", "kind": "ordinal", "choices": [1, 2, 4, 8]},
    {"name": "cache", "kind": "int", "low": 1, "high": 100000, "log": True},
    {"name": "ratio", "kind": "float", "low": 0.001, "high": 1.0, "log": True},
]


def spec(knobs: list[dict[str, Any]], **embedding: Any) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "s",
            "knobs": knobs,
            "objectives": [{"name": "y"}],
            "designer": {"seed": 5},
            "embedding": {"kind": "llamatune", **embedding},
        }
    )


def embedding_of(knobs: list[dict[str, Any]], **settings: Any) -> HeSBOEmbedding:
    study = spec(knobs, **settings)
    assert study.embedding is not None
    return HeSBOEmbedding(study.space, study.embedding)


def random_points(d: int, n: int, seed: int = 0) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.uniform(-1.0, 1.0) for _ in range(d)] for _ in range(n)]


# -- settings -------------------------------------------------------------------------------


def test_defaults_are_llamatunes_and_are_pinned_in_the_stored_spec() -> None:
    many = [{"name": f"k{i}", "kind": "float", "low": 0, "high": 1} for i in range(40)]
    study = spec(many)
    assert study.embedding == EmbeddingSettings("llamatune", 16, 0.2, 10_000, 5)
    # dims and seed are written out, so the stored spec rebuilds the same projection
    assert study.to_dict()["embedding"] == {
        "kind": "llamatune",
        "dims": 16,
        "special_bias": 0.2,
        "buckets": 10000,
        "seed": 5,
    }
    assert StudySpec.from_dict(study.to_dict()) == study


def test_default_dims_never_exceed_knobs_minus_one() -> None:
    study = spec(FLOATS)
    assert study.embedding is not None and study.embedding.dims == len(FLOATS) - 1


def test_too_many_dims_names_the_field_and_the_allowed_range() -> None:
    with pytest.raises(ValidationError) as err:
        spec(FLOATS, dims=6)
    assert err.value.field == "embedding.dims"
    assert "[1, 5]" in str(err.value)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"kind": "rembo"}, "embedding.kind"),
        ({"dims": 0}, "embedding.dims"),
        ({"special_bias": 0.5}, "embedding.special_bias"),
        ({"special_bias": -0.1}, "embedding.special_bias"),
        ({"buckets": 1}, "embedding.buckets"),
        ({"seed": -1}, "embedding.seed"),
        ({"sketch": "x"}, "embedding.sketch"),
    ],
)
def test_bad_settings_name_their_field(settings: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        spec(FLOATS, **settings)
    assert err.value.field == field


def test_an_embedding_needs_two_knobs() -> None:
    with pytest.raises(ValidationError) as err:
        spec(FLOATS[:1])
    assert err.value.field == "embedding"


def test_spec_without_embedding_keeps_its_dictionary_and_fingerprint() -> None:
    plain = StudySpec.from_dict({"name": "s", "knobs": FLOATS, "objectives": [{"name": "y"}]})
    assert "embedding" not in plain.to_dict()
    assert plain.fingerprint() != spec(FLOATS).fingerprint()


# -- projection ------------------------------------------------------------------------------


def test_every_coordinate_drives_a_balanced_share_of_the_knobs() -> None:
    many = [{"name": f"k{i}", "kind": "float", "low": 0, "high": 1} for i in range(90)]
    embedding = embedding_of(many, dims=16)
    sizes = [len(knobs) for knobs in embedding.describe().values()]
    assert sorted(set(sizes)) == [5, 6] and sum(sizes) == 90


def test_projection_is_fixed_by_the_seed() -> None:
    a, b = embedding_of(MIXED, seed=1), embedding_of(MIXED, seed=1)
    c = embedding_of(MIXED, seed=2)
    assert a.describe() == b.describe()
    z = random_points(a.d, 1)[0]
    assert a.project(z) == b.project(z)
    assert a.describe() != c.describe()


def test_projections_are_valid_configurations_and_reach_every_choice() -> None:
    embedding = embedding_of(MIXED, dims=4)
    seen: dict[str, set[Any]] = {"mode": set(), "flag": set(), "level": set()}
    for z in random_points(4, 500):
        config = embedding.project(z)
        assert embedding.space.validate_config(config) == config
        for name in seen:
            seen[name].add(config[name])
    assert seen == {"mode": {"a", "b", "c"}, "flag": {False, True}, "level": {1, 2, 4, 8}}


def test_each_choice_gets_an_equal_share_of_its_axis() -> None:
    embedding = embedding_of(MIXED, dims=4)
    counts = Counter(embedding.project(z)["mode"] for z in random_points(4, 6000, seed=3))
    for choice in ("a", "b", "c"):
        assert counts[choice] / 6000 == pytest.approx(1 / 3, abs=0.03)


def test_opposite_sign_reverses_a_knob() -> None:
    embedding = embedding_of(FLOATS, dims=2)
    lows = embedding.project([-1.0, -1.0])
    for row in embedding.rows:
        assert lows[row.knob.name] == (0.0 if row.sign > 0 else 10.0)


def test_special_values_get_their_share_and_the_rest_spans_the_range() -> None:
    embedding = embedding_of(MIXED, dims=4)
    values = [embedding.project(z)["work_mem"] for z in random_points(4, 4000, seed=1)]
    special = sum(v == -1 for v in values) / len(values)
    assert special == pytest.approx(0.2, abs=0.03)
    others = [v for v in values if v != -1]
    # mlos-core 0.6.2 collapses every non-special value to the lower bound; ours must not
    assert median(others) == pytest.approx(1048576 / 2, rel=0.1)
    assert max(others) > 0.95 * 1048576


def test_zero_bias_leaves_special_values_to_their_share_of_the_range() -> None:
    embedding = embedding_of(MIXED, dims=4, special_bias=0.0)
    values = [embedding.project(z)["work_mem"] for z in random_points(4, 2000)]
    assert sum(v == -1 for v in values) <= 2


def test_bucketization_caps_distinct_values_per_knob() -> None:
    embedding = embedding_of(FLOATS, dims=2, buckets=7)
    points = random_points(2, 500)
    distinct = {name: {embedding.project(z)[name] for z in points} for name in ("f0", "f1")}
    assert all(len(values) == 7 for values in distinct.values())
    assert embedding.bucketize([0.3333, -2.0]) == pytest.approx((1 / 3, -1.0))


# -- inverse ---------------------------------------------------------------------------------


def test_inverse_then_project_reproduces_every_projected_configuration() -> None:
    embedding = embedding_of(MIXED, dims=4)
    for z in random_points(4, 300, seed=7):
        config = embedding.project(z)
        assert embedding.project(embedding.inverse(config)) == config


def test_inverse_recovers_the_bucketized_point_where_a_float_knob_resolves_it() -> None:
    embedding = embedding_of(FLOATS, dims=3)
    for z in random_points(3, 100, seed=2):
        assert embedding.inverse(embedding.project(z)) == pytest.approx(
            embedding.bucketize(z), abs=1e-12
        )


def test_inverse_of_any_configuration_is_a_point_of_the_box() -> None:
    embedding = embedding_of(MIXED, dims=4)
    config = {**embedding.project([0.0] * 4), "work_mem": -1, "mode": "c", "cache": 3}
    point = embedding.inverse(config)
    assert len(point) == 4 and all(-1.0 <= v <= 1.0 for v in point)


# -- levels (growing the embedding) ---------------------------------------------------------

MANY = [{"name": f"k{i:02d}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(37)]


def test_levels_double_the_dimension_up_to_the_number_of_knobs() -> None:
    study = spec(MANY, dims=8)
    assert study.embedding is not None
    sizes = [HeSBOEmbedding(study.space, study.embedding, k).d for k in range(4)]
    assert sizes == [8, 16, 32, 37]
    with pytest.raises(ValueError, match="level"):
        HeSBOEmbedding(study.space, study.embedding, 4)


def test_level_zero_is_the_configured_embedding() -> None:
    study = spec(MANY, dims=8)
    assert study.embedding is not None
    plain = HeSBOEmbedding(study.space, study.embedding)
    zero = HeSBOEmbedding(study.space, study.embedding, 0)
    assert plain.rows == zero.rows and plain.describe() == zero.describe()


def test_a_split_moves_half_of_a_coordinates_knobs_and_keeps_their_signs() -> None:
    study = spec(MANY, dims=8)
    assert study.embedding is not None
    before = HeSBOEmbedding(study.space, study.embedding, 1)
    after = HeSBOEmbedding(study.space, study.embedding, 2)
    assert all(len(knobs) >= 1 for knobs in after.describe().values())  # no empty coordinate
    for row_before, row_after in zip(before.rows, after.rows, strict=True):
        assert row_after.sign == row_before.sign
        if row_after.dim < before.d:  # stayed: on the same coordinate
            assert row_after.dim == row_before.dim
        else:  # moved: to the coordinate split from its old one
            assert after.parents[-1][row_after.dim - before.d] == row_before.dim
    for new, parent in enumerate(after.parents[-1], start=before.d):
        moved = len(after.describe()[new])
        kept = len(after.describe()[parent])
        assert moved == len(before.describe()[parent]) // 2 and kept >= moved


@pytest.mark.parametrize("level", [1, 2, 3])
def test_lift_keeps_the_projection_of_every_earlier_point(level: int) -> None:
    study = spec([*MANY, *MIXED], dims=6)
    assert study.embedding is not None
    top = HeSBOEmbedding(study.space, study.embedding, level)
    for earlier in range(level + 1):
        low = HeSBOEmbedding(study.space, study.embedding, earlier)
        for z in random_points(low.d, 30, seed=earlier):
            point = low.bucketize(z)
            lifted = top.lift(point)
            assert len(lifted) == top.d
            assert top.project(lifted) == low.project(point)
    with pytest.raises(ValueError, match="no level"):
        top.lift([0.0] * (top.d - 1))


def test_levels_are_deterministic_and_depend_on_the_seed() -> None:
    a, b = spec(MANY, dims=8, seed=1), spec(MANY, dims=8, seed=1)
    c = spec(MANY, dims=8, seed=2)
    assert a.embedding and b.embedding and c.embedding
    one = HeSBOEmbedding(a.space, a.embedding, 2)
    assert one.describe() == HeSBOEmbedding(b.space, b.embedding, 2).describe()
    assert one.parents == HeSBOEmbedding(b.space, b.embedding, 2).parents
    assert one.describe() != HeSBOEmbedding(c.space, c.embedding, 2).describe()


def test_grow_after_is_validated_and_stored_only_when_not_the_default() -> None:
    assert "grow_after" not in spec(MANY).to_dict()["embedding"]
    assert spec(MANY, grow_after=0).to_dict()["embedding"]["grow_after"] == 0
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValidationError, match=r"embedding\.grow_after"):
            spec(MANY, grow_after=bad)
