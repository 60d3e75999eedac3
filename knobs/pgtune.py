"""PGTune's recommendation for a PostgreSQL server: what a user would set instead of tuning.

The rules are those of PGTune (github.com/le0pard/pgtune, the selectors of
``src/features/configuration/configurationSlice.js``, read 2026-11-28), for Linux and
PostgreSQL 15, written out here from their published description:

* ``max_connections``: given, else 200 web / 300 OLTP / 40 DW / 20 desktop / 100 mixed;
* ``shared_buffers``: RAM / 4 (desktop RAM / 16); ``effective_cache_size``: RAM * 3/4
  (desktop RAM / 4); ``maintenance_work_mem``: RAM / 16 (DW RAM / 8), at most 8 GB;
* ``min_wal_size`` / ``max_wal_size``: 1 / 4 GB web and mixed, 2 / 8 GB OLTP, 4 / 16 GB DW,
  100 MB / 2 GB desktop; ``checkpoint_completion_target`` 0.9;
* ``wal_buffers``: 3 % of ``shared_buffers``, at most 16 MB (14-16 MB rounds up to 16 MB),
  at least 32 kB; ``default_statistics_target`` 100 (DW 500);
* ``random_page_cost`` 4 on HDD, 1.1 otherwise; ``effective_io_concurrency`` HDD 2, SSD 200,
  SAN 300, NVMe 1000;
* with 4 or more CPUs: ``max_worker_processes`` and ``max_parallel_workers`` = CPUs,
  ``max_parallel_workers_per_gather`` = ceil(CPUs / 2) (at most 4 but for DW),
  ``max_parallel_maintenance_workers`` = ceil(CPUs / 2), at most 4;
* ``work_mem``: (RAM - shared_buffers) / ((max_connections + worker processes) * 3), halved
  for DW and mixed, a sixth for desktop, at least 4 MB (worker processes: the CPUs with 4
  or more, else PostgreSQL's default 8);
* ``wal_compression`` lz4 (PostgreSQL 15 and later).

``recommend`` returns those values in the units of ``knobs/catalogs/postgres.toml``
(``shared_buffers``, ``effective_cache_size`` and ``wal_buffers`` in 8 kB pages, memory in
kB, WAL sizes in MB); ``within`` fits them into a space's knobs (a value beyond a knob's
range is clamped, and named).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

from tuner.errors import ValidationError
from tuner.space import Config, Knob, Scalar

DbType = Literal["web", "oltp", "dw", "desktop", "mixed"]
Disk = Literal["hdd", "ssd", "san", "nvme"]
KB, MB, GB = 1024, 1024**2, 1024**3

_CONNECTIONS = {"web": 200, "oltp": 300, "dw": 40, "desktop": 20, "mixed": 100}
_WAL_MB = {  # (min_wal_size, max_wal_size)
    "web": (1024, 4096), "oltp": (2048, 8192), "dw": (4096, 16384),
    "desktop": (100, 2048), "mixed": (1024, 4096),
}  # fmt: skip
_IO = {"hdd": 2, "ssd": 200, "san": 300, "nvme": 1000}


def recommend(
    ram_bytes: int,
    cpus: int,
    db_type: DbType = "oltp",
    disk: Disk = "ssd",
    connections: int | None = None,
) -> dict[str, Scalar]:
    """PGTune's settings for a Linux server with ``ram_bytes`` of memory and ``cpus`` CPUs
    running PostgreSQL 15 (module doc), in the catalog's units."""
    if db_type not in _CONNECTIONS:
        raise ValidationError("db_type", f"got {db_type!r}", sorted(_CONNECTIONS))
    if disk not in _IO:
        raise ValidationError("disk", f"got {disk!r}", sorted(_IO))
    if ram_bytes <= 0 or cpus <= 0:
        raise ValidationError("ram_bytes", f"got {ram_bytes} bytes, {cpus} CPUs", "> 0")
    ram_kb = ram_bytes // KB
    max_connections = connections or _CONNECTIONS[db_type]
    shared_kb = ram_kb // 16 if db_type == "desktop" else ram_kb // 4
    cache_kb = ram_kb // 4 if db_type == "desktop" else ram_kb * 3 // 4
    maintenance_kb = min(ram_kb // 8 if db_type == "dw" else ram_kb // 16, 8 * GB // KB)
    wal_kb = shared_kb * 3 // 100
    if wal_kb > 14 * MB // KB:  # above 16 MB: capped; 14-16 MB: rounded up to 16 MB
        wal_kb = 16 * MB // KB
    wal_kb = max(wal_kb, 32)
    out: dict[str, Scalar] = {
        "max_connections": max_connections,
        "shared_buffers": shared_kb // 8,
        "effective_cache_size": cache_kb // 8,
        "maintenance_work_mem": maintenance_kb,
        "checkpoint_completion_target": 0.9,
        "wal_buffers": wal_kb // 8,
        "default_statistics_target": 500 if db_type == "dw" else 100,
        "random_page_cost": 4.0 if disk == "hdd" else 1.1,
        "effective_io_concurrency": _IO[disk],
        "min_wal_size": _WAL_MB[db_type][0],
        "max_wal_size": _WAL_MB[db_type][1],
        "wal_compression": "lz4",
    }
    workers = 8  # PostgreSQL's max_worker_processes default
    if cpus >= 4:
        gather = math.ceil(cpus / 2)
        out.update(
            max_worker_processes=cpus,
            max_parallel_workers_per_gather=gather if db_type == "dw" else min(gather, 4),
            max_parallel_workers=cpus,
            max_parallel_maintenance_workers=min(math.ceil(cpus / 2), 4),
        )
        workers = cpus
    work_kb = (ram_kb - shared_kb) / ((max_connections + workers) * 3)
    share = {"web": 1, "oltp": 1, "dw": 2, "desktop": 6, "mixed": 2}[db_type]
    out["work_mem"] = max(math.floor(work_kb / share), 4 * MB // KB)
    return out


def within(settings: dict[str, Scalar], knobs: Iterable[Knob]) -> tuple[Config, list[str]]:
    """The settings a space's ``knobs`` can take, each clamped into its knob's range, and a
    note for each one clamped or left out (no such knob)."""
    by_name = {k.name: k for k in knobs}
    config: Config = {}
    notes: list[str] = []
    for name, value in settings.items():
        knob = by_name.get(name)
        if knob is None:
            notes.append(f"{name} = {value}: not a knob of this space")
            continue
        low, high = getattr(knob, "low", None), getattr(knob, "high", None)
        if isinstance(value, int | float) and low is not None and high is not None:
            kept = min(max(value, low), high)
            if kept != value:
                notes.append(f"{name} = {value} clamped to {kept} (the knob's range)")
            value = type(value)(kept)
        config[name] = knob.validate(value, f"pgtune.{name}")
    return config, notes
