"""A private, throwaway PostgreSQL cluster in a temporary directory, for the postgres target.

``Cluster.create()`` makes a directory (prefix ``tuner-postgres-``) and runs ``initdb`` in
it (trust authentication, superuser ``postgres``, ``--no-sync``: the data is disposable).
The server listens on a Unix socket in that directory only (``listen_addresses = ''``); the
port is a free TCP port number, used only to name the socket. ``postgresql.conf`` gets these
fixed settings appended, followed by ``include = 'tuner.conf'``: the file each trial
rewrites, so a tuned knob always wins over initdb's settings and never over the fixed ones.

Every program runs as the user ``targets.db.postgres.tools.Tools`` names (``postgres`` when
this process is root, since PostgreSQL refuses root), in the cluster directory, which is
handed to that user, with an environment that points libpq at this server only.

The postmaster is this process's own child, started directly (not through ``pg_ctl``) in a
new session, so that it is reaped here and a terminal's Ctrl-C reaches only the tuner, which
then shuts the server down itself. ``stop()`` escalates fast shutdown (SIGINT) to immediate
shutdown (SIGQUIT) to SIGKILL of the server and each of its children. ``destroy()`` stops the
server and removes the directory; an ``atexit`` hook destroys every cluster still alive when
the interpreter exits. Nothing runs after a SIGKILL of this process: its server outlives
it, until the next cluster made in the same parent directory finds the dead owner's pid in
the ``owner`` file and removes that cluster (``reap_orphans``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from targets.db.postgres.tools import (
    DIR_PREFIX,
    SUPERUSER,
    Tools,
    children,
    pid_file_status,
    reap_orphans,
)
from targets.host.owned_dirs import make_owned_dir
from tuner.errors import ConfigRejected, StateError, TargetError, ValidationError

TRIAL_CONF = "tuner.conf"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0  # an interrupted tool's time to exit before SIGKILL
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes on Linux, with the terminating NUL
_SETTINGS_COLUMNS = (
    "name, setting, coalesce(unit, ''), vartype, context, coalesce(min_val, ''), "
    "coalesce(max_val, ''), coalesce(array_to_string(enumvals, ','), ''), pending_restart, "
    "coalesce(sourcefile, '')"
)
_PROBLEM = re.compile(
    r"\b(PANIC|FATAL|ERROR|WARNING):|\bLOG:\s+(invalid value|could not|out of memory"
    r"|.*terminated by signal|.*was terminated)"
)
_DETAIL = re.compile(r"\b(DETAIL|HINT|CONTEXT):")
_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d [\d:.]+ \S+ \[\d+\] ")
_LIVE: dict[int, Cluster] = {}
_PROBED: dict[str, dict[str, Setting]] = {}


@dataclass(frozen=True)
class Setting:
    """One row of ``pg_settings`` (values as the server shows them, in base units)."""

    name: str
    setting: str
    unit: str
    vartype: str  # bool, integer, real, enum, string
    context: str  # postmaster (restart), sighup (reload), superuser, user, ...
    min_val: str
    max_val: str
    enumvals: tuple[str, ...]
    pending_restart: bool
    sourcefile: str


class Cluster:
    """A throwaway PostgreSQL cluster; ``create()`` it, ``start()`` it, ``destroy()`` it."""

    def __init__(self, tools: Tools, parent: Path | None = None) -> None:
        self.tools = tools
        self.parent = parent
        self.root: Path | None = None
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    # -- life cycle --------------------------------------------------------------------
    def create(self) -> None:
        """Make the directory and run initdb; the server is not started."""
        if self.root is not None:
            raise StateError("the cluster was already created")
        parent = self.parent or Path(tempfile.gettempdir())
        if self.tools.uid is not None:
            _check_searchable(parent, self.tools)
        # mkdtemp adds 8 characters to the prefix; the socket is named .s.PGSQL.<port>
        if len(str(parent)) + len(DIR_PREFIX) + 25 > _SOCKET_PATH_MAX:
            raise ValidationError(
                "target.workdir",
                f"{parent} is too long a path for the server's Unix socket",
                f"a directory whose path has at most {_SOCKET_PATH_MAX - len(DIR_PREFIX) - 25}"
                " characters",
            )
        reap_orphans(parent)
        self.root = make_owned_dir(parent, DIR_PREFIX)
        _LIVE[id(self)] = self
        self.port = _free_port()
        if self.tools.uid is not None:
            os.chown(self.root, self.tools.uid, -1 if self.tools.gid is None else self.tools.gid)
        self.run(
            [
                self.tools.path("initdb"),
                *("-D", str(self.data), "-U", SUPERUSER, "-A", "trust"),
                *("--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"),
            ],
            what="initdb",
            timeout=300,
        )
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(
                "\n# -- added by the tuner's postgres target --\n"
                "listen_addresses = ''\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = '{_quote(str(self.root))}'\n"
                f"include = '{TRIAL_CONF}'\n"
            )
        self.write_conf([])

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the server and wait until it accepts connections.

        Raises:
            ConfigRejected: The server exited or did not become ready; the message holds
                the relevant lines of the server log.
        """
        if self.running:
            raise StateError("the server is already running")
        self.stop()  # reap a server that died on its own, and anything it left
        offset = self.log_offset()
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [self.tools.path("postgres"), "-D", str(self.data)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env=self.env(),
                start_new_session=True,
                **self.tools.popen_kwargs(),
            )
        if self.wait_ready(timeout):
            return
        exited = not self.running
        self.stop()
        if exited:
            raise ConfigRejected("PostgreSQL did not start: " + self.log_excerpt(offset))
        raise ConfigRejected(
            f"PostgreSQL did not accept connections within {timeout:.0f} s: "
            + self.log_excerpt(offset)
        )

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the server accepts connections (after a start or a crash recovery).

        Returns:
            True once it is ready; False if it exited or was not ready within ``timeout``.
        """
        pid_file = self.data / "postmaster.pid"
        deadline = time.monotonic() + timeout
        while self.running:
            assert self._proc is not None
            if pid_file_status(pid_file, self._proc.pid) == "ready":
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return False

    def stop(self) -> None:
        """Stop the server: fast shutdown, then immediate, then SIGKILL. Safe to repeat.

        The server is forgotten only once it has exited, so a stop cut short (a
        ``KeyboardInterrupt``) is finished by the next ``stop()`` or by the ``atexit`` hook.
        """
        proc = self._proc
        if proc is None:
            return
        for sig, wait in ((signal.SIGINT, STOP_TIMEOUT_S), (signal.SIGQUIT, 10.0)):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait)
        if proc.poll() is None:  # each server process leads its own group: take them one by one
            for pid in (*children(proc.pid), proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        proc.wait()
        self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def reload(self, timeout: float = 10.0) -> None:
        """Make the server re-read its configuration files, and wait until it has."""
        if not self.wait_ready(START_TIMEOUT_S):
            raise TargetError("reload(): the PostgreSQL server is not running or not ready")
        assert self._proc is not None
        before = self.sql("select pg_conf_load_time()")
        self._proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while self.sql("select pg_conf_load_time()") == before:
            if time.monotonic() > deadline:
                raise TargetError(f"PostgreSQL did not reload its configuration in {timeout} s")
            time.sleep(0.01)

    def destroy(self) -> None:
        """Stop the server and remove the directory. Idempotent.

        If the stop is interrupted, the cluster stays registered for the ``atexit`` hook.
        """
        self.stop()
        root, self.root = self.root, None
        _LIVE.pop(id(self), None)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
            if root.exists():
                raise TargetError(f"could not remove the postgres target's directory {root}")

    # -- talking to the server ---------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def data(self) -> Path:
        if self.root is None:
            raise StateError("the cluster has not been created")
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        if self.root is None:
            raise StateError("the cluster has not been created")
        return self.root / "server.log"

    def env(self) -> dict[str, str]:
        """The environment of every tool: C locale, and libpq pointed at this server only."""
        assert self.root is not None
        return {
            "PATH": os.environ.get("PATH", os.defpath),
            "LC_ALL": "C",
            "HOME": str(self.root),
            "PGHOST": str(self.root),
            "PGPORT": str(self.port),
            "PGUSER": SUPERUSER,
            "PGDATABASE": "postgres",
            "PGCONNECT_TIMEOUT": "10",
        }

    def run(
        self, args: list[str], *, what: str, timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a tool as the server's user in the cluster directory; fail with its output.

        Raises:
            TargetError: The tool could not be run, ran past ``timeout``, or (with
                ``check``) exited non-zero.
        """
        try:
            done = subprocess.run(
                args,
                capture_output=True,
                text=True,
                errors="replace",
                cwd=self.root,
                env=self.env(),
                timeout=timeout,
                check=False,
                **self.tools.popen_kwargs(),
            )
        except subprocess.TimeoutExpired as exc:
            raise TargetError(f"{what} did not finish within {timeout:.0f} s") from exc
        except OSError as exc:
            raise TargetError(f"could not run {what}: {exc}") from exc
        if check and done.returncode != 0:
            output = (done.stderr.strip() or done.stdout.strip())[-1500:]
            raise TargetError(f"{what} failed (exit status {done.returncode}): {output}")
        return done

    def follow(
        self, args: list[str], on_line: Callable[[str], bool], *, what: str, timeout: float
    ) -> tuple[int | None, str, str]:
        """Run a tool as ``run`` does while handing each stderr line to ``on_line`` as it
        appears (pgbench's ``--progress`` lines); True from it ends the tool (SIGTERM, then
        SIGKILL after ``STOP_GRACE_S``; not SIGINT, which a tool started from a background
        job or a test worker inherits as ignored). Returns (exit status, None when interrupted;
        stdout; stderr).

        Raises:
            TargetError: The tool could not be run, or ran past ``timeout``.
        """
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.Popen(
                    args, stdout=out, stderr=subprocess.PIPE, cwd=self.root, env=self.env(),
                    **self.tools.popen_kwargs(),
                )  # fmt: skip
            except OSError as exc:
                raise TargetError(f"could not run {what}: {exc}") from exc
            assert proc.stderr is not None
            expired = threading.Event()

            def expire() -> None:
                expired.set()
                proc.kill()

            timer = threading.Timer(timeout, expire)
            timer.start()
            lines: list[str] = []
            stopped = False
            try:
                for raw in proc.stderr:
                    line = raw.decode("utf-8", errors="replace")
                    lines.append(line)
                    if not stopped and on_line(line.rstrip("\n")):
                        stopped = True
                        proc.send_signal(signal.SIGTERM)
                        threading.Timer(STOP_GRACE_S, proc.kill).start()
                status = proc.wait()
            finally:
                timer.cancel()
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                proc.stderr.close()
            out.seek(0)
            stdout = out.read().decode("utf-8", errors="replace")
        if expired.is_set() and not stopped:
            raise TargetError(f"{what} did not finish within {timeout:.0f} s")
        return (None if stopped else status), stdout, "".join(lines)

    def sql(self, query: str, timeout: float = 30.0) -> list[list[str]]:
        """Rows of ``query`` as lists of text fields (``t``/``f`` for booleans)."""
        done = self.run(
            [
                self.tools.path("psql"),
                *("-X", "-q", "-A", "-t", "-F", "\x1f", "-v", "ON_ERROR_STOP=1", "-c", query),
            ],
            what=f"psql ({query[:60]})",
            timeout=timeout,
        )
        return [line.split("\x1f") for line in done.stdout.splitlines() if line]

    def settings(self) -> dict[str, Setting]:
        """Every row of ``pg_settings``, by name."""
        rows = self.sql(f"select {_SETTINGS_COLUMNS} from pg_settings")
        out: dict[str, Setting] = {}
        for row in rows:
            name, setting, unit, vartype, context, low, high, enums, pending, source = row
            out[name] = Setting(
                name,
                setting,
                unit,
                vartype,
                context,
                low,
                high,
                tuple(enums.split(",")) if enums else (),
                pending == "t",
                source,
            )
        return out

    def write_conf(self, lines: list[str]) -> None:
        """Replace the trial configuration file (atomically, owned by the server's user)."""
        path = self.data / TRIAL_CONF
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            "# written by the tuner's postgres target for each trial\n"
            + "".join(line + "\n" for line in lines),
            encoding="utf-8",
        )
        if self.tools.uid is not None:
            os.chown(tmp, self.tools.uid, -1 if self.tools.gid is None else self.tools.gid)
        os.replace(tmp, path)

    # -- the server log ----------------------------------------------------------------
    def log_offset(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_problems(self, since: int) -> list[str]:
        """Errors (with their DETAIL/HINT lines) the server logged since offset ``since``."""
        rows = self._log_rows(since)
        problems: list[str] = []
        keep = False  # DETAIL/HINT lines go with the problem they explain
        for row in rows:
            keep = bool(_PROBLEM.search(row)) or (keep and bool(_DETAIL.search(row)))
            if keep:
                problems.append(row)
        return problems

    def log_excerpt(self, since: int, lines: int = 6) -> str:
        """The last problems logged since ``since`` (else the last lines), on one line."""
        rows = self.log_problems(since) or [row for row in self._log_rows(since) if row]
        if not rows:
            return "(nothing in the server log)"
        return " | ".join(" ".join(row.split())[:300] for row in rows[-lines:])

    def _log_rows(self, since: int) -> list[str]:
        try:
            with self.log_path.open("rb") as log:
                log.seek(since)
                text = log.read().decode("utf-8", errors="replace")
        except OSError as exc:
            return [f"(no server log: {exc})"]
        return [_LOG_PREFIX.sub("", line).strip() for line in text.splitlines()]


def probe_settings(tools: Tools, parent: Path | None = None) -> dict[str, Setting]:
    """``pg_settings`` of a fresh cluster of ``tools`` (made, read and removed once per run).

    Raises:
        TargetError: The cluster could not be made or started.
    """
    key = str(tools.bindir)
    if key not in _PROBED:
        cluster = Cluster(tools, parent)
        try:
            cluster.create()
            cluster.start()
            _PROBED[key] = cluster.settings()
        except ConfigRejected as exc:
            raise TargetError(f"a fresh PostgreSQL cluster did not start: {exc}") from exc
        finally:
            cluster.destroy()
    return _PROBED[key]


def destroy_all() -> None:
    """Destroy every cluster not destroyed yet (the ``atexit`` safety net)."""
    for cluster in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            cluster.destroy()


atexit.register(destroy_all)


def _check_searchable(directory: Path, tools: Tools) -> None:
    """Fail clearly when the server's user cannot reach ``directory`` (e.g. a 0700 parent)."""
    for path in (directory, *directory.parents):
        st = path.stat()
        if st.st_uid == tools.uid:
            ok = st.st_mode & 0o100
        elif st.st_gid == tools.gid:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            raise ValidationError(
                "target.workdir",
                f"the '{SUPERUSER}' OS user, which runs PostgreSQL here, cannot enter {path}",
                "a directory whose every parent that user can search, e.g. under /tmp",
            )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _quote(text: str) -> str:
    return text.replace("'", "''")
