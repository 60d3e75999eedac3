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
from dataclasses import dataclass, field, replace

from targets.base import Target, TrialOutcome
from tuner.errors import ValidationError
from tuner.measurement_stats import (
    RatioInterval,
    pooled_log_variance,
    ratio_interval,
    unstable,
)
from tuner.space import Config
from tuner.study import Goal, StudySpec
from tuner.trial import (
    Measurement,
    MeasurementKind,
    StepKind,
    Trial,
    TrialStatus,
    is_feasible,
    with_resolved_constraints,
)

log = logging.getLogger(__name__)

#: Standard errors of the pooled noise by which a trial may trail the incumbent and still
#: be measured again: two, the usual one-sided ~98 % bound of a race.
RACE_Z = 2.0

MAX_REPEATS = 100
#: Measurements of the default that make its spread the yardstick of ``machine_noise``.
MIN_REFERENCE = 3


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


def pooled_noise(
    spec: StudySpec, measurements: Sequence[Measurement], exclude: int | None = None
) -> dict[str, tuple[float, int]]:
    """Per study metric: the pooled variance of log values within each trial's repeats and
    controls, and its degrees of freedom (a metric without two repeats anywhere is left
    out). ``exclude``: a trial whose own measurements must not count (``unstable`` tests a
    trial against the others)."""
    out: dict[str, tuple[float, int]] = {}
    kinds = (MeasurementKind.REPEAT, MeasurementKind.CONTROL)
    for name in spec.metric_names:
        groups: dict[int, list[float]] = {}
        for m in measurements:
            value = m.metrics.get(name)
            if m.kind in kinds and m.trial_id != exclude and value is not None and value > 0:
                groups.setdefault(m.trial_id, []).append(value)
        pooled = pooled_log_variance(list(groups.values()))
        if pooled is not None:
            out[name] = pooled
    return out


def machine_noise(
    spec: StudySpec,
    measurements: Sequence[Measurement],
    default: int | None,
    exclude: int | None = None,
) -> dict[str, tuple[float, int]]:
    """The yardstick of ``unstable``: the spread of the default configuration's repeats and
    controls (the one configuration measured all through the session, so its spread is the
    machine's) when it has ``MIN_REFERENCE`` of them, else the pooled noise of every trial
    but ``exclude``. Other trials' spreads are a poor yardstick: when many configurations
    are unstable, they would hide each other."""
    own = [m for m in measurements if default is not None and m.trial_id == default]
    if len(own) >= MIN_REFERENCE:
        return pooled_noise(spec, own)
    return pooled_noise(spec, measurements, exclude=exclude)


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


