"""The closing confirmation of a session: the default and the best few, in interleaved rounds.

The session ends by measuring the default and the best few candidates back to back within
each round and in alternating order (ABBA), so that drift touches each pair alike. First
``select`` rounds choose one candidate by its paired per-round ratios to the default; then
fresh rounds of the default and that candidate alone give the headline ratio with a 95 %
interval (``tuner.confirmation``). Choosing and estimating on separate rounds keeps the
headline unbiased: the largest of three ratios measured on the same rounds overstates the
chosen one's (the winner's curse). While the headline's interval is wider than ``width``,
the estimate runs more rounds, up to ``grow_to``. The protocol's settings are
``runner.measurement.MeasurementProtocol``'s ``confirm*`` fields.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from runner.measurement import MeasurementProtocol
from targets.base import Target
from tuner.confirmation import (
    Confirmation,
    Remeasured,
    joined,
    judge,
    machine_noise,
    meets,
    stop_reason,
    with_selection,
)
from tuner.measurement_stats import pooled_log_variance, window_factor
from tuner.study import StudySpec
from tuner.trial import (
    Measurement,
    MeasurementKind,
    StepKind,
    Trial,
    TrialStatus,
    with_resolved_constraints,
)

if TYPE_CHECKING:
    from runner.session import SessionResult

log = logging.getLogger(__name__)


def confirm(
    target: Target,
    spec: StudySpec,
    trials: Sequence[Trial],
    candidates: Sequence[Trial],
    rounds: int,
    top: int = 3,
    on_measure: Callable[[int, int], None] | None = None,
    store: Callable[[int, Measurement], None] | None = None,
    noise: Mapping[str, tuple[float, int]] | None = None,
    select: int = 0,
    grow_to: int = 0,
    width: float = MeasurementProtocol.confirm_width,
    first_round: int = 0,
    max_seconds: float = 0.0,
    window: RoundWindow | None = None,
) -> Confirmation:
    """Compare the first ``top`` of ``candidates`` (best first: ``tuner.confirmation.ranked``)
    with the default in rounds that alternate their order, by paired per-round ratios.

    With ``select`` rounds and more than one candidate, ``select`` rounds of the default
    and every candidate choose the one with the best paired ratio (feasible and stable in
    every round), and then ``rounds`` fresh rounds of the default and that one alone give
    its interval. Otherwise ``rounds`` rounds of all of them both choose and estimate.

    Args:
        trials: The study's trials (the default among them).
        on_measure: Called with (runs done, runs in all), for progress.
        store: Called with (trial id, measurement) for each completed run, to keep it
            (as a CONFIRM measurement with its round, numbered on through both phases).
        noise: The study's pooled noise (``pooled_noise``) that flags unstable candidates;
            None: their rounds are not tested.
        select: Rounds that choose among the candidates before the estimate (0: none).
        grow_to: Rounds the estimate may grow to, one at a time, while the best's interval
            is wider than ``width`` (its high end over its low end); 0: exactly ``rounds``.
        first_round: The last round the study already stored (a session resumed after its
            confirmation): the rounds are numbered on from it, so that the stored rounds of
            this confirmation are the study's latest, never mixed with the earlier ones'.
        max_seconds: With the sequential rule (``spec.stopping.confirm``), no round starts
            after the estimate has run this long (0: no limit).
        window: Each run's warm-up and window (``round_window``); the target's own are
            put back afterwards. None: the target's own.

    With ``spec.stopping.confirm = "sequential"`` the estimate runs ``rounds`` rounds,
    then one at a time while its interval (a confidence sequence) includes 1 and is wider
    than ``width``, up to ``grow_to`` rounds (``MAX_ROUNDS`` when 0) and ``max_seconds``;
    the confirmation says why it stopped (``Confirmation.stopped``).
    """
    with lengthened(target, window):
        spec = with_resolved_constraints(spec, trials)
        default = next((t for t in trials if t.step is StepKind.DEFAULT), None)
        ranked = list(candidates)[:top]
        base = [default] if default is not None else []
        two = default is not None and select > 0 and len(ranked) > 1
        total = (
            (select * (1 + len(ranked)) + rounds * 2) if two else rounds * (len(base) + len(ranked))
        )
        runner = _Rounds(target, spec, store, on_measure, total, first_round)
        limit = _Limit(spec.stopping.sequential, grow_to, width, max_seconds)
        if not two:
            return runner.estimate(base + ranked, rounds, limit, noise)
        selection = runner.run(base + ranked, select)
        chose = judge(spec, selection, True, noise, choosing=True)
        if chose.best is None:
            return replace(
                chose, measured=selection[:1], intervals={}, selection=selection,
                selection_intervals=chose.intervals,
            )  # fmt: skip
        pair: list[Trial] = [default, chose.best.trial]  # type: ignore[list-item]
        found = runner.estimate(pair, rounds, limit, noise)
        return with_selection(found, chose, selection)


def confirm_session(
    target: Target,
    result: SessionResult,
    protocol: MeasurementProtocol,
    store: Callable[[int, Measurement], None] | None = None,
    on_measure: Callable[[int, int], None] | None = None,
    tuned_s: float = 0.0,
    rounds: int = 0,
    announce: Callable[[RoundWindow], None] | None = None,
) -> Confirmation:
    """A finished session's confirmation by its ``protocol``: its ranking's best few
    against the default, the machine's noise as the yardstick, rounds numbered on from the
    stored ones, the sequential rule's time share of ``tuned_s`` (the seconds the trials
    took), the round window the protocol asks for (``chosen_window``, told to
    ``announce``). ``rounds``: the estimate's first rounds (0: ``protocol.confirm``).
    Sessions, ``tuner confirm`` and the daemon's rounds all confirm through it."""
    measured = result.measurements
    default = None if result.default is None else result.default.id
    window = chosen_window(protocol, target, result.spec, result.trials, measured)
    if window is not None and announce is not None:
        announce(window)
    return confirm(
        target, result.spec, result.trials, result.ranking, rounds or protocol.confirm,
        protocol.confirm_top, on_measure, store, machine_noise(result.spec, measured, default),
        protocol.confirm_select, protocol.confirm_max, protocol.confirm_width,
        max((m.round for m in measured if m.kind is MeasurementKind.CONFIRM), default=0),
        protocol.confirm_seconds(tuned_s), window,
    )  # fmt: skip


