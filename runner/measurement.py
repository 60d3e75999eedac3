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

* **Windows** (the daemon's trials, ``measure_windows``): the configuration is applied once
  and measured window after window (one ``Target.measure()`` each, each stored as a repeat);
  a window that breaks the SLO ends the trial at once with that window, and the system is
  rolled back before anything else runs.

The closing confirmation is ``runner.confirm``. One routine measures the default as a
control for sessions and the daemon alike (``control``). The noise the rules use is pooled
over the study's repeated measurements on the log scale (systems noise is
multiplicative), per metric (``pooled_noise``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from targets.base import Progress, Target, TrialOutcome, outcome_of
from tuner.errors import TargetError, ValidationError
from tuner.space import Config
from tuner.study import Goal, StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, Trial, TrialStatus

log = logging.getLogger(__name__)

#: Standard errors of the pooled noise by which a trial may trail the incumbent and still
#: be measured again: two, the usual one-sided ~98 % bound of a race.
RACE_Z = 2.0

MAX_REPEATS = 100


#: How a confirmation round's window is chosen (``MeasurementProtocol.confirm_window``).
CONFIRM_WINDOWS = ("trials", "noise")


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
            ``confirm_width`` (0, or at most ``confirm``: exactly ``confirm`` rounds); with
            the study's sequential rule, the most rounds it runs (0: 100).
        confirm_width: The widest headline interval, its high end over its low end, at
            which the estimate stops adding rounds.
        confirm_share: With the study's sequential rule (``[study.stopping] confirm =
            "sequential"``), the most of the session's time its confirmation may take: no
            round starts once the estimate has run ``share / (1 - share)`` times as long as
            the trials took (0: no limit but ``confirm_max``).
        confirm_window: A confirmation round's warm-up and window: ``trials``, the trials'
            own; ``noise``, chosen from the noise the session measured
            (``runner.confirm.round_window``: longer where the noise averages within a
            run, the warm-up longer where the first windows differ).
    """

    repeats: int = 1
    max_repeats: int = 0
    control_every: int = 0
    confirm: int = 0
    confirm_top: int = 3
    confirm_select: int = 0
    confirm_max: int = 0
    confirm_width: float = 1.5
    confirm_share: float = 0.5
    confirm_window: str = "trials"

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
        share = self.confirm_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 0.9:
            raise ValidationError(
                "session.confirm_share", f"got {share!r}", "a number in [0, 0.9] (0: no limit)"
            )
        if self.confirm_window not in CONFIRM_WINDOWS:
            raise ValidationError(
                "session.confirm_window", f"got {self.confirm_window!r}", CONFIRM_WINDOWS
            )

    def confirm_seconds(self, trials_s: float) -> float:
        """The longest a sequential estimate may run after trials that took ``trials_s``
        (``confirm_share``; 0: no limit)."""
        share = self.confirm_share
        return share / (1 - share) * trials_s if share else 0.0

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
#: number of measurements (bench/NOTES.md, "Racing repeats off by default"). A
#: confirmation round's window is chosen from the noise the session measured (issue 61's
#: develop cells: bench/NOTES.md, "Issue 61's decision").
DEFAULT_PROTOCOL = MeasurementProtocol(
    repeats=1,
    max_repeats=1,
    control_every=5,
    confirm=5,
    confirm_top=3,
    confirm_select=2,
    confirm_window="noise",
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
    #: The trial's metrics when they are not the means of ``repeats`` (a single measurement
    #: handed over as it is, or windows whose metric names differ); None: the repeats'.
    metrics: Mapping[str, float] | None = None


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
    progress: Progress | None = None,
) -> Measured:
    """Run ``config`` ``repeats`` times, then again while ``more(values so far)`` says so,
    up to ``most`` times in all; ``progress`` hears each window of every run
    (``Target.run_trial``).

    The first outcome that is not COMPLETED ends the repeats: INFEASIBLE and TIMED_OUT (the
    configuration's doing, even after good repeats: it is not stable) and FAILED with no
    repeat completed become the trial's outcome; a FAILED repeat after completed ones (the
    machine's doing) keeps those. A run ``progress`` stopped ends the trial EARLY_STOPPED,
    with every run measured so far as its repeats (the stopped one's partial metrics last).
    """
    done: list[Measurement] = []
    while True:
        outcome: TrialOutcome = target.run_trial(config, progress)
        if outcome.status is TrialStatus.EARLY_STOPPED:
            done.append(Measurement(dict(outcome.metrics), at=time.time()))
            return Measured(TrialStatus.EARLY_STOPPED, tuple(done), outcome.reason)
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


def measure_windows(
    target: Target,
    config: Config,
    windows: int,
    breach: Callable[[Mapping[str, float]], str],
    rollback: Callable[[bool, float], None],
    on_breach: Callable[[int, str, Mapping[str, float]], None] | None = None,
    progress: Progress | None = None,
) -> Measured:
    """Apply ``config`` once and measure it ``windows`` times (the daemon's trials).

    Each window is one repeat. A window for which ``breach(metrics)`` names a broken
    constraint ends the trial at once, COMPLETED with that window alone (infeasible by
    measurement, so the model learns from it); ``on_breach(window number, constraint,
    metrics)`` hears of it. Otherwise ``progress`` (the study's stop rule,
    ``runner.loop.reporter``) hears each window, and a reason from it ends the trial
    EARLY_STOPPED with the windows measured so far: a losing configuration leaves the
    system sooner, and is not a broken one. A target error ends the trial with the outcome
    it stands for (``targets.base.outcome_of``). The target is restored on every way out,
    and then ``rollback(broke, seconds the restore took)`` runs: ``broke`` is True when a
    breach or an error ended the trial.
    Windows whose metric names differ come back with their means as ``metrics``.
    """
    done: list[Measurement] = []
    broke = False
    try:
        target.apply(config)
        for index in range(windows):
            metrics = target.measure()
            done.append(Measurement(dict(metrics), at=time.time()))
            broken = breach(metrics)
            if broken:
                broke = True
                if on_breach is not None:
                    on_breach(index + 1, broken, metrics)
                return Measured(TrialStatus.COMPLETED, tuple(done[-1:]))
            stopped = progress(dict(metrics)) if progress is not None else ""
            if stopped and index + 1 < windows:
                return _windows_measured(done, TrialStatus.EARLY_STOPPED, stopped)
    except TargetError as exc:
        broke = True
        outcome = outcome_of(exc)
        return Measured(outcome.status, (), outcome.reason)
    finally:
        started = time.monotonic()
        try:
            target.restore()
        finally:
            rollback(broke, time.monotonic() - started)
    return _windows_measured(done, TrialStatus.COMPLETED)


def _windows_measured(done: list[Measurement], status: TrialStatus, reason: str = "") -> Measured:
    """``done`` windows as a trial's repeats, or their means where metric names differ."""
    if len({frozenset(m.metrics) for m in done}) > 1:
        return Measured(status, (), reason, metrics=_means([m.metrics for m in done]))
    return Measured(status, tuple(done), reason)


@dataclass(frozen=True)
class Control:
    """The default configuration measured once more (``control``).

    Attributes:
        metrics: What it measured; None when it did not complete (or did not run).
        reason: Why not, when ``metrics`` is None.
        default: The study's COMPLETED default trial the control was stored with (None:
            there is none, and nothing was stored).
    """

    metrics: dict[str, float] | None
    reason: str = ""
    default: Trial | None = None


class ControlAPI(Protocol):
    """The part of the service ``control`` needs."""

    def list_trials(self, study: str, statuses: Any = None) -> list[Trial]: ...

    def add_measurements(
        self, study: str, trial_id: int, measurements: Sequence[Measurement]
    ) -> list[Measurement]: ...


def control(
    api: ControlAPI, target: Target, spec: StudySpec, fallback: Config | None = None
) -> Control:
    """Run the default configuration once (apply, measure, restore) as a control and store
    it as a CONTROL measurement of the study's COMPLETED default trial.

    Without such a trial nothing is stored, and ``fallback`` (the knobs' defaults, say) is
    measured instead when given; otherwise nothing runs. Sessions (every ``control_every``
    trials) and the daemon (every ``control_every`` watch windows, and after an SLO
    breach) both call this; the daemon applies its configuration again afterwards.
    """
    default = next(
        (t for t in api.list_trials(spec.name, [TrialStatus.COMPLETED])
         if t.step is StepKind.DEFAULT),
        None,
    )  # fmt: skip
    config = default.config if default is not None else fallback
    if config is None:
        return Control(None, "the study has no completed default trial")
    outcome = target.run_trial(config)
    if outcome.status is not TrialStatus.COMPLETED:
        log.warning("control run of the default: %s (%s)", outcome.status.value, outcome.reason)
        return Control(None, f"{outcome.status.value}: {outcome.reason}", default)
    if default is not None:
        stored = Measurement(dict(outcome.metrics), MeasurementKind.CONTROL, time.time())
        api.add_measurements(spec.name, default.id, [stored])
    return Control(dict(outcome.metrics), "", default)


def _means(windows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per metric, the mean over the windows that reported it."""
    names = dict.fromkeys(k for w in windows for k in w)
    return {
        name: math.fsum(w[name] for w in windows if name in w) / sum(name in w for w in windows)
        for name in names
    }
