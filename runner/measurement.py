"""The measurement protocol of a session: repeats, interleaved controls, and a confirmation.

One measurement of a real system on a shared machine can be off by more than the knobs
change: TUNA (Freischuetz et al., EuroSys 2025) found that 5 % measurement noise slows
tuning 2.5x and that up to 63 % of configurations picked as best lose 30 % or more when
deployed. So every target is measured through one protocol, the same for a CLI session and
the daemon, not one per adapter:

* **Repeats.** Each trial runs ``repeats`` times; with ``max_repeats`` above that, a trial
  whose measurements so far could still beat the incumbent (its upper bound, two standard
  errors of the study's pooled noise above its mean, reaches the incumbent's mean, and its
  constrained metrics could still meet their bounds) runs again, up to ``max_repeats``:
  cheap single measurements for the many poor configurations, more for the few promising
  ones (TUNA's multi-fidelity idea; a racing rule after Maron & Moore's Hoeffding races).
  The default configuration, everyone's reference, always gets ``max_repeats``. Every
  repeat is stored; the trial's metrics are their means.
* **Controls.** Every ``control_every`` trials the default configuration runs again and is
  stored as a CONTROL measurement of the default trial. A changed machine shows as a
  change of the control series (``tuner.measurement_stats.drift``), whatever the knobs did.
* **Confirmation.** The session ends by measuring the default and the best few candidates
  back to back within each round and in alternating order, so that drift touches each pair
  alike. First ``confirm_select`` rounds choose one candidate by its paired per-round
  ratios to the default; then ``confirm`` fresh rounds of the default and that candidate
  alone give the headline ratio with a 95 % interval (``ratio_interval``). Choosing and
  estimating on separate rounds keeps the headline unbiased: the largest of three ratios
  measured on the same rounds overstates the chosen one's (the winner's curse; bench.noise
  measured +6-8 % on SQLite when one set of rounds did both). A candidate that is not
  feasible in every round, or whose rounds disagree beyond the measured noise
  (``unstable``), is not the best. While the headline's interval is wider than
  ``confirm_width`` (its high end over its low end), the estimate runs more rounds, up to
  ``confirm_max`` in all: a noisy machine pays for the precision a quiet one gets free.

The noise the rules use is pooled over the study's repeated measurements on the log scale
(systems noise is multiplicative), per metric (``pooled_noise``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from targets.base import Target, TrialOutcome
from tuner.confirmation import (
    Confirmation,
    Remeasured,
    joined,
    judge,
    meets,
    with_selection,
)
from tuner.errors import ValidationError
from tuner.space import Config
from tuner.study import Goal, StudySpec
from tuner.trial import (
    Measurement,
    MeasurementKind,
    StepKind,
    Trial,
    TrialStatus,
    with_resolved_constraints,
)

log = logging.getLogger(__name__)

#: Standard errors of the pooled noise by which a trial may trail the incumbent and still
#: be measured again: two, the usual one-sided ~98 % bound of a race.
RACE_Z = 2.0

MAX_REPEATS = 100


@dataclass(frozen=True)
class MeasurementProtocol:
    """How a session measures (``[session]`` keys of the same names).

    Attributes:
        repeats: Measurements of every trial.
        max_repeats: Measurements of a promising trial, and of the default (0: ``repeats``).
        control_every: Re-measure the default after every this many trials (0: never).
        confirm: Rounds of the closing confirmation (0: none).
        confirm_top: Candidates the confirmation measures against the default.
        confirm_select: Rounds that choose one of the ``confirm_top`` candidates before
            the ``confirm`` rounds estimate its ratio (0: the same rounds choose and
            estimate, which overstates the chosen one's ratio).
        confirm_max: Rounds the estimate may grow to while its interval is wider than
            ``confirm_width`` (0, or at most ``confirm``: exactly ``confirm`` rounds).
        confirm_width: The widest headline interval, its high end over its low end, at
            which the estimate stops adding rounds.
    """

    repeats: int = 1
    max_repeats: int = 0
    control_every: int = 0
    confirm: int = 0
    confirm_top: int = 3
    confirm_select: int = 0
    confirm_max: int = 0
    confirm_width: float = 1.5

    def __post_init__(self) -> None:
        limits = {
            "repeats": (1, MAX_REPEATS),
            "max_repeats": (0, MAX_REPEATS),
            "control_every": (0, 10_000),
            "confirm": (0, MAX_REPEATS),
            "confirm_top": (1, 20),
            "confirm_select": (0, MAX_REPEATS),
            "confirm_max": (0, MAX_REPEATS),
        }
        for name, (low, high) in limits.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValidationError(
                    f"session.{name}", f"got {value!r}", f"an integer in [{low}, {high}]"
                )
        if self.max_repeats and self.max_repeats < self.repeats:
            raise ValidationError(
                "session.max_repeats",
                f"got {self.max_repeats}, fewer than session.repeats = {self.repeats}",
                f"0 (no adaptive repeats) or an integer in [{self.repeats}, {MAX_REPEATS}]",
            )
        width = self.confirm_width
        if isinstance(width, bool) or not isinstance(width, int | float) or not 1 < width <= 100:
            raise ValidationError("session.confirm_width", f"got {width!r}", "a number in (1, 100]")

    @property
    def most(self) -> int:
        """The most measurements one trial gets."""
        return max(self.repeats, self.max_repeats)


#: A session's measurement protocol when ``[session]`` says nothing: one measurement per
#: trial, the default again every five trials (the controls), and a confirmation: two
#: rounds choose among the three best, five fresh rounds estimate the chosen one's ratio. A
#: single sample is never the headline. Racing repeats (``max_repeats`` above 1) are off: on
#: the develop halves of bench.noise (SQLite, seeds 0-4) and of the suite's DB noisy twins
#: (seeds 0-3) single samples with the confirmation found better configurations at the same
#: number of measurements (bench/NOTES.md, "Racing repeats off by default").
DEFAULT_PROTOCOL = MeasurementProtocol(
    repeats=1, max_repeats=1, control_every=5, confirm=5, confirm_top=3, confirm_select=2
)


@dataclass(frozen=True)
class Measured:
    """The outcome of measuring one trial by the protocol.

    ``status`` is COMPLETED when every repeat completed (or an infrastructure failure cut
    the repeats short after at least one completed); the first other outcome otherwise.
    """

    status: TrialStatus
    repeats: tuple[Measurement, ...] = ()
    reason: str = ""


def could_win(
    spec: StudySpec,
    values: Sequence[Mapping[str, float]],
    incumbent: Mapping[str, float] | None,
    noise: Mapping[str, tuple[float, int]],
) -> bool:
    """Whether a trial measured ``values`` so far might still beat ``incumbent`` (the best
    feasible trial's mean metrics; None when nothing is feasible yet) and meet every
    outcome constraint, within ``RACE_Z`` standard errors of ``noise``. A metric whose noise
    is unknown, or whose values are not all positive, never rules the trial out."""

    def bound(name: str, upper: bool) -> float | None:
        """The trial's mean of ``name`` moved RACE_Z standard errors up (or down)."""
        samples = [v[name] for v in values]
        if name not in noise or min(samples) <= 0:
            return None
        mean = math.fsum(samples) / len(samples)
        step = RACE_Z * math.sqrt(noise[name][0] / len(samples))
        return mean * math.exp(step if upper else -step)

    for constraint in spec.outcome_constraints:
        if constraint.relative:
            continue
        reach = bound(constraint.metric, upper=constraint.op == ">=")
        if reach is not None and not constraint.satisfied(reach):
            return False
    objective = spec.objective
    if incumbent is None or objective.name not in incumbent:
        return True
    reach = bound(objective.name, upper=objective.goal is Goal.MAXIMIZE)
    return reach is None or not objective.better(incumbent[objective.name], reach)


def measure(
    target: Target,
    config: Config,
    repeats: int,
    more: Callable[[list[Mapping[str, float]]], bool] | None = None,
    most: int = 0,
) -> Measured:
    """Run ``config`` ``repeats`` times, then again while ``more(values so far)`` says so,
    up to ``most`` times in all.

    The first outcome that is not COMPLETED ends the repeats: INFEASIBLE and TIMED_OUT (the
    configuration's doing, even after good repeats: it is not stable) and FAILED with no
    repeat completed become the trial's outcome; a FAILED repeat after completed ones (the
    machine's doing) keeps those.
    """
    done: list[Measurement] = []
    while True:
        outcome: TrialOutcome = target.run_trial(config)
        if outcome.status is not TrialStatus.COMPLETED:
            if outcome.status is TrialStatus.FAILED and done:
                log.warning("repeat %d failed (%s); keeping %d", len(done) + 1,
                            outcome.reason, len(done))  # fmt: skip
                break
            prefix = f"repeat {len(done) + 1}: " if done else ""
            return Measured(outcome.status, (), prefix + outcome.reason)
        done.append(Measurement(dict(outcome.metrics), at=time.time()))
        if len(done) >= max(repeats, most):
            break
        if len(done) >= repeats and (more is None or not more([m.metrics for m in done])):
            break
    return Measured(TrialStatus.COMPLETED, tuple(done))


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
    """
    spec = with_resolved_constraints(spec, trials)
    default = next((t for t in trials if t.step is StepKind.DEFAULT), None)
    ranked = list(candidates)[:top]
    base = [default] if default is not None else []
    two = default is not None and select > 0 and len(ranked) > 1
    total = (select * (1 + len(ranked)) + rounds * 2) if two else rounds * (len(base) + len(ranked))
    runner = _Rounds(target, spec, store, on_measure, total, first_round)
    if not two:
        return runner.estimate(base + ranked, rounds, grow_to, width, noise)
    selection = runner.run(base + ranked, select)
    chose = judge(spec, selection, True, noise, choosing=True)
    if chose.best is None:
        return replace(
            chose, measured=selection[:1], intervals={}, selection=selection,
            selection_intervals=chose.intervals,
        )  # fmt: skip
    pair: list[Trial] = [default, chose.best.trial]  # type: ignore[list-item]
    found = runner.estimate(pair, rounds, grow_to, width, noise)
    return with_selection(found, chose, selection)


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
        grow_to: int,
        width: float,
        noise: Mapping[str, tuple[float, int]] | None,
    ) -> Confirmation:
        """``rounds`` rounds of ``runs`` judged (the default first, when ``runs`` has it),
        then one more at a time, up to ``grow_to`` in all, while the best's interval is
        wider than ``width``: rounds are added on how precise the estimate is, never on
        what it says, so stopping does not bias it."""
        has_default = bool(runs) and runs[0].step is StepKind.DEFAULT
        measured = self.run(runs, rounds)
        found = judge(self.spec, measured, has_default, noise)
        while (
            measured
            and len(measured[0].rounds) < grow_to
            and found.interval is not None
            and found.interval.high > width * found.interval.low
        ):
            self.total += len(runs)
            more = self.run(runs, 1)
            measured = tuple(joined(a, b) for a, b in zip(measured, more, strict=True))
            found = judge(self.spec, measured, has_default, noise)
        return found
