"""Tests for the SQLite target on real database files (tiny databases, short windows)."""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from knobs.loader import load_catalog
from targets.db.sqlite.target import PRAGMAS, SqliteTarget, _apply_pragmas
from targets.db.sqlite.workload import WorkloadMix, _Operations
from tuner.errors import ConfigRejected, StateError, ValidationError
from tuner.space import Config, IntKnob, Knob, OrdinalKnob
from tuner.trial import TrialStatus

ROOT = Path(__file__).resolve().parents[2]
SMALL: dict[str, Any] = {"db_mb": 2, "measure_s": 0.1, "warmup_s": 0.02}

# knob, value, what ``PRAGMA <knob>`` must then return on the trial connection
ROUND_TRIPS: list[tuple[str, Any, Any]] = [
    *[("journal_mode", m, m) for m in ("delete", "truncate", "persist", "memory", "wal", "off")],
    *[("synchronous", s, i) for i, s in enumerate(("off", "normal", "full", "extra"))],
    ("cache_size", 512, -512),
    ("cache_size", 2000, -2000),
    ("cache_size", 524288, -524288),
    ("page_size", 512, 512),
    ("page_size", 8192, 8192),
    ("page_size", 65536, 65536),
    ("mmap_size", 0, 0),
    ("mmap_size", 1048576, 1048576),
    ("mmap_size", 2147418112, 2147418112),
    *[("temp_store", t, i) for i, t in enumerate(("default", "file", "memory"))],
    ("wal_autocheckpoint", 0, 0),
    ("wal_autocheckpoint", 125, 125),
    ("wal_autocheckpoint", 16000, 16000),
    ("locking_mode", "normal", "normal"),
    ("locking_mode", "exclusive", "exclusive"),
    ("cache_spill", False, 0),
    ("secure_delete", "off", 0),
    ("secure_delete", "on", 1),
    ("secure_delete", "fast", 2),
]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqliteTarget]:
    with SqliteTarget(**SMALL, workdir=tmp_path_factory.mktemp("sqlite")) as started:
        yield started


def defaults(target: SqliteTarget, **changes: Any) -> Config:
    config = target.default_config()
    assert config is not None
    return {**config, **changes}


def trial_files(target: SqliteTarget) -> list[Path]:
    assert target.directory is not None
    return sorted(target.directory.glob("trial-*"))


def test_every_catalog_knob_has_a_pragma_and_round_trip_cases() -> None:
    names = {knob.name for knob in load_catalog("sqlite")}
    assert names == set(PRAGMAS)
    assert names == {name for name, _, _ in ROUND_TRIPS}


@pytest.mark.parametrize(("name", "value", "raw"), ROUND_TRIPS)
def test_knob_values_take_effect_and_read_back(
    target: SqliteTarget, name: str, value: Any, raw: Any
) -> None:
    target.apply(defaults(target, **{name: value}))
    try:
        assert target.connection is not None
        assert target.connection.execute(f"PRAGMA {name}").fetchone()[0] == raw
        assert target.current_settings()[name] == value
    finally:
        target.restore()
    assert trial_files(target) == []


def test_cache_spill_on_reads_back_as_a_threshold(target: SqliteTarget) -> None:
    target.apply(defaults(target, cache_spill=True))
    try:
        assert target.connection is not None
        assert target.connection.execute("PRAGMA cache_spill").fetchone()[0] > 0
    finally:
        target.restore()


@pytest.mark.parametrize("page_size", [1024, 4096, 32768])
def test_page_size_really_changes_the_trial_file(target: SqliteTarget, page_size: int) -> None:
    target.apply(defaults(target, page_size=page_size))
    try:
        assert target.trial_path is not None
        other = sqlite3.connect(target.trial_path)
        try:
            assert other.execute("PRAGMA page_size").fetchone()[0] == page_size
            assert other.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        finally:
            other.close()
    finally:
        target.restore()


@pytest.mark.parametrize("locking_mode", ["normal", "exclusive"])
@pytest.mark.parametrize("journal_mode", ["delete", "truncate", "persist", "memory", "wal", "off"])
def test_journal_and_locking_modes_combine_and_run(
    target: SqliteTarget, journal_mode: str, locking_mode: str
) -> None:
    config = defaults(
        target, journal_mode=journal_mode, locking_mode=locking_mode, synchronous="normal"
    )
    target.apply(config)
    try:
        metrics = target.measure()
        assert target.current_settings() == config  # still in effect after the workload
        shm = Path(f"{target.trial_path}-shm")
        # An exclusive connection enters WAL with its wal-index in heap memory.
        assert shm.exists() == (journal_mode == "wal" and locking_mode == "normal")
    finally:
        target.restore()
    assert_well_formed(target, metrics)
    assert trial_files(target) == []


def test_default_and_wal_normal_trials_complete(target: SqliteTarget) -> None:
    for config in (defaults(target), defaults(target, journal_mode="wal", synchronous="normal")):
        outcome = target.run_trial(config)
        assert outcome.status is TrialStatus.COMPLETED, outcome.reason
        assert_well_formed(target, outcome.metrics)
        assert trial_files(target) == []