@contextmanager
def lengthened(target: Target, window: RoundWindow | None) -> Iterator[None]:
    """The target measures with ``window``'s warm-up and window inside, its own after."""
    before = target.measurement_window() if window is not None else None
    if window is None or before is None:
        yield
        return
    target.set_measurement_window(window.warmup_s, window.measure_s)
    try:
        yield
    finally:
        target.set_measurement_window(*before)


#: The most rounds a sequential estimate runs when ``grow_to`` sets no limit.
MAX_ROUNDS = 100
#: The most a confirmation round's measurement is lengthened (``round_window``).
MOST_LONGER = 4


@dataclass(frozen=True)
class RoundWindow:
    """A confirmation round's measurement (``round_window``): ``warmup_s`` then
    ``measure_s``, ``factor`` times the trials' window, and why, for people."""

    warmup_s: float
    measure_s: float
    factor: int
    reason: str


def chosen_window(
    protocol: MeasurementProtocol,
    target: Target,
    spec: StudySpec,
    trials: Sequence[Trial],
    measurements: Sequence[Measurement],
) -> RoundWindow | None:
    """``round_window`` where the protocol asks for it (``confirm_window = "noise"``),
    logged; else None (the target's own window)."""
    if protocol.confirm_window != "noise":
        return None
    window = round_window(target, spec, trials, measurements)
    if window is not None:
        log.info(
            "confirmation rounds: %.3g s after %.3g s of warm-up (%s)",
            window.measure_s, window.warmup_s, window.reason,
        )  # fmt: skip
    return window


def round_window(
    target: Target, spec: StudySpec, trials: Sequence[Trial], measurements: Sequence[Measurement]
) -> RoundWindow | None:
    """A confirmation round's warm-up and window, from the noise the session measured
    (``[session] confirm_window = "noise"``); None for a target whose measurement cannot be
    lengthened.

    The window: ``tuner.measurement_stats.window_factor`` from the run-to-run noise of the
    objective (the default's repeats and controls, ``machine_noise``), its noise from window
    to window within the trials' runs (their stored progress windows), and what a run costs
    besides its window (the trials' median time per measurement less the window). The
    warm-up: one window longer when the trials' first windows differ from their later ones
    beyond their scatter (the measurement started before the system had settled). Without
    progress windows or a measured noise, the trials' own."""
    base = target.measurement_window()
    if base is None:
        return None
    warmup, measure = base
    name = spec.objective.name
    default = next((t.id for t in trials if t.step is StepKind.DEFAULT), None)
    run = machine_noise(spec, measurements, default).get(name)
    runs: dict[int, list[float]] = {}
    for m in measurements:
        value = m.metrics.get(name)
        if m.kind is MeasurementKind.PROGRESS and value is not None and value > 0:
            runs.setdefault(m.trial_id, []).append(value)
    groups = [v for v in runs.values() if len(v) >= 2]
    within = pooled_log_variance(groups)
    if run is None or within is None:
        return RoundWindow(warmup, measure, 1, "no noise or windows measured: the trials' window")
    windows = int(statistics.median(len(v) for v in groups))
    spent = [
        (t.updated_at - t.created_at) / max(t.repeats, 1) for t in trials
        if t.status is TrialStatus.COMPLETED and t.updated_at > t.created_at
    ]  # fmt: skip
    overhead = max(statistics.median(spent) - measure, 0.0) if spent else warmup
    factor = window_factor(run[0], within[0], windows, measure, overhead, MOST_LONGER)
    why = (
        f"{factor}x the trials' window: the noise averages within a run" if factor > 1 else
        "the trials' window: the noise is between runs, so more rounds, not longer ones"
    )  # fmt: skip
    shifts = [math.log(v[0]) - statistics.fmean(math.log(x) for x in v[1:])
              for v in groups if len(v) >= 3]  # fmt: skip
    if len(shifts) >= 3:
        spread = statistics.stdev(shifts) / math.sqrt(len(shifts))
        if abs(statistics.fmean(shifts)) > 2 * spread:
            warmup += measure / windows
            why += "; one window more of warm-up: the first windows differ from the rest"
    return RoundWindow(warmup, measure * factor, factor, why)


