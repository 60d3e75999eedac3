"""Tests for the packaged PostgreSQL 15 knob catalog (knobs/catalogs/postgres.toml).

The expected sets below are facts measured on PostgreSQL 15.18 (pg_settings.context and unit)
and taken from LlamaTune's bias_sampling.py; see shared/reference/llamatune_db.md sections 1.4
and 2.3. They are spelled out here so that a catalog edit that drifts from them fails.
"""

from __future__ import annotations

import pytest

from knobs.loader import catalog_systems, load_catalog
from tuner.space import (
    BoolKnob,
    CategoricalKnob,
    FloatKnob,
    IntKnob,
    Knob,
    OrdinalKnob,
    SearchSpace,
    knob_from_dict,
)

RangeKnob = (IntKnob, FloatKnob)
ChoiceKnob = (CategoricalKnob, OrdinalKnob, BoolKnob)

# pg_settings.context = 'postmaster' in PostgreSQL 15 for knobs of LlamaTune's set.
PG15_POSTMASTER = {
    "autovacuum_freeze_max_age",
    "autovacuum_max_workers",
    "autovacuum_multixact_freeze_max_age",
    "data_sync_retry",
    "max_connections",
    "max_files_per_process",
    "max_locks_per_transaction",
    "max_pred_locks_per_transaction",
    "max_prepared_transactions",
    "max_worker_processes",
    "old_snapshot_threshold",
    "shared_buffers",
    "wal_buffers",
    "wal_log_hints",
}

# LlamaTune's KNOBS_WITH_SPECIAL_VALUES: knob -> special value (always the lower bound).
LLAMATUNE_SPECIALS: dict[str, float] = {
    "autovacuum_vacuum_cost_delay": -1,
    "autovacuum_vacuum_cost_limit": -1,
    "autovacuum_work_mem": -1,
    "old_snapshot_threshold": -1,
    "temp_file_limit": -1,
    "wal_buffers": -1,
    "backend_flush_after": 0,
    "bgwriter_flush_after": 0,
    "bgwriter_lru_maxpages": 0,
    "checkpoint_flush_after": 0,
    "effective_io_concurrency": 0,
    "geqo_generations": 0,
    "geqo_pool_size": 0,
    "max_parallel_workers_per_gather": 0,
    "max_prepared_transactions": 0,
    "vacuum_cost_delay": 0,
    "wal_writer_flush_after": 0,
}

# The two knobs of LlamaTune's 9.6 catalog that PostgreSQL 15 no longer has.
REMOVED_BEFORE_PG15 = {"min_parallel_relation_size", "replacement_sort_tuples"}

# pg_settings.unit as PostgreSQL 15 prints it ("" where it prints none).
ALLOWED_UNITS = {"", "8kB", "kB", "MB", "ms", "s", "min"}
PG15_UNITS = {
    "shared_buffers": "8kB",
    "effective_cache_size": "8kB",
    "temp_buffers": "8kB",
    "wal_buffers": "8kB",
    "backend_flush_after": "8kB",
    "bgwriter_flush_after": "8kB",
    "checkpoint_flush_after": "8kB",
    "wal_writer_flush_after": "8kB",
    "min_parallel_table_scan_size": "8kB",
    "min_parallel_index_scan_size": "8kB",
    "work_mem": "kB",
    "maintenance_work_mem": "kB",
    "autovacuum_work_mem": "kB",
    "logical_decoding_work_mem": "kB",
    "temp_file_limit": "kB",
    "max_stack_depth": "kB",
    "wal_skip_threshold": "kB",
    "max_wal_size": "MB",
    "min_wal_size": "MB",
    "autovacuum_vacuum_cost_delay": "ms",
    "vacuum_cost_delay": "ms",
    "bgwriter_delay": "ms",
    "deadlock_timeout": "ms",
    "wal_writer_delay": "ms",
    "autovacuum_naptime": "s",
    "checkpoint_timeout": "s",
    "old_snapshot_threshold": "min",
    "commit_delay": "",
}


@pytest.fixture(scope="module")
def catalog() -> tuple[Knob, ...]:
    return load_catalog("postgres")


