"""Scratch directories name their owner; the next session removes those whose owner is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from targets.host.owned_dirs import OWNER_FILE, make_owned_dir, owner_alive, reap_orphans


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_directories_of_dead_owners_are_reaped(tmp_path: Path) -> None:
    mine = make_owned_dir(tmp_path, "scratch-")
    pid, started = (mine / OWNER_FILE).read_text().split()
    assert int(pid) == os.getpid() and owner_alive(int(pid), int(started))
    dead = make_owned_dir(tmp_path, "scratch-")
    (dead / OWNER_FILE).write_text(f"{_dead_pid()}\n")
    (dead / "data.db").write_bytes(b"x" * 1000)
    recycled = make_owned_dir(tmp_path, "scratch-")  # our pid, another process's start time
    (recycled / OWNER_FILE).write_text(f"{os.getpid()} {int(started) - 1}\n")
    old_format = make_owned_dir(tmp_path, "scratch-")  # a pid alone, alive
    (old_format / OWNER_FILE).write_text(f"{os.getpid()}\n")
    unowned = tmp_path / "scratch-unowned"
    unowned.mkdir()
    other_prefix = make_owned_dir(tmp_path, "other-")
    (other_prefix / OWNER_FILE).write_text(f"{_dead_pid()}\n")
    stopped: list[Path] = []
    reaped = reap_orphans(tmp_path, "scratch-", stopped.append)
    assert sorted(reaped) == sorted([dead, recycled]) == sorted(stopped)
    assert not dead.exists() and not recycled.exists()
    assert mine.exists() and old_format.exists() and unowned.exists() and other_prefix.exists()
