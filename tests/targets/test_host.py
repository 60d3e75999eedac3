"""One reading of the host's memory for every target: ``MemTotal``, or the cgroup's limit."""

from __future__ import annotations

from pathlib import Path

import pytest

import targets.db.sqlite.target as sqlite_module
from targets.db.sqlite.target import SqliteTarget
from targets.host.facts import ram_bytes

GIB = 1 << 30


def _root(tmp_path: Path, meminfo_kb: int | None, v2: str | None, v1: str | None) -> Path:
    if meminfo_kb is not None:
        (tmp_path / "proc").mkdir()
        (tmp_path / "proc/meminfo").write_text(f"MemTotal:  {meminfo_kb} kB\nMemFree: 1 kB\n")
    if v2 is not None:
        (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
        (tmp_path / "sys/fs/cgroup/memory.max").write_text(v2 + "\n")
    if v1 is not None:
        (tmp_path / "sys/fs/cgroup/memory").mkdir(parents=True)
        (tmp_path / "sys/fs/cgroup/memory/memory.limit_in_bytes").write_text(v1 + "\n")
    return tmp_path


@pytest.mark.parametrize(
    ("meminfo_kb", "v2", "v1", "expected"),
    [
        (8 * GIB // 1024, None, None, 8 * GIB),
        (8 * GIB // 1024, str(2 * GIB), None, 2 * GIB),  # a container's limit
        (8 * GIB // 1024, "max", None, 8 * GIB),  # cgroup v2 without a limit
        (8 * GIB // 1024, None, "9223372036854771712", 8 * GIB),  # cgroup v1 "unlimited"
        (8 * GIB // 1024, None, str(GIB), GIB),
        (None, str(GIB), None, GIB),
        (None, None, None, None),
    ],
)
def test_ram_is_memtotal_or_the_cgroup_limit_when_lower(
    tmp_path: Path, meminfo_kb: int | None, v2: str | None, v1: str | None, expected: int | None
) -> None:
    assert ram_bytes(_root(tmp_path, meminfo_kb, v2, v1)) == expected


def test_the_sqlite_cache_is_capped_by_the_cgroup_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite target sizes ``cache_size`` (KiB) to a quarter of what ``ram_bytes`` says,
    so a container's limit counts, as it does for PostgreSQL's memory knobs."""
    monkeypatch.setattr(sqlite_module, "ram_bytes", lambda: 64 << 20)
    knobs = {k.name: k for k in SqliteTarget(db_mb=1).describe_knobs()}
    assert knobs["cache_size"].high == (64 << 20) // 4 // 1024