@pytest.fixture(scope="module")
def knobs(catalog: tuple[Knob, ...]) -> dict[str, Knob]:
    return {knob.name: knob for knob in catalog}


def test_catalog_is_packaged_with_at_least_90_unique_knobs(catalog: tuple[Knob, ...]) -> None:
    assert "postgres" in catalog_systems()
    names = [knob.name for knob in catalog]
    assert len(names) >= 90
    assert len(set(names)) == len(names)
    assert not set(names) & REMOVED_BEFORE_PG15


def test_catalog_holds_the_restart_special_and_unit_bearing_knobs(knobs: dict[str, Knob]) -> None:
    must_have = PG15_POSTMASTER | set(LLAMATUNE_SPECIALS) | set(PG15_UNITS)
    assert must_have <= set(knobs)


def test_restart_is_set_exactly_for_postmaster_context_knobs(catalog: tuple[Knob, ...]) -> None:
    restart = {knob.name for knob in catalog if knob.restart}
    assert restart == PG15_POSTMASTER & {knob.name for knob in catalog}
    assert len(restart) == 14


def test_llamatune_special_values_are_kept_at_the_lower_bound(knobs: dict[str, Knob]) -> None:
    for name, special in LLAMATUNE_SPECIALS.items():
        knob = knobs[name]
        assert isinstance(knob, RangeKnob), name
        assert special in knob.special_values, name
        assert knob.low == special, name
        # A special value at the lower bound cannot coexist with a log scale (low > 0).
        assert not knob.log, name


def test_every_special_and_unsafe_value_lies_in_the_domain(catalog: tuple[Knob, ...]) -> None:
    for knob in catalog:
        for value in (*knob.special_values, *knob.unsafe_values):
            assert knob.validate(value) == value, knob.name
            if isinstance(knob, RangeKnob):
                assert knob.low <= float(value) <= knob.high, knob.name


def test_every_knob_has_a_valid_default_and_a_description(catalog: tuple[Knob, ...]) -> None:
    for knob in catalog:
        assert knob.default is not None, knob.name
        assert knob.validate(knob.default) == knob.default, knob.name
        assert knob.description.strip(), knob.name
        assert "\n" not in knob.description, knob.name
    assert SearchSpace(catalog).default_config() is not None


def test_defaults_are_those_of_a_fresh_pg15_cluster(knobs: dict[str, Knob]) -> None:
    # initdb writes these, or PG15 changed them from LlamaTune's 9.6/13 boot values.
    expected = {
        "shared_buffers": 16384,
        "max_connections": 100,
        "max_wal_size": 1024,
        "min_wal_size": 80,
        "max_stack_depth": 2048,
        "wal_buffers": -1,
        "checkpoint_completion_target": 0.9,
        "hash_mem_multiplier": 2.0,
        "vacuum_cost_page_miss": 2,
        "max_parallel_workers_per_gather": 2,
        "autovacuum_vacuum_cost_delay": 2.0,
        "wal_compression": "off",
        "full_page_writes": True,
    }
    assert {name: knobs[name].default for name in expected} == expected


def test_units_are_pg_settings_base_units(catalog: tuple[Knob, ...]) -> None:
    for knob in catalog:
        assert knob.unit in ALLOWED_UNITS, (knob.name, knob.unit)
    units = {knob.name: knob.unit for knob in catalog}
    assert {name: units[name] for name in PG15_UNITS} == PG15_UNITS


def test_pg15_types_are_used(knobs: dict[str, Knob]) -> None:
    for name in (
        "vacuum_cost_delay",
        "autovacuum_vacuum_cost_delay",
        "jit_above_cost",
        "jit_inline_above_cost",
        "jit_optimize_above_cost",
    ):
        assert isinstance(knobs[name], FloatKnob), name
    compression = knobs["wal_compression"]
    assert isinstance(compression, CategoricalKnob)
    assert set(compression.choices) == {"off", "pglz", "lz4", "zstd"}
    for name in ("autovacuum", "full_page_writes", "data_sync_retry", "enable_seqscan", "geqo"):
        assert isinstance(knobs[name], BoolKnob), name
    # Every on/off enum of LlamaTune's set except wal_compression (an enum of methods in PG15).
    assert sum(isinstance(knob, BoolKnob) for knob in knobs.values()) == 28


