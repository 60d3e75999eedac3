"""Ending a trial early: the rule that stops a measurement which cannot win, and the
short-window screen.

A trial's measurement arrives as a stream of windows (``MeasurementKind.PROGRESS``: the
workload's metrics over each interval of the measured window). Once ``min_windows`` have
arrived, ``stop_reason`` asks of each judged metric how good the trial's full measurement
could still turn out, at a stated one-sided ``confidence``:

* the estimate is the mean log value of the **later half** of the windows (a warm-up that
  depresses the first windows does not count against the trial; on a steady trial the later
  half is as good an estimate as all of them);
* its uncertainty is the spread of those windows (``s^2 / n``) plus the study's measured
  run-to-run noise of a whole measurement (``tuner.confirmation.pooled_noise``: the
  machine's, which windows of one run do not show), on the log scale (systems noise is
  multiplicative), with Student's t quantile at the windows' ``n - 1`` degrees of freedom;
* the trial is stopped when even the favourable end of that interval breaks an absolute
  outcome constraint (``p95_ms <= 5`` and the windows say at least 18 ms), or, for a single
  objective, cannot beat the incumbent (the best feasible COMPLETED trial's mean).

The rule never judges a metric whose run-to-run noise the study has not measured yet (the
windows of one run cannot show it: a session measures it from its controls and repeats, so
the first trials before a control are never stopped), a metric with a non-positive value
(no log scale), or a relative constraint before it is resolved; the caller never asks it
about the default configuration or a confirmation run. A stopped trial is stored
EARLY_STOPPED with the metrics of the part it measured and the number of windows that part
had (``Trial.windows``, its fidelity); the model learns them as a measurement
(``TrialStatus.measured``) whose noise is ``W / w`` times a full one's (``w`` of ``W``
windows: ``designer/models/model.py``).

This is a race in the sense of Maron & Moore (1994, "Hoeffding races"), with the noise
model of ``runner.measurement.could_win``; Vizier's automated stopping
(``CheckTrialEarlyStoppingState``) and Optuna's pruners make the same decision from a
trial's intermediate values, against other trials' curves instead of a noise model.

The **screen** (``screen_windows``, ``screen_reason``) is the multi-fidelity step: once a
trial has exactly ``screen_windows`` windows, their means are ranked against every other
trial's first ``screen_windows`` windows, and only the best ``screen_keep`` share goes on
(or a trial ahead of the incumbent's first windows). It needs no noise estimate and saves
more time than the rule, at the risk of screening out a trial whose start was unlucky.
``decide`` applies both, as the service and the in-memory store answer a window.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.confirmation import pooled_noise
from tuner.errors import ValidationError
from tuner.quantiles import t_ppf
from tuner.study import StoppingSettings, StudySpec
from tuner.trial import (
    Measurement,
    MeasurementKind,
    StepKind,
    Trial,
    TrialStatus,
    best_trial,
    with_resolved_constraints,
)


@dataclass(frozen=True)
class Decision:
    """Whether an ACTIVE trial should stop now (``decide``).

    Attributes:
        stop: Stop measuring, and complete the trial EARLY_STOPPED with ``reason``.
        reason: Why (empty while the trial goes on).
        windows: Windows the trial reported so far.
    """

    stop: bool
    reason: str = ""
    windows: int = 0


def decide(
    spec: StudySpec, trial: Trial, trials: Sequence[Trial], measurements: Sequence[Measurement]
) -> Decision:
    """Whether ``trial`` (ACTIVE) should stop, from its PROGRESS windows among
    ``measurements`` and the study's ``trials`` (the incumbent) and noise: what the service
    answers to ReportProgress and ShouldStop, and the in-memory store the same: the rule
    (``stopping.early_stop``), then the screen (``stopping.screen_windows``, once, at that
    window). The default configuration's trial, and any trial of a study that stops
    nothing early, goes on."""
    windows = sorted(
        (m for m in measurements if m.trial_id == trial.id and m.kind is MeasurementKind.PROGRESS),
        key=lambda m: m.round,
    )
    count = len(windows)
    if not spec.stopping.stops or trial.step is StepKind.DEFAULT:
        return Decision(False, "", count)
    if trial.status is not TrialStatus.ACTIVE:
        return Decision(False, "", count)
    resolved = with_resolved_constraints(spec, trials)
    incumbent = best_trial(resolved, trials)
    reason = ""
    if spec.stopping.early_stop:
        noise = pooled_noise(resolved, measurements)
        reason = stop_reason(resolved, [m.metrics for m in windows], incumbent, noise)
    screen = spec.stopping.screen_windows
    if not reason and screen and count == screen:
        firsts = _first_windows(measurements, screen)
        others = [v for trial_id, v in firsts.items() if trial_id != trial.id]
        best = None if incumbent is None else firsts.get(incumbent.id)
        reason = screen_reason(resolved, firsts[trial.id], others, best)
    return Decision(bool(reason), reason, count)


def next_window(window: object, reported: int) -> int:
    """The number a reported window takes: ``window`` (1 to one past the ``reported``
    windows; up to ``reported`` is a retry), or the next one for 0.

    Raises:
        ValidationError: Not an integer, negative, or past the next window.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValidationError("window", f"got {window!r}", "0 (the next) or a window number >= 1")
    if window > reported + 1:
        raise ValidationError(
            "window", f"window {window} after {reported} reported windows",
            f"1 to {reported + 1} (the next), or 0 for the next",
        )  # fmt: skip
    return window or reported + 1


