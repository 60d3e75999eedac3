"""Tests for knobs.loader and the packaged SQLite catalog."""

from __future__ import annotations

import pytest

from knobs.loader import _parse_catalog, catalog_systems, load_catalog, select_knobs
from tuner.errors import ValidationError
from tuner.space import (
    BoolKnob,
    CategoricalKnob,
    IntKnob,
    OrdinalKnob,
    SearchSpace,
    knob_from_dict,
)

REQUIRED_SQLITE_KNOBS = {
    "journal_mode",
    "synchronous",
    "cache_size",
    "page_size",
    "mmap_size",
    "temp_store",
    "wal_autocheckpoint",
    "locking_mode",
    "cache_spill",
}


def test_sqlite_catalog_is_packaged_and_lists_the_required_knobs() -> None:
    assert "sqlite" in catalog_systems()
    names = {knob.name for knob in load_catalog("sqlite")}
    assert names >= REQUIRED_SQLITE_KNOBS


def test_every_catalog_knob_round_trips_and_has_a_valid_default() -> None:
    catalog = load_catalog("sqlite")
    for knob in catalog:
        assert knob_from_dict(knob.to_dict()) == knob
        assert knob.default is not None
        assert knob.description
    assert SearchSpace(catalog).default_config() is not None


def test_sqlite_knob_representations() -> None:
    knobs = {knob.name: knob for knob in load_catalog("sqlite")}
    journal = knobs["journal_mode"]
    assert isinstance(journal, CategoricalKnob)
    assert set(journal.choices) == {"delete", "truncate", "persist", "memory", "wal", "off"}
    assert journal.default == "delete"
    assert set(journal.unsafe_values) == {"memory", "off"}
    sync = knobs["synchronous"]
    assert isinstance(sync, OrdinalKnob)
    assert sync.choices == ("off", "normal", "full", "extra")
    assert (sync.default, sync.unsafe_values) == ("full", ("off",))
    cache = knobs["cache_size"]
    assert isinstance(cache, IntKnob) and cache.log
    assert (cache.low, cache.high, cache.default, cache.unit) == (512, 524288, 2000, "KiB")
    page = knobs["page_size"]
    assert isinstance(page, OrdinalKnob) and page.restart
    assert page.choices == tuple(2**i for i in range(9, 17))
    assert page.default == 4096


def test_knobs_with_an_off_value_keep_it_as_a_special_level() -> None:
    knobs = {knob.name: knob for knob in load_catalog("sqlite")}
    mmap = knobs["mmap_size"]
    assert isinstance(mmap, OrdinalKnob)
    assert mmap.choices[0] == 0 and mmap.special_values == (0,) and mmap.default == 0
    assert mmap.choices[-1] == 2147418112
    assert list(mmap.choices) == sorted(mmap.choices)
    checkpoint = knobs["wal_autocheckpoint"]
    assert isinstance(checkpoint, OrdinalKnob)
    assert checkpoint.choices[0] == 0 and checkpoint.special_values == (0,)
    assert checkpoint.default == 1000 and list(checkpoint.choices) == sorted(checkpoint.choices)
    assert set(knobs["temp_store"].to_dict()["choices"]) == {"default", "file", "memory"}
    assert set(knobs["locking_mode"].to_dict()["choices"]) == {"normal", "exclusive"}
    assert isinstance(knobs["cache_spill"], BoolKnob) and knobs["cache_spill"].default is True


def test_unsafe_values_disappear_from_a_safe_space() -> None:
    catalog = load_catalog("sqlite")
    safe = {knob.name: knob.safe() for knob in catalog if knob.name != "locking_mode"}
    assert "off" not in safe["journal_mode"].to_dict()["choices"]
    assert "memory" not in safe["journal_mode"].to_dict()["choices"]
    assert "off" not in safe["synchronous"].to_dict()["choices"]
    # checkpoints off: the WAL grows without bound over a deployment, unseen in a window
    checkpoint = safe["wal_autocheckpoint"]
    assert isinstance(checkpoint, OrdinalKnob)
    assert 0 not in checkpoint.choices and checkpoint.special_values == ()
    assert checkpoint.default == 1000


def test_a_choice_knob_left_with_one_safe_value_cannot_be_tuned() -> None:
    """``locking_mode = exclusive`` locks every other connection out of the database: an
    unsafe value, and without it the knob has one value left."""
    knobs = {knob.name: knob for knob in load_catalog("sqlite")}
    assert knobs["locking_mode"].unsafe_values == ("exclusive",)
    with pytest.raises(ValidationError) as info:
        knobs["locking_mode"].safe()
    assert info.value.field == "knobs.locking_mode.unsafe_values"
    assert "'normal' left" in str(info.value) and "allow_unsafe = true" in str(info.value)


def test_unknown_system_names_the_allowed_systems() -> None:
    with pytest.raises(ValidationError, match="no knob catalog for system 'oracle'") as info:
        load_catalog("oracle")
    assert info.value.field == "catalog"
    assert "sqlite" in str(info.value)


def test_select_knobs_none_means_the_whole_catalog() -> None:
    catalog = load_catalog("sqlite")
    assert select_knobs(catalog, None) == catalog


def test_select_knobs_keeps_the_order_given() -> None:
    catalog = load_catalog("sqlite")
    chosen = select_knobs(catalog, ["synchronous", "journal_mode"])
    assert [knob.name for knob in chosen] == ["synchronous", "journal_mode"]


def test_select_knobs_unknown_name_lists_the_catalog() -> None:
    catalog = load_catalog("sqlite")
    with pytest.raises(ValidationError, match="unknown knob 'shared_buffers'") as info:
        select_knobs(catalog, ["journal_mode", "shared_buffers"], field="target.knobs")
    assert info.value.field == "target.knobs[1]"
    assert "journal_mode" in str(info.value) and "cache_size" in str(info.value)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([], "needs at least one knob name"),
        (["cache_size", "cache_size"], "listed twice"),
        ("cache_size", "must be a list of knob names"),
        ([3], "unknown knob 3"),
    ],
)
def test_select_knobs_rejects_bad_lists(names: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        select_knobs(load_catalog("sqlite"), names)  # type: ignore[arg-type]
    assert info.value.field.startswith("knobs")
    assert "journal_mode" in str(info.value)


def test_malformed_catalogs_name_the_file_and_entry() -> None:
    good = {"name": "a", "kind": "bool", "default": True}
    with pytest.raises(ValidationError, match="unknown top-level key") as info:
        _parse_catalog({"knobs": [good], "extra": 1}, "catalogs/x.toml")
    assert "description" in str(info.value)
    with pytest.raises(ValidationError, match="needs at least one"):
        _parse_catalog({"knobs": []}, "catalogs/x.toml")
    with pytest.raises(ValidationError, match="duplicate knob name 'a'") as info:
        _parse_catalog({"knobs": [good, good]}, "catalogs/x.toml")
    assert info.value.field == "catalogs/x.toml: knobs[1].name"
    with pytest.raises(ValidationError, match="unknown knob kind") as info:
        _parse_catalog({"knobs": [{"name": "b", "kind": "list"}]}, "catalogs/x.toml")
    assert info.value.field == "catalogs/x.toml: knobs[0].kind"