def test_trials_start_from_the_same_data(target: SqliteTarget) -> None:
    counts = []
    for _ in range(2):
        target.apply(defaults(target))
        try:
            assert target.connection is not None
            counts.append(target.connection.execute("SELECT count(*) FROM items").fetchone()[0])
            target.measure()  # inserts and deletes change the count in this copy only
        finally:
            target.restore()
    assert counts[0] == counts[1] > 1000


def test_the_operation_sequence_is_deterministic(target: SqliteTarget) -> None:
    def contents_after_ops(seed: int) -> list[tuple[Any, ...]]:
        target.apply(defaults(target, synchronous="off"))
        try:
            conn = target.connection
            assert conn is not None
            rows = conn.execute("SELECT max(id) FROM items").fetchone()[0]
            ops = _Operations(conn, WorkloadMix(rows, 0.5, 0.25, seed))
            for _ in range(300):
                ops.run_one()
            return conn.execute("SELECT id, k, v, payload FROM items ORDER BY id").fetchall()
        finally:
            target.restore()

    first = contents_after_ops(1)
    assert contents_after_ops(1) == first
    assert contents_after_ops(2) != first


def test_knobs_are_resolved_for_this_host_and_build(target: SqliteTarget, tmp_path: Path) -> None:
    knobs = {knob.name: knob for knob in target.describe_knobs()}
    assert set(knobs) == set(PRAGMAS)
    ram_kib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 1024
    cache = knobs["cache_size"]
    assert isinstance(cache, IntKnob) and cache.high <= max(ram_kib // 4, 4096)
    mmap = knobs["mmap_size"]
    assert isinstance(mmap, OrdinalKnob) and 0 in mmap.choices
    fresh = sqlite3.connect(tmp_path / "fresh.db")
    try:
        for name in ("synchronous", "secure_delete", "temp_store", "cache_size"):
            raw = fresh.execute(f"PRAGMA {name}").fetchone()[0]
            assert PRAGMAS[name].decode(raw) == knobs[name].default
    finally:
        fresh.close()


def test_the_default_config_reads_back_unchanged(target: SqliteTarget) -> None:
    target.apply(defaults(target))
    try:
        assert target.current_settings() == defaults(target)
    finally:
        target.restore()


def test_a_knob_subset_leaves_the_rest_alone(tmp_path: Path) -> None:
    with SqliteTarget(**SMALL, workdir=tmp_path, knobs=["journal_mode", "synchronous"]) as t:
        assert [knob.name for knob in t.describe_knobs()] == ["journal_mode", "synchronous"]
        t.apply({"journal_mode": "wal"})
        try:
            assert t.current_settings() == {"journal_mode": "wal", "synchronous": "full"}
        finally:
            t.restore()


def test_bad_configs_name_the_knob(target: SqliteTarget) -> None:
    with pytest.raises(ValidationError, match="unknown knob for the sqlite target") as info:
        target.apply(defaults(target, fsync="always"))
    assert info.value.field == "config.fsync" and "journal_mode" in str(info.value)
    with pytest.raises(ValidationError) as info:
        target.apply(defaults(target, journal_mode="wal2"))
    assert info.value.field == "config.journal_mode" and "'wal'" in str(info.value)
    assert target.trial_path is None


def test_calls_out_of_order_are_state_errors(target: SqliteTarget) -> None:
    with pytest.raises(StateError, match="before setup"):
        SqliteTarget(**SMALL).apply({})
    with pytest.raises(StateError, match="before apply"):
        target.measure()
    target.apply(defaults(target))
    try:
        with pytest.raises(StateError, match="before restore"):
            target.apply(defaults(target))
    finally:
        target.restore()
    target.restore()  # idempotent


def test_values_sqlite_does_not_take_are_rejected(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    try:
        with pytest.raises(ConfigRejected, match=r"mmap_size: requested 1099511627776, read back"):
            _apply_pragmas(conn, {"mmap_size": 2**40})
    finally:
        conn.close()
    memory = sqlite3.connect(":memory:", isolation_level=None)
    try:
        with pytest.raises(ConfigRejected, match="requested 'wal', read back 'memory'"):
            _apply_pragmas(memory, {"journal_mode": "wal"})
    finally:
        memory.close()


class HugeMmapTarget(SqliteTarget):
    """Offers an mmap_size above the build's maximum, which SQLite silently clamps."""

    def describe_knobs(self) -> tuple[Knob, ...]:
        return tuple(
            replace(k, choices=(*k.choices, 2**40))
            if k.name == "mmap_size" and isinstance(k, OrdinalKnob)
            else k
            for k in super().describe_knobs()
        )


def test_rejected_config_is_infeasible_and_cleaned_up(tmp_path: Path) -> None:
    with HugeMmapTarget(**SMALL, workdir=tmp_path, knobs=["mmap_size"]) as t:
        outcome = t.run_trial({"mmap_size": 2**40})
        assert outcome.status is TrialStatus.INFEASIBLE
        assert "PRAGMA mmap_size: requested 1099511627776, read back 2147418112" in outcome.reason
        assert trial_files(t) == [] and t.connection is None
        assert t.run_trial({"mmap_size": 2147418112}).status is TrialStatus.COMPLETED
    assert list(tmp_path.iterdir()) == []


class DroppedTableTarget(SqliteTarget):
    """Loses its table after apply(): the workload fails for a reason outside the config."""

    def apply(self, config: Config) -> None:
        super().apply(config)
        assert self.connection is not None
        self.connection.execute("DROP TABLE items")


def test_workload_failure_is_failed_and_cleaned_up(tmp_path: Path) -> None:
    with DroppedTableTarget(**SMALL, workdir=tmp_path) as t:
        outcome = t.run_trial(defaults(t))
        assert outcome.status is TrialStatus.FAILED
        assert "no such table: items" in outcome.reason
        assert trial_files(t) == []
    assert list(tmp_path.iterdir()) == []


class CrashingTarget(SqliteTarget):
    def measure(self) -> dict[str, float]:
        super().measure()
        raise RuntimeError("crash after measuring")


def test_files_are_removed_after_success(tmp_path: Path) -> None:
    with SqliteTarget(**SMALL, workdir=tmp_path) as t:
        directory = t.directory
        assert directory is not None and directory.name.startswith("tuner-sqlite-")
        assert t.run_trial(defaults(t, journal_mode="wal")).status is TrialStatus.COMPLETED
        assert trial_files(t) == []
    assert not directory.exists() and list(tmp_path.iterdir()) == []
    t.close()  # idempotent


def test_files_are_removed_after_an_exception_in_measure(tmp_path: Path) -> None:
    target = CrashingTarget(**SMALL, workdir=tmp_path)
    with pytest.raises(RuntimeError, match="crash after measuring"), target:
        target.run_trial(defaults(target, journal_mode="wal"))
    assert target.connection is None and target.directory is None
    assert list(tmp_path.iterdir()) == []


SIGTERM_SCRIPT = """
import sys
from targets.host.signals import terminate_on_sigterm
from targets.db.sqlite.target import SqliteTarget

with terminate_on_sigterm(), SqliteTarget(
    db_mb=1, measure_s=600, warmup_s=0, workdir=sys.argv[1]
) as target:
    print(target.directory, flush=True)
    target.run_trial({**target.default_config(), "journal_mode": "wal"})
"""


def test_files_are_removed_after_sigterm(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        assert proc.stdout is not None
        directory = Path(proc.stdout.readline().strip())
        assert directory.parent == tmp_path, proc.communicate()[1]
        wait_until(lambda: bool(list(directory.glob("trial-*.db-wal"))))  # measuring
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, stderr
    assert not directory.exists()
    assert list(tmp_path.iterdir()) == []


def test_what_a_killed_session_left_is_removed_by_the_next_one(tmp_path: Path) -> None:
    """SIGKILL leaves no chance to clean up: the next session in the same directory removes
    the dead session's directory (its owner file names a process that is gone), and leaves
    a live session's alone."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        killed = procs[0]
        directories = []
        for proc in procs:
            assert proc.stdout is not None
            directory = Path(proc.stdout.readline().strip())
            assert directory.parent == tmp_path, proc.communicate()[1]
            directories.append(directory)
        wait_until(lambda: bool(list(directories[0].glob("trial-*.db-wal"))))  # measuring
        killed.kill()
        killed.communicate()
        assert directories[0].exists() and any(directories[0].iterdir())  # left behind
        with SqliteTarget(**SMALL, workdir=tmp_path) as t:
            assert t.directory is not None
            assert not directories[0].exists()
            assert directories[1].exists()  # its owner still runs
            assert sorted(tmp_path.iterdir()) == sorted([directories[1], t.directory])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert list(tmp_path.iterdir()) == [directories[1]]  # killed: left for the next session


def assert_well_formed(target: SqliteTarget, metrics: dict[str, float]) -> None:
    assert set(metrics) == set(target.describe_metrics())
    assert all(math.isfinite(v) and v > 0 for v in metrics.values()), metrics
    assert metrics["p50_ms"] <= metrics["p95_ms"] <= metrics["p99_ms"]
    assert metrics["write_tps"] < metrics["ops_per_s"]


def wait_until(condition: Callable[[], bool], limit_s: float = 120.0) -> None:
    """Poll ``condition`` (a liveness guard, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {limit_s} s")
        time.sleep(0.01)


def test_a_confirmation_round_can_lengthen_the_measured_window(tmp_path: Path) -> None:
    """``set_measurement_window`` (a confirmation's longer rounds): the next trial measures
    for the new window; bad values name the option."""
    from tuner.errors import ValidationError

    with SqliteTarget(**{**SMALL, "measure_s": 0.2, "warmup_s": 0.0}, workdir=tmp_path) as t:
        assert t.measurement_window() == (0.0, 0.2)
        t.set_measurement_window(0.1, 0.6)
        assert t.measurement_window() == (0.1, 0.6)
        started = time.monotonic()
        outcome = t.run_trial(defaults(t))
        assert outcome.metrics and time.monotonic() - started >= 0.7
        with pytest.raises(ValidationError, match="measure_s"):
            t.set_measurement_window(0.0, 0.0)
