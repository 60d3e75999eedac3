"""Facts about the host that targets size their knobs by, read one way for every target."""

from __future__ import annotations

import os
from pathlib import Path

# cgroup v2, then v1: the memory limit of the container or service the tuner runs in
CGROUP_LIMITS = ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes")


def ram_bytes(root: Path = Path("/")) -> int | None:
    """The memory a target may plan for: ``MemTotal`` (``/proc/meminfo``; the physical pages
    where that is unreadable), or the cgroup's memory limit when lower (a container or a
    systemd slice: sizing a cache by the host's RAM there gets the workload OOM-killed);
    None when neither is known. ``root`` is for tests."""
    total: int | None = None
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        total = None
    if total is None and root == Path("/"):
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            total = None
    for limit_file in CGROUP_LIMITS:
        try:
            limit = int((root / limit_file).read_text().strip())  # "max": no limit
        except (OSError, ValueError):
            continue
        total = limit if total is None else min(total, limit)
    return total