@dataclass(frozen=True)
class Remeasured:
    """One configuration measured again, round by round, in a confirmation.

    Attributes:
        trial: The study's trial whose configuration was re-run.
        rounds: Per round, the metrics when the run COMPLETED, else None.
        reasons: Why the other runs do not count (status and reason).
        feasible: Per round, whether the run met every outcome constraint.
    """

    trial: Trial
    rounds: tuple[dict[str, float] | None, ...]
    feasible: tuple[bool, ...]
    reasons: tuple[str, ...] = ()
    objective: str = ""

    @property
    def repeats(self) -> int:
        return len(self.rounds)

    @property
    def values(self) -> tuple[float, ...]:
        """The objective of each round that was feasible, in order."""
        return tuple(
            r[self.objective] for r, ok in zip(self.rounds, self.feasible, strict=True) if ok and r
        )

    @property
    def mean(self) -> float | None:
        return math.fsum(self.values) / len(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        n = len(self.values)
        if n < 2 or self.mean is None:
            return None
        return math.sqrt(math.fsum((v - self.mean) ** 2 for v in self.values) / (n - 1))

    def metric_mean(self, name: str) -> float | None:
        """The mean of ``name`` over the rounds that COMPLETED (feasible or not)."""
        got = [r[name] for r in self.rounds if r and name in r]
        return math.fsum(got) / len(got) if got else None


@dataclass(frozen=True)
class Confirmation:
    """The outcome of ``confirm``.

    Attributes:
        measured: The rounds that estimate the headline: the default first (when there is
            one), then the chosen candidate (or, without a selection, every candidate).
        best: The candidate with the best paired ratio among those feasible in every round
            and not unstable (by its mean when there is no default).
        interval: ``best`` against the default: the paired ratio with its 95 % interval,
            from the ``measured`` rounds only.
        default_feasible: Whether the default met the outcome constraints in every round.
        unstable: Trial ids of candidates whose rounds disagreed beyond the measured noise.
        intervals: The interval against the default of every candidate in ``measured``,
            by trial id.
        selection: The rounds that chose the candidate: the default first, then every
            candidate (empty when the same rounds chose and estimated).
        selection_intervals: Each candidate's interval from the selection rounds.
    """

    measured: tuple[Remeasured, ...]
    best: Remeasured | None
    interval: RatioInterval | None
    default_feasible: bool = True
    unstable: tuple[int, ...] = ()
    intervals: dict[int, RatioInterval] = field(default_factory=dict)
    selection: tuple[Remeasured, ...] = ()
    selection_intervals: dict[int, RatioInterval] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return None if self.interval is None else self.interval.ratio

    @property
    def significant(self) -> bool:
        """The interval lies wholly above 1: the best beat the default beyond the noise."""
        return self.interval is not None and self.interval.low > 1.0

    @property
    def default(self) -> Remeasured | None:
        first = self.measured[0] if self.measured else None
        return first if first is not None and first.trial.step is StepKind.DEFAULT else None

    def kept(self, goal: Goal) -> Trial | None:
        """What to report when no candidate was confirmed (``best`` is None): the default
        when it met the constraints in every round (nothing beat it); else the candidate
        that met them in the largest share of its rounds over both phases (a stable one
        before an unstable one, then by its mean over those rounds); None when nothing met
        them in any round. With ``best``, that."""
        if self.best is not None:
            return self.best.trial
        if self.default is not None and self.default_feasible:
            return self.default.trial
        rounds: dict[int, list[tuple[bool, float | None]]] = {}
        trials: dict[int, Trial] = {}
        for m in (*self.selection, *self.measured):
            if m.trial.step is StepKind.DEFAULT:
                continue
            trials[m.trial.id] = m.trial
            rounds.setdefault(m.trial.id, []).extend(
                (ok, r[m.objective] if ok and r else None)
                for r, ok in zip(m.rounds, m.feasible, strict=True)
            )
        sign = 1.0 if goal is Goal.MAXIMIZE else -1.0

        def key(tid: int) -> tuple[float, bool, float]:
            got = rounds[tid]
            values = [v for ok, v in got if ok and v is not None]
            share = len(values) / len(got)
            return share, tid not in self.unstable, sign * math.fsum(values) / len(values)

        among = [tid for tid, got in rounds.items() if any(ok for ok, _ in got)]
        return trials[max(among, key=key)] if among else None


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
) -> Confirmation:
    """Compare the first ``top`` of ``candidates`` (best first: ``runner.session.ranked``)
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
    """
    spec = with_resolved_constraints(spec, trials)
    default = next((t for t in trials if t.step is StepKind.DEFAULT), None)
    ranked = list(candidates)[:top]
    base = [default] if default is not None else []
    two = default is not None and select > 0 and len(ranked) > 1
    total = (select * (1 + len(ranked)) + rounds * 2) if two else rounds * (len(base) + len(ranked))
    runner = _Rounds(target, spec, store, on_measure, total)
    if not two:
        return runner.estimate(base + ranked, rounds, grow_to, width, noise)
    selection = runner.run(base + ranked, select)
    chose = _judge(spec, selection, True, noise, choosing=True)
    if chose.best is None:
        return replace(
            chose, measured=selection[:1], intervals={}, selection=selection,
            selection_intervals=chose.intervals,
        )  # fmt: skip
    pair: list[Trial] = [default, chose.best.trial]  # type: ignore[list-item]
    found = runner.estimate(pair, rounds, grow_to, width, noise)
    return _with_selection(found, chose, selection)


def stored_confirmation(
    spec: StudySpec, trials: Sequence[Trial], measurements: Sequence[Measurement]
) -> Confirmation | None:
    """The study's confirmation rebuilt from its stored CONFIRM measurements (None without
    any), as ``confirm`` judged it: ``tuner best`` and ``GetBestTrial`` read it back.

    The estimate is the trailing rounds that ran only the default and one candidate (the
    chosen one); earlier rounds are the selection. Without a default, or when every round
    ran several candidates, all rounds both chose and estimated.
    """
    rows = [m for m in measurements if m.kind is MeasurementKind.CONFIRM]
    if not rows:
        return None
    spec = with_resolved_constraints(spec, trials)
    by_id = {t.id: t for t in trials}
    default = next((t for t in trials if t.step is StepKind.DEFAULT), None)
    base = {default.id} if default is not None else set()
    rounds = sorted({m.round for m in rows})
    ran = {r: {m.trial_id for m in rows if m.round == r} - base for r in rounds}
    first = 0
    if default is not None:
        chosen = next((ran[r] for r in reversed(rounds) if len(ran[r]) == 1), None)
        first = len(rounds)
        while chosen is not None and first > 0 and ran[rounds[first - 1]] <= chosen:
            first -= 1
        if first == len(rounds) or chosen is None:
            first = 0

    got = {(m.trial_id, m.round): dict(m.metrics) for m in rows}

    def remeasured(ids: Sequence[int], among: Sequence[int]) -> tuple[Remeasured, ...]:
        out = []
        for i in ids:
            values = tuple(got.get((i, r)) for r in among)
            feasible = tuple(_meets(spec, v) for v in values)
            out.append(Remeasured(by_id[i], values, feasible, (), spec.objective.name))
        return tuple(out)

    def ids(among: Sequence[int]) -> list[int]:
        seen = sorted(set().union(*(ran[r] for r in among)) & set(by_id))
        return [*base, *seen]

    noise = machine_noise(spec, measurements, None if default is None else default.id)
    estimate = rounds[first:]
    found = _judge(spec, remeasured(ids(estimate), estimate), default is not None, noise)
    if not first:
        return found
    selection = remeasured(ids(rounds[:first]), rounds[:first])
    chose = _judge(spec, selection, True, noise, choosing=True)
    return _with_selection(found, chose, selection)