def test_ranges_stay_startable_on_a_small_host(knobs: dict[str, Knob]) -> None:
    caps = {
        "max_connections": 2000,
        "autovacuum_max_workers": 64,
        "max_worker_processes": 64,
        "max_stack_depth": 6144,
    }
    for name, cap in caps.items():
        knob = knobs[name]
        assert isinstance(knob, IntKnob)
        assert knob.high <= cap, name
    # Below two 16MB WAL segments PostgreSQL refuses to start.
    for name in ("min_wal_size", "max_wal_size"):
        knob = knobs[name]
        assert isinstance(knob, IntKnob) and knob.low >= 32, name


def test_log_scale_is_used_for_wide_multiplicative_ranges(catalog: tuple[Knob, ...]) -> None:
    by_name = {knob.name: knob for knob in catalog}
    for name in (
        "shared_buffers",
        "work_mem",
        "maintenance_work_mem",
        "effective_cache_size",
        "temp_buffers",
        "autovacuum_vacuum_threshold",
        "autovacuum_freeze_max_age",
        "vacuum_freeze_table_age",
        "cpu_operator_cost",
        "checkpoint_timeout",
    ):
        knob = by_name[name]
        assert isinstance(knob, RangeKnob) and knob.log, name
    for knob in catalog:
        if isinstance(knob, RangeKnob) and knob.log:
            assert knob.low > 0, knob.name
        if isinstance(knob, RangeKnob) and knob.low > 0 and knob.high / knob.low >= 1e4:
            assert knob.log, f"{knob.name} spans four orders of magnitude on a linear scale"


def test_durability_unsafe_values_are_marked(knobs: dict[str, Knob]) -> None:
    """Durability, and a cost that only shows over time: autovacuum off lets bloat grow."""
    assert knobs["full_page_writes"].unsafe_values == (False,)
    assert knobs["data_sync_retry"].unsafe_values == (True,)
    assert knobs["autovacuum"].unsafe_values == (False,)
    unsafe = {knob.name for knob in knobs.values() if knob.unsafe_values}
    assert unsafe == {"full_page_writes", "data_sync_retry", "autovacuum"}
    for knob in knobs.values():
        assert knob.default not in knob.unsafe_values, knob.name


def test_recommended_regions_have_sources_and_lie_inside_the_domain(
    catalog: tuple[Knob, ...],
) -> None:
    recommended = [knob for knob in catalog if knob.recommended]
    assert len(recommended) >= 8
    for knob in recommended:
        assert knob.recommended_source.strip(), knob.name
        if isinstance(knob, RangeKnob):
            low, high = (float(v) for v in knob.recommended)
            assert knob.low <= low <= high <= knob.high, knob.name
        else:
            assert isinstance(knob, ChoiceKnob)
            assert set(knob.recommended) <= set(knob.choices), knob.name
    for knob in catalog:
        if not knob.recommended:
            assert not knob.recommended_source, knob.name


def test_ram_relative_knobs_carry_no_recommended_region(knobs: dict[str, Knob]) -> None:
    for name in ("shared_buffers", "effective_cache_size", "work_mem", "maintenance_work_mem"):
        assert knobs[name].recommended == (), name


@pytest.mark.parametrize(
    ("name", "region"),
    [
        ("checkpoint_completion_target", (0.7, 0.9)),
        ("random_page_cost", (1.1, 2.0)),
        ("hash_mem_multiplier", (2.0, 8.0)),
        ("default_statistics_target", (100, 500)),
        ("wal_buffers", (128, 2048)),
    ],
)
def test_documented_priors(knobs: dict[str, Knob], name: str, region: tuple[float, float]) -> None:
    assert knobs[name].recommended == region


def test_every_knob_round_trips_through_its_dict_form(catalog: tuple[Knob, ...]) -> None:
    for knob in catalog:
        assert knob_from_dict(knob.to_dict()) == knob, knob.name
