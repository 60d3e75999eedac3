"""Where the designer runs for the service: in the calling thread, or in worker processes.

Running the designer (a GP fit and the acquisition's optimization: seconds of CPU once a
study has a few hundred trials) is the one slow thing the service does. A server runs it
in a pool of worker processes (``WorkerPool``), never in its gRPC threads, so health
checks, completions, heartbeats and reads never wait behind a fit: the thread that asked
only waits for the answer. In-process users (a ``tuner tune`` session without a server,
most tests) run it in the calling thread (``InlineDesigner``).

Both take the service's ``FitCache``: a worker gets the study's cached hyperparameters with
the job and sends the refreshed ones back, so a suggestion does not depend on which process
made it, and the cache lives where the study's requests are coalesced
(``server.service``: one designer run per study at a time).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, Protocol

from tuner import runtime
from tuner.errors import TunerError
from tuner.loop import propose
from tuner.study import StudySpec
from tuner.transfer import SourceStudy
from tuner.trial import Trial

if TYPE_CHECKING:  # imported by the first suggestion: a server's import stays light
    from tuner.designer import FitCache, Suggestion
    from tuner.designer.models.model import CacheEntries

log = logging.getLogger(__name__)

#: Niceness of the worker processes: under full load the API threads win the CPU.
WORKER_NICE = 10
#: Bounds of the delay a saturated server asks a client to wait before trying again.
MIN_RETRY_S = 0.02
MAX_RETRY_S = 30.0


class Designer(Protocol):
    """Runs ``tuner.loop.propose`` for the service and tells how busy it is."""

    def propose(
        self,
        spec: StudySpec,
        trials: Sequence[Trial],
        count: int,
        cache: FitCache,
        salt: int = 0,
        sources: Sequence[SourceStudy] = (),
    ) -> list[Suggestion]:
        """``tuner.loop.propose``'s suggestions (``salt``: its draws, after a lost race;
        ``sources``: the study's transfer sources, read)."""
        ...

    def retry_after(self) -> float:
        """Seconds a request refused now should wait before it is sent again."""
        ...

    def close(self) -> None: ...


class InlineDesigner:
    """The designer in the calling thread (an in-process service: one user, no gRPC)."""

    def propose(
        self,
        spec: StudySpec,
        trials: Sequence[Trial],
        count: int,
        cache: FitCache,
        salt: int = 0,
        sources: Sequence[SourceStudy] = (),
    ) -> list[Suggestion]:
        return propose(spec, trials, count, cache, salt, sources)

    def retry_after(self) -> float:
        return MIN_RETRY_S

    def close(self) -> None:
        pass