@dataclass(frozen=True)
class _Limit:
    """When an estimate stops adding rounds (``confirm``'s ``grow_to``, ``width``,
    ``max_seconds`` and the study's rule)."""

    sequential: bool
    grow_to: int
    width: float
    max_seconds: float

    def more(self, found: Confirmation, rounds: int, seconds: float) -> bool:
        """Whether to run one more round after ``rounds`` that gave ``found``."""
        interval = found.interval
        if interval is None:
            return False
        if not self.sequential:  # on precision only: the t interval stays unbiased
            return rounds < self.grow_to and interval.high > self.width * interval.low
        if interval.significant or (self.max_seconds and seconds >= self.max_seconds):
            return False
        wide = not math.isfinite(interval.high) or interval.high > self.width * interval.low
        return wide and rounds < (self.grow_to or MAX_ROUNDS)


class _Rounds:
    """Runs interleaved rounds for ``confirm``, numbering rounds on across calls."""

    def __init__(
        self,
        target: Target,
        spec: StudySpec,
        store: Callable[[int, Measurement], None] | None,
        on_measure: Callable[[int, int], None] | None,
        total: int,
        first_round: int = 0,
    ) -> None:
        self.target, self.spec, self.store, self.on_measure = target, spec, store, on_measure
        self.total, self.done, self.round = total, 0, first_round

    def run(self, runs: Sequence[Trial], rounds: int) -> tuple[Remeasured, ...]:
        """``rounds`` rounds of ``runs``, in ABBA order: drift within rounds cancels."""
        name = self.spec.objective.name
        got: dict[int, list[dict[str, float] | None]] = {t.id: [] for t in runs}
        reasons: dict[int, list[str]] = {t.id: [] for t in runs}
        for _ in range(rounds):
            self.round += 1  # odd rounds in order, even ones reversed, across calls
            for trial in runs if self.round % 2 else runs[::-1]:
                outcome = self.target.run_trial(trial.config)
                if outcome.status is TrialStatus.COMPLETED and name in outcome.metrics:
                    got[trial.id].append(dict(outcome.metrics))
                    if self.store is not None:
                        self.store(trial.id, Measurement(
                            dict(outcome.metrics), MeasurementKind.CONFIRM, time.time(),
                            self.round,
                        ))  # fmt: skip
                else:
                    got[trial.id].append(None)
                    reasons[trial.id].append(f"{outcome.status.value}: {outcome.reason}"[:200])
                self.done += 1
                if self.on_measure is not None:
                    self.on_measure(self.done, self.total)
        return tuple(
            Remeasured(
                trial,
                tuple(got[trial.id]),
                tuple(meets(self.spec, m) for m in got[trial.id]),
                tuple(reasons[trial.id]),
                name,
            )
            for trial in runs
        )

    def estimate(
        self,
        runs: Sequence[Trial],
        rounds: int,
        limit: _Limit,
        noise: Mapping[str, tuple[float, int]] | None,
    ) -> Confirmation:
        """``rounds`` rounds of ``runs`` judged (the default first, when ``runs`` has it),
        then one more at a time while ``limit`` says so: with the fixed rule while the
        best's interval is wider than the width, up to ``grow_to`` in all (rounds are added
        on how precise the estimate is, never on what it says, so stopping does not bias
        it); with the sequential rule while its confidence sequence includes 1 and is
        wide, which may stop on what it says."""
        has_default = bool(runs) and runs[0].step is StepKind.DEFAULT
        started = time.monotonic()
        sequential = limit.sequential

        def judged(measured: tuple[Remeasured, ...]) -> Confirmation:
            return judge(self.spec, measured, has_default, noise, sequential=sequential)

        measured = self.run(runs, rounds)
        found = judged(measured)
        while measured and limit.more(found, len(measured[0].rounds), time.monotonic() - started):
            self.total += len(runs)
            more = self.run(runs, 1)
            measured = tuple(joined(a, b) for a, b in zip(measured, more, strict=True))
            found = judged(measured)
        if sequential:
            found = replace(found, stopped=stop_reason(found.interval, limit.width))
        return found
