"""The one trial loop: suggest, measure, complete, until the study has its trials.

Everything that runs trials outside the server goes through ``run_loop``: a CLI session
(``runner.session.run_session``), the daemon's tuning rounds (``runner.daemon``), the
benchmarks and the tests (``run_trials``, over the in-memory ``runner.memory.MemoryAPI``).
What differs between them is passed in, never written as a second loop:

* how one trial is measured (``measure``: the protocol's repeats, the daemon's windows with
  their SLO stop, a benchmark's surrogate), returning a ``runner.measurement.Measured``;
* what happens after each completed trial (``after``: a control run, an event, progress).

The loop talks to anything with the service's methods (``TuningAPI``: the in-process
``TuningService``, a ``TunerClient``, a ``MemoryAPI``). Several processes may work on one
study: each asks only while the finished trials and those others are measuring fall short
of ``trials``; trials left ACTIVE by a predecessor of this caller (``leftover``) are
finished first, and a caller's own ACTIVE trials come back to it from ``suggest_trials``.
While a trial is measured its lease is renewed (``keep_alive``). ``tests/test_layers.py``
checks that no other suggest-to-complete loop exists outside ``server/`` (ask/tell and the
Ray callbacks, where the caller owns the loop, excepted).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Protocol

from runner.measurement import Measured
from targets.base import Progress
from tuner.errors import StateError, TargetError
from tuner.space import Config
from tuner.stopping import Decision
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, Trial, TrialStatus

log = logging.getLogger(__name__)

#: Trials in a row that FAILED after which the loop stops: the target is broken, not the
#: configurations.
MAX_CONSECUTIVE_FAILURES = 5


class TuningAPI(Protocol):
    """The part of the service a loop needs (``TuningService``, ``TunerClient``, ``MemoryAPI``)."""

    def create_study(self, spec: StudySpec) -> tuple[object, bool]: ...

    def add_measurements(
        self, study: str, trial_id: int, measurements: Sequence[Measurement]
    ) -> list[Measurement]: ...

    def list_measurements(
        self,
        study: str,
        trial_id: int | None = None,
        kinds: Collection[MeasurementKind] | None = None,
    ) -> list[Measurement]: ...

    def suggest_trials(self, study: str, count: int, client_id: str = "") -> list[Trial]: ...

    def complete_trial(
        self,
        study: str,
        trial_id: int,
        metrics: Mapping[str, float] | None = None,
        status: TrialStatus = TrialStatus.COMPLETED,
        reason: str = "",
        request_id: str = "",
        measurements: Sequence[Measurement] = (),
        client_id: str | None = None,
    ) -> Trial: ...

    def list_trials(
        self, study: str, statuses: Collection[TrialStatus] | None = None
    ) -> list[Trial]: ...

    def heartbeat(self, study: str, trial_id: int, client_id: str | None = None) -> Trial: ...

    def report_progress(
        self,
        study: str,
        trial_id: int,
        metrics: Mapping[str, float],
        client_id: str | None = None,
        window: int = 0,
    ) -> Decision: ...


class Outcome(Protocol):
    """One measurement of a configuration (``targets.base.TrialOutcome`` is one)."""

    @property
    def status(self) -> TrialStatus: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...

    @property
    def reason(self) -> str: ...


def run_loop(
    api: TuningAPI,
    spec: StudySpec,
    trials: int,
    measure: Callable[[Trial], Measured],
    *,
    client_id: str = "",
    batch: int = 1,
    leftover: Sequence[Trial] = (),
    after: Callable[[Trial, Measured, int], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Run trials of ``spec``'s study until it has ``trials`` finished ones.

    Args:
        measure: Measures one trial (the loop completes it with what this returns).
        client_id: Who asks (a session's, the daemon's); its ACTIVE trials come back to it.
        batch: Suggestions asked for at a time; the later ones of a batch stay pending
            while the earlier ones are measured, as parallel workers see them.
        leftover: ACTIVE trials a predecessor of this caller left: finished first.
        after: Called with each completed trial, its measurement and the number of
            finished trials so far.
        stop: Asked before each call for suggestions; True ends the loop early.

    Raises:
        TargetError: ``MAX_CONSECUTIVE_FAILURES`` trials in a row FAILED.
        ValueError: ``batch`` is below 1.
    """
    if batch < 1:
        raise ValueError(f"batch: got {batch!r}; allowed: an integer >= 1")
    api.create_study(spec)
    waiting = list(leftover)
    failures = 0
    while not (stop is not None and stop()):
        history = api.list_trials(spec.name)
        finished = sum(t.status.is_final for t in history)
        mine = {t.id for t in waiting}
        others = sum(
            t.status is TrialStatus.ACTIVE and t.id not in mine and t.client_id != client_id
            for t in history
        )
        if finished + others >= trials:
            break  # the trials other callers are measuring complete the budget
        if waiting:
            asked = [waiting.pop(0)]
            log.info("study %s: finishing trial %d, left by a caller that ended", spec.name,
                     asked[0].id)  # fmt: skip
        else:
            count = min(batch, trials - finished - others)
            asked = api.suggest_trials(spec.name, count, client_id)
        for trial in asked:
            with keep_alive(api, spec.name, trial):
                measured = measure(trial)
            reported = complete(api, spec.name, trial, measured)
            finished += 1
            failures = failures + 1 if measured.status is TrialStatus.FAILED else 0
            if after is not None:
                after(reported, measured, finished)
            if failures >= MAX_CONSECUTIVE_FAILURES:
                raise TargetError(
                    f"{failures} trials in a row failed; last reason: {measured.reason}"
                )