def screen_reason(
    spec: StudySpec,
    first: Mapping[str, float],
    others: Sequence[Mapping[str, float]],
    incumbent: Mapping[str, float] | None,
) -> str:
    """Why a trial whose first windows measured ``first`` (their means) is screened out, or
    "" to go on: it goes on while fewer than ``1 / screen_keep`` other trials reached the
    screen, when its first windows beat the incumbent's first windows, and when it ranks
    among the best ``screen_keep`` share of every trial at the screen (itself included) by
    the objective, those that break an absolute constraint last (successive halving at one
    rung, Jamieson & Talwalkar 2016; asynchronous, as ASHA, Li et al. 2020)."""
    settings = spec.stopping
    keep = settings.screen_keep
    if spec.multi_objective or len(others) < math.ceil(1 / keep):
        return ""
    objective = spec.objective
    name = objective.name
    if (
        incumbent is not None
        and name in incumbent
        and name in first
        and not objective.better(incumbent[name], first[name])
    ):
        return ""  # its first windows beat the best trial's
    ranked = sorted([first, *others], key=lambda m: _screen_key(spec, m))
    place = next(i for i, m in enumerate(ranked) if m is first) + 1
    allowed = math.ceil(keep * len(ranked))
    if place <= allowed:
        return ""
    value = first.get(objective.name, math.nan)
    return (
        f"screened out after {settings.screen_windows} windows: {objective.name} "
        f"{value:.4g} ranks {place} of {len(ranked)} trials' first windows (the best "
        f"{allowed} go on)"
    )


def _screen_key(spec: StudySpec, metrics: Mapping[str, float]) -> tuple[int, float]:
    """Sorts the best first: those that meet the absolute constraints, by the objective."""
    broken = any(
        not c.relative and c.metric in metrics and not c.satisfied(metrics[c.metric])
        for c in spec.outcome_constraints
    )
    value = metrics.get(spec.objective.name, math.nan)
    if not math.isfinite(value):
        return (2, 0.0)
    return (int(broken), -value if spec.objective.goal.value == "maximize" else value)


def _first_windows(measurements: Sequence[Measurement], count: int) -> dict[int, dict[str, float]]:
    """Per trial that reported at least ``count`` windows, the means of its first ``count``."""
    windows: dict[int, list[Measurement]] = {}
    for m in measurements:
        if m.kind is MeasurementKind.PROGRESS and 1 <= m.round <= count:
            windows.setdefault(m.trial_id, []).append(m)
    out = {}
    for trial_id, found in windows.items():
        if len(found) == count:
            names = set.intersection(*(set(m.metrics) for m in found))
            out[trial_id] = {n: statistics.fmean(m.metrics[n] for m in found) for n in names}
    return out


