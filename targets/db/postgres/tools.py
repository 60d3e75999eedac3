"""PostgreSQL's programs, the unprivileged OS user that runs them, and servers left behind.

``initdb`` and ``postgres`` refuse to run as root ("cannot be run as root"). When this
process is root, every PostgreSQL program of the postgres target runs as the ``postgres`` OS
user (which Debian's ``postgresql`` package creates) through ``subprocess``'s ``user=``,
``group=`` and ``extra_groups=`` arguments; otherwise as the current user.

The programs are looked up in ``pg_config --bindir``, then ``/usr/lib/postgresql/<v>/bin``
(newest version first, Debian's layout), then the directories of the programs on ``PATH``;
the first directory holding all of ``TOOLS`` wins.

Each cluster directory (``tuner-postgres-*``) holds an ``owner`` file with the pid of the
process that made it. ``reap_orphans`` removes the clusters of owners that no longer exist
(killed with SIGKILL, so nothing of theirs could clean up): it shuts their server down
(immediate shutdown, after checking that the pid in ``postmaster.pid`` really runs that data
directory) and deletes the directory. Directories without an owner file, or whose owner is
alive (or whose pid was reused), are left alone.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from targets.host import owned_dirs
from tuner.errors import TargetError

TOOLS = ("initdb", "postgres", "psql", "pgbench")
INSTALL_HINT = "install it with `apt-get install postgresql` (Debian/Ubuntu)"
SUPERUSER = "postgres"
DIR_PREFIX = "tuner-postgres-"


@dataclass(frozen=True)
class Tools:
    """Where the PostgreSQL programs are, and which OS user runs them."""

    bindir: Path
    uid: int | None = None  # None: run as the current user
    gid: int | None = None

    def path(self, tool: str) -> str:
        return str(self.bindir / tool)

    def popen_kwargs(self) -> dict[str, Any]:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def find_tools() -> Tools:
    """The PostgreSQL programs and the user to run them as.

    Raises:
        TargetError: PostgreSQL is not installed (the message says how to install it), or
            this process is root and there is no ``postgres`` OS user to run the server as.
    """
    for bindir in _candidate_bindirs():
        if all(os.access(bindir / tool, os.X_OK) for tool in TOOLS):
            break
    else:
        raise TargetError(
            f"PostgreSQL is not installed: no directory has all of {', '.join(TOOLS)} "
            f"(looked in `pg_config --bindir`, /usr/lib/postgresql/*/bin and PATH); "
            f"{INSTALL_HINT}"
        )
    if os.geteuid() != 0:
        return Tools(bindir)
    try:
        user = pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise TargetError(
            "PostgreSQL refuses to run as root and there is no 'postgres' OS user to run it "
            f"as; {INSTALL_HINT} creates one"
        ) from None
    return Tools(bindir, user.pw_uid, user.pw_gid)


def _candidate_bindirs() -> list[Path]:
    dirs: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            dirs.append(Path(out.stdout.strip()))
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    dirs += [Path(d) for d in sorted(versions, key=_version_key, reverse=True)]
    for tool in TOOLS:
        found = shutil.which(tool)
        if found:
            dirs.append(Path(os.path.realpath(found)).parent)
    return dirs


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def reap_orphans(parent: Path) -> list[Path]:
    """Remove the clusters under ``parent`` whose owner process is gone (a server still
    running there is shut down first); the ones removed (``targets.host.owned_dirs``)."""
    return owned_dirs.reap_orphans(parent, DIR_PREFIX, lambda root: _stop_orphan(root / "data"))


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux ``/proc``; empty elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def pid_file_status(path: Path, pid: int | None = None) -> str:
    """The status line of ``postmaster.pid``: ``ready`` once the server accepts connections.

    Empty when the file is missing or incomplete, or belongs to a server other than ``pid``.
    """
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    if len(lines) < 8 or (pid is not None and lines[0].strip() != str(pid)):
        return ""
    return lines[7].strip()


def _stop_orphan(data: Path) -> None:
    """Immediate shutdown of the server running ``data``, if one still does."""
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return
    if os.fsencode(str(data)) not in cmdline:
        return  # that pid now belongs to another process
    for sig in (signal.SIGQUIT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _alive(pid):
            return


def _alive(pid: int) -> bool:
    return owned_dirs.owner_alive(pid)
