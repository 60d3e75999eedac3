"""PGTune's rules (knobs/pgtune.py), checked against values worked out by hand from them."""

from __future__ import annotations

import pytest

from knobs.loader import load_catalog
from knobs.pgtune import GB, recommend, within
from tuner.errors import ValidationError


def test_a_16_gb_4_cpu_oltp_server_on_ssd() -> None:
    found = recommend(16 * GB, 4, "oltp", "ssd")
    assert found["max_connections"] == 300
    assert found["shared_buffers"] == 4 * GB // 8192  # RAM / 4, in 8 kB pages
    assert found["effective_cache_size"] == 12 * GB // 8192
    assert found["maintenance_work_mem"] == 1024 * 1024  # RAM / 16 in kB
    assert found["wal_buffers"] == 2048  # 3 % of 4 GB is above 16 MB: 16 MB
    assert (found["min_wal_size"], found["max_wal_size"]) == (2048, 8192)
    assert found["random_page_cost"] == 1.1 and found["effective_io_concurrency"] == 200
    assert found["max_worker_processes"] == found["max_parallel_workers"] == 4
    assert found["max_parallel_workers_per_gather"] == 2
    assert found["max_parallel_maintenance_workers"] == 2
    # (16 GB - 4 GB) / ((300 + 4) * 3) in kB
    assert found["work_mem"] == (12 * 1024 * 1024) // 912
    assert found["wal_compression"] == "lz4"


def test_small_machines_keep_the_defaults_for_parallelism_and_the_floors() -> None:
    found = recommend(1 * GB, 2, "web", "hdd")
    assert "max_worker_processes" not in found  # fewer than 4 CPUs: PostgreSQL's defaults
    assert found["work_mem"] == 4096  # the 4 MB floor
    assert found["wal_buffers"] == (1024 * 1024 // 4) * 3 // 100 // 8
    assert found["random_page_cost"] == 4.0 and found["effective_io_concurrency"] == 2


def test_a_data_warehouse_gets_more_maintenance_memory_and_statistics() -> None:
    found = recommend(256 * GB, 32, "dw", "nvme")
    assert found["maintenance_work_mem"] == 8 * 1024 * 1024  # RAM / 8, capped at 8 GB
    assert found["default_statistics_target"] == 500
    assert found["max_parallel_workers_per_gather"] == 16  # not capped at 4 for DW


def test_within_clamps_to_the_catalog_and_names_what_it_changed() -> None:
    config, notes = within(recommend(16 * GB, 4), load_catalog("postgres"))
    assert config["min_wal_size"] == 256  # the catalog's range ends at 256 MB
    assert any(n.startswith("min_wal_size = 2048 clamped to 256") for n in notes)
    assert config["shared_buffers"] == 524288 and config["wal_compression"] == "lz4"


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValidationError, match="db_type"):
        recommend(GB, 4, "batch")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="disk"):
        recommend(GB, 4, "oltp", "tape")  # type: ignore[arg-type]
