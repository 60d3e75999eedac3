"""SIGTERM as an ordinary exit, so that every ``finally`` and ``__exit__`` runs.

Python's default SIGTERM action kills the process at once: no ``finally`` block, no
``restore()``, no ``close()``, and a target would leave temporary databases, changed clocks or
a running server behind. While ``terminate_on_sigterm()`` is active, a SIGTERM instead raises
``SystemExit(143)`` (128 + 15, the status a shell reports for a SIGTERM-killed process) in the
main thread. The exception unwinds through ``Target.run_trial`` (restore) and the target's
``with`` block (close), and the interpreter then exits with status 143.

Further SIGTERMs are ignored once the first one arrived, so a second signal cannot cut the
cleanup short; the previous handler comes back when the block is left. Usage::

    with terminate_on_sigterm(), build_target(kind, options) as target:
        for config in configs:
            target.run_trial(config)

A handler runs between Python bytecodes, so a signal that arrives during a long C call (a
``VACUUM``, a blocking read) takes effect when that call returns.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGTERM_EXIT_STATUS = 128 + int(signal.SIGTERM)


@contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Within the block, turn SIGTERM into ``SystemExit(143)`` raised in the main thread.

    Raises:
        RuntimeError: When called outside the main thread (Python delivers signals only
            there, so the handler could not be installed).
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("terminate_on_sigterm() must be entered from the main thread")
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _raise_system_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(SIGTERM_EXIT_STATUS)