class WorkerPool:
    """The designer in ``workers`` processes of their own.

    Args:
        workers: Processes (each imports torch and BoTorch once, at its start).
        nice: Added to each worker's niceness, so the API keeps its share of a busy CPU.

    Each worker applies the settings this process made (``tuner.runtime.current``: torch
    threads, strict mode, the qLogNEHVI kernel), so it suggests as this process would.

    The processes are spawned, not forked (forking a process that runs gRPC threads is
    unsafe), on the first job or on ``warm``. A worker that dies (killed, out of memory)
    breaks the pool: it is rebuilt and the job is run once more; a second failure is
    reported to the caller.
    """

    def __init__(self, workers: int, nice: int = WORKER_NICE) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers: got {workers!r}; allowed: an integer >= 1")
        self.workers = workers
        self._settings = runtime.current()
        self._nice = nice
        self._guard = threading.Lock()
        self._seconds: float | None = None  # moving average of a job's wall time
        self._closed = False
        self._executor = self._start()

    def warm(self, timeout: float | None = 120.0) -> None:
        """Start every worker now (they import the designer); wait until they have, unless
        ``timeout`` is None."""
        futures = [self._executor.submit(_ready) for _ in range(self.workers)]
        for future in futures if timeout is not None else ():
            future.result(timeout=timeout)

    def propose(
        self,
        spec: StudySpec,
        trials: Sequence[Trial],
        count: int,
        cache: FitCache,
        salt: int = 0,
        sources: Sequence[SourceStudy] = (),
    ) -> list[Suggestion]:
        if not spec.fits_models:
            # quasi-random points take milliseconds: computed here, they never wait behind
            # other studies' fits, nor for the workers of a server that just started
            return propose(spec, trials, count, cache, salt, sources)
        entries = cache.export(spec.name)
        begun = time.monotonic()
        try:
            suggestions, entries = self._run(
                spec, list(trials), count, entries, salt, list(sources)
            )
        finally:
            with self._guard:
                took = time.monotonic() - begun
                self._seconds = took if self._seconds is None else 0.8 * self._seconds + 0.2 * took
        cache.update(entries)
        return suggestions

    def retry_after(self) -> float:
        """The time until the next job is expected to end (the pool ends ``workers`` jobs
        per job time), which is when waiting calls are answered and make room."""
        with self._guard:
            each = 1.0 if self._seconds is None else self._seconds
        return min(MAX_RETRY_S, max(MIN_RETRY_S, each / self.workers))

    def close(self) -> None:
        """Cancel queued jobs and stop the workers (a running job's caller gets an error):
        a fit in progress is not waited for."""
        with self._guard:
            self._closed = True
            executor = self._executor
        processes = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=10)
        executor.shutdown(wait=True)  # its manager thread ends before the interpreter does

    # -- private -------------------------------------------------------------------------
    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(self._settings, self._nice, os.getpid()),
        )

    def _run(
        self,
        spec: StudySpec,
        trials: list[Trial],
        count: int,
        entries: CacheEntries,
        salt: int,
        sources: list[SourceStudy],
    ) -> tuple[list[Suggestion], CacheEntries]:
        for attempt in (1, 2):
            with self._guard:
                if self._closed:
                    raise TunerError("the designer's worker pool is shut down")
                executor = self._executor
            future: Future[tuple[list[Suggestion], CacheEntries]]
            try:
                future = executor.submit(_propose_job, spec, trials, count, entries, salt, sources)
                return future.result()
            except BrokenProcessPool:
                log.error("study %s: a designer worker died (attempt %d); restarting the pool",
                          spec.name, attempt)  # fmt: skip
                with self._guard:
                    if self._executor is executor and not self._closed:
                        self._executor = self._start()
                executor.shutdown(wait=False, cancel_futures=True)
        raise TunerError(f"study {spec.name}: the designer's worker died twice on this request")


def _start_worker(settings: dict[str, Any], nice: int, server: int) -> None:
    """Set a worker process up: lower priority, the server's settings, imports paid, and a
    watch that ends it when the server is gone (a server killed with SIGKILL cannot stop
    its workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server shuts its pool down itself
    threading.Thread(target=_exit_with, args=(server,), name="parent-watch", daemon=True).start()
    if nice:
        os.nice(nice)
    runtime.configure(**settings)
    runtime.warm_up()


def _exit_with(server: int, every_s: float = 1.0) -> None:
    """End this process once the ``server`` process is no longer its parent (it died,
    maybe before this process even started, and init or a subreaper took it over)."""
    while os.getppid() == server:
        time.sleep(every_s)
    os._exit(0)


def _ready() -> int:
    return os.getpid()


def _propose_job(
    spec: StudySpec,
    trials: list[Trial],
    count: int,
    entries: CacheEntries,
    salt: int = 0,
    sources: Sequence[SourceStudy] = (),
) -> tuple[list[Suggestion], CacheEntries]:
    """A worker's job; the sources' fitted models stay cached in the worker
    (``models/transfer.py``), so each worker fits a source once."""
    from tuner.designer import FitCache

    cache = FitCache()
    cache.update(entries)
    return propose(spec, trials, count, cache, salt, sources), cache.export(spec.name)
