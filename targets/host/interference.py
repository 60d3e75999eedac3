"""Background load at chosen levels: measurements on a busy machine, in tests and benchmarks.

Most machines that run a tuning session also run other work, and a single measurement on a
shared machine can be far off. ``Interference`` makes such a machine on purpose, so that the
measurement protocol can be tested and benchmarked under load::

    with Interference(cpu=1, duty=0.5, memory_mb=256, disk_mb_s=20):
        ...  # measure here

* ``cpu``: that many processes, each busy ``duty`` of every 20 ms period (spinning in Python)
  and asleep the rest;
* ``memory_mb``: one process holding that many MiB resident, every page written again each
  second (so the kernel cannot reclaim it cheaply);
* ``disk_mb_s``: one process writing that many MiB a second to a file in ``workdir`` (the
  system's temporary directory by default) in 1 MiB blocks, each followed by ``fsync``,
  starting the file again at 64 MiB.

Each load runs in a child process of its own session (``python -m targets.host.interference``).
``stop`` (also on leaving the ``with`` block, at interpreter exit, and on garbage collection)
kills them and removes the disk file; a child also exits by itself within a second when its
parent is gone (a session killed with SIGKILL), so no load outlives the process that started
it. Debian's ``stress-ng`` does more, but this needs nothing installed and runs wherever the
tuner runs.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tuner.errors import ValidationError

PERIOD_S = 0.02  # a CPU worker's busy/idle cycle
DISK_BLOCK = 1 << 20
DISK_WRAP = 64 << 20  # the disk file starts again at this size
START_TIMEOUT_S = 10.0


class Interference:
    """Background CPU, memory and disk load (module doc); a context manager."""

    def __init__(
        self,
        cpu: int = 0,
        duty: float = 1.0,
        memory_mb: int = 0,
        disk_mb_s: float = 0.0,
        workdir: str | Path | None = None,
    ) -> None:
        if not isinstance(cpu, int) or isinstance(cpu, bool) or not 0 <= cpu <= 256:
            raise ValidationError("interference.cpu", f"got {cpu!r}", "an integer in [0, 256]")
        if not isinstance(duty, (int, float)) or not 0.0 < duty <= 1.0:
            raise ValidationError("interference.duty", f"got {duty!r}", "a number in (0, 1]")
        if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < 0:
            raise ValidationError(
                "interference.memory_mb", f"got {memory_mb!r}", "an integer >= 0 (MiB)"
            )
        if not isinstance(disk_mb_s, (int, float)) or not 0.0 <= disk_mb_s <= 10_000:
            raise ValidationError(
                "interference.disk_mb_s", f"got {disk_mb_s!r}", "a number in [0, 10000] (MiB/s)"
            )
        self.cpu, self.duty, self.memory_mb, self.disk_mb_s = cpu, float(duty), memory_mb, disk_mb_s
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.gettempdir())
        self.disk_file: Path | None = None
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Interference:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()

    @property
    def pids(self) -> list[int]:
        """The load processes' pids (empty when stopped)."""
        return [proc.pid for proc in self._procs]

    def start(self) -> None:
        """Start every load; each has begun its work when this returns."""
        if self._procs:
            return
        atexit.register(self.stop)
        jobs: list[list[str]] = [["cpu", str(self.duty)] for _ in range(self.cpu)]
        if self.memory_mb:
            jobs.append(["memory", str(self.memory_mb)])
        if self.disk_mb_s:
            handle, name = tempfile.mkstemp(prefix="tuner-interference-", dir=self.workdir)
            os.close(handle)
            self.disk_file = Path(name)
            jobs.append(["disk", str(self.disk_mb_s), name])
        try:
            for job in jobs:
                self._procs.append(_spawn(job))
            for proc in self._procs:
                _wait_ready(proc)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kill every load process and remove the disk file; safe to repeat."""
        procs, self._procs = self._procs, []
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()
        if self.disk_file is not None:
            self.disk_file.unlink(missing_ok=True)
            self.disk_file = None
        atexit.unregister(self.stop)


def _spawn(job: list[str]) -> subprocess.Popen[bytes]:
    root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "targets.host.interference", str(os.getpid()), *job],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )


def _wait_ready(proc: subprocess.Popen[bytes]) -> None:
    """Wait until the worker prints ``ready`` (its load has started), at most
    ``START_TIMEOUT_S``."""
    assert proc.stdout is not None
    readable, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
    line = proc.stdout.readline() if readable else b""
    if line.strip() != b"ready":
        raise RuntimeError(f"an interference worker did not start (exit status {proc.poll()})")


# -- the workers (in their own processes) ---------------------------------------------------
def _orphaned(parent: int) -> bool:
    return os.getppid() != parent


def _cpu(parent: int, duty: float) -> None:
    busy = PERIOD_S * duty
    print("ready", flush=True)
    while not _orphaned(parent):
        start = time.perf_counter()
        while time.perf_counter() - start < busy:
            pass
        if duty < 1.0:
            time.sleep(PERIOD_S - busy)


def _memory(parent: int, mb: int) -> None:
    block = bytearray(mb << 20)
    page = 4096
    for offset in range(0, len(block), page):
        block[offset] = 1
    print("ready", flush=True)
    value = 1
    while not _orphaned(parent):
        time.sleep(1.0)
        value = (value + 1) % 256
        for offset in range(0, len(block), page):
            block[offset] = value


def _disk(parent: int, mb_s: float, path: str) -> None:
    block = os.urandom(DISK_BLOCK)
    interval = 1.0 / mb_s
    with open(path, "wb", buffering=0) as f:
        print("ready", flush=True)
        written = 0
        next_at = time.monotonic()
        while not _orphaned(parent):
            if written >= DISK_WRAP:
                f.seek(0)
                f.truncate()
                written = 0
            f.write(block)
            os.fsync(f.fileno())
            written += DISK_BLOCK
            next_at += interval
            time.sleep(max(0.0, min(1.0, next_at - time.monotonic())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="one interference worker (targets/host/interference.py)"
    )
    parser.add_argument("parent", type=int)
    parser.add_argument("kind", choices=["cpu", "memory", "disk"])
    parser.add_argument("args", nargs="*")
    args = parser.parse_args(argv)
    if args.kind == "cpu":
        _cpu(args.parent, float(args.args[0]))
    elif args.kind == "memory":
        _memory(args.parent, int(args.args[0]))
    else:
        _disk(args.parent, float(args.args[0]), args.args[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
