"""Scratch directories that name the process owning them, and the reaping of orphans.

A target that keeps a large scratch directory for a session (the SQLite target's databases,
about 100 MB; a PostgreSQL cluster) removes it when the session closes. A session killed with
SIGKILL (or by the OOM killer, or a power cut) cannot, so each such directory holds an
``owner`` file with its creator's pid and that process's start time (``/proc/<pid>/stat``,
field 22), and the next session that makes one in the same parent removes every directory of
the same prefix whose owner is gone (``reap_orphans``). The start time guards against a
recycled pid: a live process with the owner's pid but another start time is not the owner.
An owner file that holds only a pid (written before the start time was added) is judged by
the pid. A directory without a readable owner file is never touched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

OWNER_FILE = "owner"


def make_owned_dir(parent: Path | None, prefix: str) -> Path:
    """A new directory ``parent/<prefix>XXXXXXXX`` (the system's temporary directory when
    ``parent`` is None) whose owner file names this process."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    started = _start_time(os.getpid())
    (root / OWNER_FILE).write_text(f"{os.getpid()} {started or ''}".strip() + "\n", "ascii")
    return root


def reap_orphans(
    parent: Path | None, prefix: str, stop: Callable[[Path], None] | None = None
) -> list[Path]:
    """Remove the directories ``parent/<prefix>*`` whose owner process is gone, after
    ``stop(directory)`` (a server still running there, say); the ones removed."""
    reaped = []
    for root in Path(parent or tempfile.gettempdir()).glob(prefix + "*"):
        try:
            fields = (root / OWNER_FILE).read_text(encoding="ascii").split()
            pid = int(fields[0])
            started = int(fields[1]) if len(fields) > 1 else None
        except (OSError, ValueError, IndexError):
            continue
        if owner_alive(pid, started):
            continue
        if stop is not None:
            stop(root)
        shutil.rmtree(root, ignore_errors=True)
        reaped.append(root)
    return reaped


def owner_alive(pid: int, started: int | None = None) -> bool:
    """Whether process ``pid`` runs (not a zombie) and, if ``started`` is given, started then."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    state, start = _stat(pid)
    if state == "Z":
        return False
    return started is None or start is None or start == started


def _start_time(pid: int) -> int | None:
    return _stat(pid)[1]


def _stat(pid: int) -> tuple[str, int | None]:
    """The state letter and start time (clock ticks since boot) of ``pid``; ``("", None)``
    where ``/proc`` does not say (not Linux, or the process is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return "", None