@dataclass(frozen=True)
class Bound:
    """How good a metric of the trial's full measurement could still be (``bound``)."""

    low: float
    high: float
    windows: int  # the windows the estimate used (the later half)


def bound(
    values: Sequence[float], noise: tuple[float, int] | None, confidence: float
) -> Bound | None:
    """The one-sided ``confidence`` bounds, below and above, of a metric's full measurement
    from its windows' ``values`` (module doc); None when a value is not positive or fewer
    than two windows are in the later half."""
    later = list(values[len(values) // 2 :])
    if len(later) < 2 or min(values) <= 0:
        return None
    logs = [math.log(v) for v in later]
    within = statistics.variance(logs) / len(logs)
    between = noise[0] if noise is not None else 0.0
    variance = within + between
    if variance <= 0:
        mean = math.exp(statistics.fmean(logs))
        return Bound(mean, mean, len(later))
    # the windows' own degrees of freedom, not Welch-Satterthwaite's: with two or three
    # windows their spread can be small by chance, and the rule looks at every window
    # (bench/NOTES.md, "Early stopping": simulated, this keeps the share of stopped trials
    # that would have won below 1 - confidence over all the looks of a trial)
    step = t_ppf(confidence, len(logs) - 1) * math.sqrt(variance)
    centre = statistics.fmean(logs)
    return Bound(math.exp(centre - step), math.exp(centre + step), len(later))


def stop_reason(
    spec: StudySpec,
    windows: Sequence[Mapping[str, float]],
    incumbent: Trial | None,
    noise: Mapping[str, tuple[float, int]],
    settings: StoppingSettings | None = None,
) -> str:
    """Why a trial measured ``windows`` so far should stop, or "" to go on (module doc).

    Args:
        spec: The study, its relative constraints resolved (``with_resolved_constraints``).
        windows: The trial's windows so far, oldest first.
        incumbent: The best feasible COMPLETED trial (``tuner.trial.best_trial``), if any.
        noise: The study's pooled run-to-run noise per metric (log variance, dof).
        settings: The rule's settings (default: the study's ``stopping``).
    """
    settings = spec.stopping if settings is None else settings
    if len(windows) < settings.min_windows:
        return ""
    level = settings.confidence
    for constraint in spec.outcome_constraints:
        if constraint.relative:
            continue
        found = _bound(windows, constraint.metric, noise, level)
        if found is None:
            continue
        best_case = found.low if constraint.op == "<=" else found.high
        if not constraint.satisfied(best_case):
            return (
                f"stopped early after {len(windows)} windows: {constraint.metric} cannot meet "
                f"{constraint} ({_percent(level)} bound {best_case:.4g} from the last "
                f"{found.windows} windows)"
            )
    if spec.multi_objective or incumbent is None:
        return ""
    objective = spec.objective
    found = _bound(windows, objective.name, noise, level)
    target = incumbent.metrics.get(objective.name)
    if found is None or target is None:
        return ""
    best_case = found.high if objective.goal.value == "maximize" else found.low
    if objective.better(target, best_case):
        return (
            f"stopped early after {len(windows)} windows: {objective.name} cannot beat trial "
            f"{incumbent.id}'s {target:.4g} ({_percent(level)} bound {best_case:.4g} from the "
            f"last {found.windows} windows)"
        )
    return ""


def _bound(
    windows: Sequence[Mapping[str, float]],
    name: str,
    noise: Mapping[str, tuple[float, int]],
    level: float,
) -> Bound | None:
    if name not in noise:
        return None  # no measured run-to-run noise: the windows alone cannot tell
    values = [w[name] for w in windows if name in w and math.isfinite(w[name])]
    if len(values) < len(windows):
        return None  # a window without the metric: not judged
    return bound(values, noise[name], level)


def _percent(level: float) -> str:
    return f"{100 * level:g} %"