def complete(api: TuningAPI, study: str, trial: Trial, measured: Measured) -> Trial:
    """Complete ``trial`` with ``measured``: its repeats (the trial's metrics are their
    means), or its ``metrics`` as they are."""
    if measured.metrics is not None:
        return api.complete_trial(
            study, trial.id, dict(measured.metrics), measured.status, measured.reason,
            client_id=trial.client_id,
        )  # fmt: skip
    return api.complete_trial(
        study, trial.id, None, measured.status, measured.reason,
        measurements=measured.repeats, client_id=trial.client_id,
    )  # fmt: skip


def reporter(api: TuningAPI, study: str, trial: Trial) -> Progress:
    """What hears a trial's windows: each goes to the study
    (``report_progress``), numbered on from the windows a dead predecessor may have
    reported for this trial, so a retried report stores nothing twice; the answer is why
    the trial stops now (``tuner.stopping``), or "" to go on. Sessions and the daemon both
    use it."""
    reported = len(api.list_measurements(study, trial.id, [MeasurementKind.PROGRESS]))

    def progress(window: dict[str, float]) -> str:
        nonlocal reported
        reported += 1
        decision = api.report_progress(study, trial.id, window, trial.client_id, reported)
        return decision.reason if decision.stop else ""

    return progress


def run_trials(
    spec: StudySpec,
    measure: Callable[[Config], Outcome],
    budget: int,
    *,
    batch: int = 1,
    api: TuningAPI | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> list[Trial]:
    """``run_loop`` in memory, one measurement a trial: the benchmarks' and the tests' way
    to drive the designer. Returns all of the study's trials, in id order.

    Args:
        measure: Measures one configuration; its metrics are the trial's as they are.
        api: The study's store (default: a new ``MemoryAPI``; pass the same one to go on
            with a study's trials).
        on_trial: Called with each finished trial (progress).
    """
    if api is None:
        from runner.memory import MemoryAPI

        api = MemoryAPI()

    def once(trial: Trial) -> Measured:
        outcome = measure(trial.config)
        return Measured(outcome.status, reason=outcome.reason, metrics=dict(outcome.metrics))

    def after(trial: Trial, measured: Measured, finished: int) -> None:
        if on_trial is not None:
            on_trial(trial)

    run_loop(api, spec, budget, once, batch=batch, after=after)
    return api.list_trials(spec.name)


@contextlib.contextmanager
def keep_alive(api: TuningAPI, study: str, trial: Trial) -> Iterator[None]:
    """Send heartbeats for ``trial`` while the block runs, a third of a lease apart.

    Nothing happens for a trial without a lease. A heartbeat that fails (the server is
    restarting, the network dropped) is logged and retried at the next tick; one refused
    because the lease already expired stops the heartbeats: the result is still reported
    at the end and the server stores it as a late result.
    """
    if trial.lease_expires_at is None:
        yield
        return
    stop = threading.Event()
    interval = max(0.05, (trial.lease_expires_at - time.time()) / 3)

    def beat() -> None:
        while not stop.wait(interval):
            try:
                api.heartbeat(study, trial.id, trial.client_id)
            except StateError as exc:
                log.warning("trial %d: heartbeat refused (%s)", trial.id, exc)
                return
            except Exception as exc:  # keep measuring; the next tick tries again
                log.warning("trial %d: heartbeat failed (%s); retrying", trial.id, exc)

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
