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

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from runner.measurement import MeasurementProtocol
from targets.base import Target
from tuner.confirmation import (
    Confirmation,
    Remeasured,
    joined,
    judge,
    meets,
    stop_reason,
    with_selection,
)
from tuner.study import StudySpec
from tuner.trial import (
    Measurement,
    MeasurementKind,
    StepKind,
    Trial,
    TrialStatus,
    with_resolved_constraints,
)


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

    With ``spec.stopping.confirm = "sequential"`` the estimate runs ``rounds`` rounds,
    then one at a time while its interval (a confidence sequence) includes 1 and is wider
    than ``width``, up to ``grow_to`` rounds (``MAX_ROUNDS`` when 0) and ``max_seconds``;
    the confirmation says why it stopped (``Confirmation.stopped``).
    """
    spec = with_resolved_constraints(spec, trials)
    default = next((t for t in trials if t.step is StepKind.DEFAULT), None)
    ranked = list(candidates)[:top]
    base = [default] if default is not None else []
    two = default is not None and select > 0 and len(ranked) > 1
    total = (select * (1 + len(ranked)) + rounds * 2) if two else rounds * (len(base) + len(ranked))
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


#: The most rounds a sequential estimate runs when ``grow_to`` sets no limit.
MAX_ROUNDS = 100


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