def _with_selection(
    found: Confirmation, chose: Confirmation, selection: tuple[Remeasured, ...]
) -> Confirmation:
    """The estimate ``found`` with the selection rounds that chose its candidate (``chose``,
    their judgement): the default must have been feasible in both, and a candidate
    unstable in either is flagged."""
    return replace(
        found,
        default_feasible=found.default_feasible and chose.default_feasible,
        unstable=tuple(sorted({*chose.unstable, *found.unstable})),
        selection=selection,
        selection_intervals=chose.intervals,
    )


class _Rounds:
    """Runs interleaved rounds for ``confirm``, numbering rounds on across calls."""

    def __init__(
        self,
        target: Target,
        spec: StudySpec,
        store: Callable[[int, Measurement], None] | None,
        on_measure: Callable[[int, int], None] | None,
        total: int,
    ) -> None:
        self.target, self.spec, self.store, self.on_measure = target, spec, store, on_measure
        self.total, self.done, self.round = total, 0, 0

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
                tuple(_meets(self.spec, m) for m in got[trial.id]),
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
        found = _judge(self.spec, measured, has_default, noise)
        while (
            measured
            and len(measured[0].rounds) < grow_to
            and found.interval is not None
            and found.interval.high > width * found.interval.low
        ):
            self.total += len(runs)
            more = self.run(runs, 1)
            measured = tuple(_joined(a, b) for a, b in zip(measured, more, strict=True))
            found = _judge(self.spec, measured, has_default, noise)
        return found


def _joined(first: Remeasured, then: Remeasured) -> Remeasured:
    """One configuration's rounds of ``first`` followed by those of ``then``."""
    return replace(
        first,
        rounds=first.rounds + then.rounds,
        feasible=first.feasible + then.feasible,
        reasons=first.reasons + then.reasons,
    )


def _judge(
    spec: StudySpec,
    measured: tuple[Remeasured, ...],
    has_default: bool,
    noise: Mapping[str, tuple[float, int]] | None,
    choosing: bool = False,
) -> Confirmation:
    """The best of ``measured`` (the default first when ``has_default``) by its paired
    ratio to the default, among those feasible in every round and not unstable. Only when
    ``choosing`` may the best have a single paired round (and so no interval)."""
    name = spec.objective.name
    sign = 1.0 if spec.objective.goal is Goal.MAXIMIZE else -1.0
    base = measured[0] if has_default else None
    others = measured[1:] if has_default else measured
    flagged = tuple(
        m.trial.id
        for m in others
        if noise is not None and name in noise and len(m.values) > 1
        and unstable(m.values, noise[name])
    )  # fmt: skip
    eligible = [m for m in others if all(m.feasible) and m.trial.id not in flagged]
    intervals: dict[int, RatioInterval] = {}
    scores: dict[int, float] = {}
    if base is not None:
        for m in others:
            paired = [
                (b[name], c[name])
                for b, c in zip(base.rounds, m.rounds, strict=True)
                if b is not None and c is not None and b[name] > 0 and c[name] > 0
            ]
            if paired:  # the geometric mean of the paired ratios, one round or more
                scores[m.trial.id] = sign * math.fsum(math.log(c / b) for b, c in paired)
                scores[m.trial.id] /= len(paired)
            found = ratio_interval(
                [b for b, _ in paired], [c for _, c in paired],
                maximize=spec.objective.goal is Goal.MAXIMIZE,
            ) if len(paired) >= 2 else None  # fmt: skip
            if found is not None:
                intervals[m.trial.id] = found
        best = max(
            (m for m in eligible if m.trial.id in (scores if choosing else intervals)),
            key=lambda m: scores[m.trial.id],
            default=None,
        )
    else:
        best = max(eligible, key=lambda m: sign * (m.mean or 0.0), default=None)
    return Confirmation(
        measured,
        best,
        intervals.get(best.trial.id) if best is not None else None,
        base is None or all(base.feasible),
        flagged,
        intervals,
    )


def _meets(spec: StudySpec, metrics: dict[str, float] | None) -> bool:
    if metrics is None:
        return False
    return is_feasible(spec, Trial(0, {}, TrialStatus.COMPLETED, metrics))
