"""A JSON-lines bridge to a child process that runs in another virtual environment.

Some peers and problems need libraries whose pins the project's environment cannot take
(mlos-core and YAHPO Gym need ``numpy<2``), so they run in their own virtual environment,
in a child process that this module connects to. Both halves live here and import only the
standard library, so the child (started as ``python bench/<file>.py`` with the other
environment's interpreter, which puts the repository root on its path first) can import
this module too:

* **parent**: ``ChildProcess`` starts the child and answers ``call(message) -> reply`` one
  JSON line each way; the child's stderr goes to a temporary file, quoted when the child
  fails. ``probe`` runs ``<file> --probe`` to learn whether the environment imports.
* **child**: ``serve(handlers)`` reads one message per line from stdin, dispatches on its
  ``op`` (``close`` ends the loop) and writes one reply per line to the real stdout;
  ``sys.stdout`` is pointed at stderr first, so what libraries print cannot corrupt the
  protocol. An exception in a handler is sent back as ``{"error": "..."}``, which the
  parent raises as its error class.

Users: ``bench/mlos_peer.py`` (mlos-core + SMAC) and ``bench/yahpo_bridge.py`` (YAHPO Gym).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

STDERR_TAIL = 3000

Handler = Callable[[dict[str, Any]], dict[str, Any]]

#: The variables a child's libraries read their thread counts from: OpenMP and the BLAS
#: builds, and joblib's ``cpu_count`` (``LOKY_MAX_CPU_COUNT``), which is what scikit-learn's
#: ``n_jobs=-1`` means. SMAC's random forest predicts with ``n_jobs=-1``: on a 2-core VM
#: each prediction started a thread pool and polled it, 17.8 ms against 0.8 ms on one
#: thread for the same numbers (2026-12-04, ``bench/NOTES.md``, "mlos-core's idle half").
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "LOKY_MAX_CPU_COUNT",
)


def thread_env(threads: int | None) -> dict[str, str]:
    """This process's environment for a child, its libraries limited to ``threads`` threads
    (``THREAD_VARIABLES``; None: their defaults)."""
    env = dict(os.environ)
    if threads is not None:
        env.update(dict.fromkeys(THREAD_VARIABLES, str(threads)))
    return env


class ChildProcess:
    """One child speaking JSON lines on its stdin/stdout.

    Args:
        argv: The child's command line (its interpreter and script first).
        label: How messages name the child (``mlos peer``, ``yahpo child``).
        error: The exception raised when the child fails or reports an error.
        env: The child's environment (None: this process's).
    """

    def __init__(
        self,
        argv: list[str],
        label: str,
        error: type[Exception],
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.label, self.error = label, error
        # kept open for the child's lifetime, closed in close()
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=None if env is None else dict(env),
        )

    def call(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send ``message`` and return the reply; raises ``error`` with the child's words."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self._proc.wait(timeout=10)
            raise self.error(
                f"{self.label} exited with code {self._proc.returncode} on {message['op']!r}; "
                f"stderr:\n{self.stderr_tail()}"
            )
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise self.error(f"{self.label} failed on {message['op']!r}: {reply['error']}")
        return reply

    def close(self) -> None:
        """Ask the child to stop, wait for it (kill it after 10 s); idempotent."""
        if self._proc.poll() is None:
            with contextlib.suppress(self.error):
                self.call({"op": "close"})
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout, self._stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()

    def stderr_tail(self) -> str:
        """The last ``STDERR_TAIL`` characters the child wrote to stderr."""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-STDERR_TAIL:]


def probe(python: Path, script: Path, setup: str, imports: str) -> dict[str, Any] | str:
    """``script --probe`` in ``python``: the versions it prints, or why it cannot run.

    Args:
        python: The environment's interpreter.
        script: The child's file.
        setup: The script that makes the environment (named in the reasons).
        imports: What the child must import (named in the reasons).
    """
    if not Path(python).exists():
        return f"{python} not found: run {setup}"
    try:
        done = subprocess.run(
            [str(python), str(script), "--probe"], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as err:
        return f"{python} does not run: {err}"
    if done.returncode != 0:
        return f"{python} cannot import {imports}: {done.stderr.strip()[-500:]}"
    versions: dict[str, Any] = json.loads(done.stdout)
    return versions


def serve(
    handlers: Mapping[str, Handler],
    probe_reply: Callable[[], dict[str, Any]],
    argv: list[str] | None = None,
) -> int:
    """The child's loop (module doc); ``--probe`` prints ``probe_reply()`` and exits."""
    args = sys.argv[1:] if argv is None else argv
    protocol = sys.stdout
    sys.stdout = sys.stderr  # library output must not corrupt the protocol
    if args == ["--probe"]:
        protocol.write(json.dumps(probe_reply()) + "\n")
        return 0
    for line in sys.stdin:
        message = json.loads(line)
        op = message.get("op")
        try:
            if op == "close":
                reply: dict[str, Any] = {"ok": True}
            elif op in handlers:
                reply = handlers[op](message)
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as err:  # reported to the parent, which raises its error class
            reply = {"error": f"{type(err).__name__}: {err}"}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()
        if op == "close":
            break
    return 0


def versions(packages: tuple[str, ...]) -> dict[str, str | None]:
    """Installed version of each package (None when missing)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
