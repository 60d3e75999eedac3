"""What a study's stored measurements say: its noise, its confirmation, and its best.

Pure functions of a study's spec, trials and stored measurements (no target is run here):
the service answers ``GetBestTrial`` with them, and a session (``runner.session``,
``runner.measurement``) uses the same ones, so the two always report the same best.

* ``pooled_noise`` / ``machine_noise``: the spread of repeated measurements, pooled on the
  log scale per metric; the yardstick of ``unstable``.
* ``Confirmation``: the closing confirmation's rounds, judged (``judge``) by paired
  per-round ratios to the default; ``stored_confirmation`` rebuilds it from the stored
  CONFIRM measurements.
* ``best_of``: the study's best as every command reports it (a ``Best``: the trial and how
  it was chosen: without a confirmation, the best measured value among the trials the
  objective GP does not call outliers); ``ranked``: the feasible trials, best first by the
  objective GP's posterior mean (by their measured values on a study without noise, ``noiseless``);
  ``improvement``: best against default.

Nothing here imports torch or SciPy: the quantiles are ``tuner.quantiles``'s, and the one
step that needs the model (``model_ranking``) is passed in, so that a reader of the base
install gets the confirmation's verdict exactly as the session judged it.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from tuner.measurement_stats import (
    RatioInterval,
    pooled_log_variance,
    ratio_interval,
    sequential_ratio_interval,
    unstable,
)
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

#: Measurements of the default that make its spread the yardstick of ``machine_noise``.
MIN_REFERENCE = 3


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
        stopped: Why the estimate's rounds stopped, for people (``stop_reason``): the
            interval excluded 1, was narrow enough, or a limit was reached; "" for a fixed
            number of rounds.
    """

    measured: tuple[Remeasured, ...]
    best: Remeasured | None
    interval: RatioInterval | None
    default_feasible: bool = True
    unstable: tuple[int, ...] = ()
    intervals: dict[int, RatioInterval] = field(default_factory=dict)
    selection: tuple[Remeasured, ...] = ()
    selection_intervals: dict[int, RatioInterval] = field(default_factory=dict)
    stopped: str = ""

    @property
    def rounds(self) -> int:
        """Rounds of the estimate."""
        return len(self.measured[0].rounds) if self.measured else 0

    @property
    def ratio(self) -> float | None:
        return None if self.interval is None else self.interval.ratio

    @property
    def significant(self) -> bool:
        """The interval lies wholly above 1: the best beat the default beyond the noise."""
        return self.interval is not None and self.interval.low > 1.0

    def default_rounds(self) -> tuple[int, int]:
        """``(met, rounds)``: in how many of its rounds, over the selection and the
        estimate, the default met the outcome constraints."""
        runs = [m for m in (*self.selection[:1], *self.measured[:1])
                if m.trial.step is StepKind.DEFAULT]  # fmt: skip
        return sum(sum(m.feasible) for m in runs), sum(m.repeats for m in runs)

    @property
    def default(self) -> Remeasured | None:
        first = self.measured[0] if self.measured else None
        return first if first is not None and first.trial.step is StepKind.DEFAULT else None

    def kept(self, goal: Goal) -> Trial | None:
        """What to report when no candidate was confirmed (``best`` is None): the default
        when it met the constraints in every round (nothing beat it); else the candidate
        that met them in the largest share of its rounds over both phases (a stable one
        before an unstable one, then by its mean over those rounds); None when nothing met
        them in any round. With ``best``, that, unless it measured worse than a default
        that met the constraints in every round, beyond noise (its interval below 1):
        then the default."""
        if self.best is not None:
            worse = self.interval is not None and self.interval.high < 1.0
            if worse and self.default is not None and self.default_feasible:
                return self.default.trial
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
            feasible = tuple(meets(spec, v) for v in values)
            out.append(Remeasured(by_id[i], values, feasible, (), spec.objective.name))
        return tuple(out)

    def ids(among: Sequence[int]) -> list[int]:
        seen = sorted(set().union(*(ran[r] for r in among)) & set(by_id))
        return [*base, *seen]

    noise = machine_noise(spec, measurements, None if default is None else default.id)
    estimate = rounds[first:]
    sequential = spec.stopping.sequential
    found = judge(spec, remeasured(ids(estimate), estimate), default is not None, noise,
                  sequential=sequential)  # fmt: skip
    if sequential:
        found = replace(found, stopped=stop_reason(found.interval))
    if not first:
        return found
    selection = remeasured(ids(rounds[:first]), rounds[:first])
    chose = judge(spec, selection, True, noise, choosing=True)
    return with_selection(found, chose, selection)


def with_selection(
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


def joined(first: Remeasured, then: Remeasured) -> Remeasured:
    """One configuration's rounds of ``first`` followed by those of ``then``."""
    return replace(
        first,
        rounds=first.rounds + then.rounds,
        feasible=first.feasible + then.feasible,
        reasons=first.reasons + then.reasons,
    )


def judge(
    spec: StudySpec,
    measured: tuple[Remeasured, ...],
    has_default: bool,
    noise: Mapping[str, tuple[float, int]] | None,
    choosing: bool = False,
    sequential: bool = False,
) -> Confirmation:
    """The best of ``measured`` (the default first when ``has_default``) by its paired
    ratio to the default, among those feasible in every round and not unstable. Only when
    ``choosing`` may the best have a single paired round (and so no interval). With
    ``sequential`` the intervals are confidence sequences (rounds that stopped on what
    they showed)."""
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
            interval = sequential_ratio_interval if sequential else ratio_interval
            found = interval(
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


def stop_reason(interval: RatioInterval | None, width: float = 0.0) -> str:
    """Why a sequential confirmation's rounds stopped, read from where its interval ended:
    it excluded 1 (a gain or a loss), it was narrower than ``width`` (when given: the
    ratio is settled within it), or neither (a round or time limit, or no candidate)."""
    if interval is None:
        return "no candidate was feasible and stable in every round"
    if interval.low > 1.0:
        return "the interval lies above 1"
    if interval.high < 1.0:
        return "the interval lies below 1"
    if not width:
        return "the interval includes 1 where its rounds stopped"
    if math.isfinite(interval.high) and interval.high <= width * interval.low:
        return f"the interval is narrower than {width:g}x"
    return "its round or time limit was reached"


def meets(spec: StudySpec, metrics: dict[str, float] | None) -> bool:
    if metrics is None:
        return False
    return is_feasible(spec, Trial(0, {}, TrialStatus.COMPLETED, metrics))


class Basis(StrEnum):
    """How ``best_of`` chose a study's best (what the commands say beside it)."""

    CONFIRMATION = "confirmation"  # the closing confirmation's verdict, or what it keeps
    MEASURED = "measured values"  # a study without noise (``noiseless``): no model needed
    SCREENED = "measured, outliers set aside"  # by the objective GP, among the stable feasible
    TRIAL_MEANS = "trial means"  # no model ranked these results (a reader found none stored)


@dataclass(frozen=True)
class Best:
    """A study's best trial and how it was chosen (``best_of``).

    Attributes:
        trial: The best trial; None when no trial is feasible.
        basis: How it was chosen.
        confirmation: The study's stored confirmation, when it has one.
    """

    trial: Trial | None
    basis: Basis
    confirmation: Confirmation | None = None

    @property
    def unconfirmed(self) -> bool:
        """Chosen from the session's own measurements, not by a confirmation."""
        return self.basis is not Basis.CONFIRMATION


#: Ranks ``among`` (best first) in a study's ``trials``; None when it cannot (no model).
Ranker = Callable[[StudySpec, Sequence[Trial], Sequence[Trial]], "list[Trial] | None"]


def model_available() -> bool:
    """Whether this install has the model that ranks a study's trials (torch, BoTorch),
    found without importing it."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in ("torch", "botorch"))
    except (ImportError, ValueError):  # a module blocked or half-imported
        return False


def model_ranking(
    spec: StudySpec, trials: Sequence[Trial], among: Sequence[Trial]
) -> list[Trial] | None:
    """``among`` best first by their measured values, the objective GP's outliers last
    (``tuner.designer.models.posterior_best.rank_screened``), or None where torch is not
    installed."""
    if not model_available():
        return None
    from tuner.designer.models.posterior_best import rank_screened  # torch: only when ranking

    return rank_screened(spec, trials, among)


def best_of(
    spec: StudySpec,
    trials: Sequence[Trial],
    measurements: Sequence[Measurement],
    rank: Ranker = model_ranking,
) -> Best:
    """The study's best, as the session, the server and every command report it.

    In order: when the study was confirmed (``stored_confirmation``), the confirmation's
    best, or, when it confirmed none, what it keeps (``Confirmation.kept``: the default
    when the default met the constraints in every round). Else, among the feasible trials
    (the default included) whose repeats are stable: on a study without noise
    (``noiseless``) the best measured value; else the best by ``rank`` (the best measured
    value among those the objective GP does not call outliers); and where ``rank`` cannot
    (no model), the best trial mean. For one objective."""
    found = stored_confirmation(spec, trials, measurements)
    kept = None if found is None else found.kept(spec.objective.goal)
    if kept is not None:
        return Best(next(t for t in trials if t.id == kept.id), Basis.CONFIRMATION, found)
    resolved = with_resolved_constraints(spec, trials)
    default = next((t for t in trials if t.step is StepKind.DEFAULT), None)
    among = [
        t for t in trials
        if is_feasible(resolved, t) and not unstable_trial(resolved, t, default, measurements)
    ]  # fmt: skip
    if noiseless(resolved, measurements):
        return Best(next(iter(by_measured(resolved, among)), None), Basis.MEASURED, found)
    ranking = rank(resolved, trials, among) if among else []
    if ranking is None:
        return Best(next(iter(by_measured(resolved, among)), None), Basis.TRIAL_MEANS, found)
    return Best(ranking[0] if ranking else None, Basis.SCREENED, found)


def ranked(
    spec: StudySpec,
    trials: Sequence[Trial],
    skip: Collection[int] = (),
    measurements: Sequence[Measurement] = (),
    declared_noiseless: bool = False,
) -> list[Trial]:
    """The confirmation's candidates: the feasible trials (by their measured means) but
    the default and ``skip``, best first by the objective GP's posterior mean
    (``tuner.designer.models.posterior_best``). On a study without noise (the target declares it,
    ``declared_noiseless``, or its ``measurements`` show it: ``noiseless``) by their
    measured values instead: there a measurement is the truth, and a GP's smoothing can
    rank the best measured trial below the candidates the confirmation looks at."""
    spec = with_resolved_constraints(spec, trials)
    among = [
        t for t in trials
        if is_feasible(spec, t) and t.id not in skip and t.step is not StepKind.DEFAULT
    ]  # fmt: skip
    if declared_noiseless or noiseless(spec, measurements):
        return by_measured(spec, among)
    from tuner.designer.models.posterior_best import rank_by_posterior  # torch: only when ranking

    return rank_by_posterior(spec, trials, among)


def by_measured(spec: StudySpec, among: Sequence[Trial]) -> list[Trial]:
    """``among`` best first by their measured objective means; ties keep the earlier."""
    sign = 1.0 if spec.objective.goal is Goal.MAXIMIZE else -1.0
    name = spec.objective.name
    return sorted(among, key=lambda t: (-sign * t.metrics[name], t.id))


#: Repeated measurements (beyond each configuration's first) that must all agree exactly
#: before a study counts as noiseless: two, so that one coincidence of a coarse metric is
#: not enough.
NOISELESS_EVIDENCE = 2


def noiseless(spec: StudySpec, measurements: Sequence[Measurement]) -> bool:
    """Whether the study's own measurements show no noise: every configuration measured
    more than once (repeats, the default's controls, confirmation rounds) measured exactly
    the same objective value each time, and at least ``NOISELESS_EVIDENCE`` such repeated
    measurements exist (a replayed table or a deterministic simulator, not a real system)."""
    name = spec.objective.name
    values: dict[int, set[float]] = {}
    count: dict[int, int] = {}
    for m in measurements:
        if name in m.metrics:
            values.setdefault(m.trial_id, set()).add(m.metrics[name])
            count[m.trial_id] = count.get(m.trial_id, 0) + 1
    repeated = sum(n - 1 for n in count.values())
    return repeated >= NOISELESS_EVIDENCE and all(len(v) == 1 for v in values.values())


def unstable_trial(
    spec: StudySpec, trial: Trial, default: Trial | None, measurements: Sequence[Measurement]
) -> bool:
    """Whether ``trial``'s repeats disagree, on the objective, beyond the machine's noise
    (``machine_noise``)."""
    name = spec.objective.name
    values = [
        m.metrics[name] for m in measurements
        if m.trial_id == trial.id and m.kind is MeasurementKind.REPEAT and name in m.metrics
    ]  # fmt: skip
    if len(values) < 2 or min(values) <= 0:
        return False
    default_id = None if default is None else default.id
    noise = machine_noise(spec, measurements, default_id, exclude=trial.id).get(name)
    return unstable(values, noise)


def improvement(spec: StudySpec, default: Trial | None, best: Trial | None) -> float | None:
    """``best / default`` (maximize) or ``default / best`` (minimize), when both are positive.

    None when the default has no value or breaks an outcome constraint: there is nothing
    feasible to compare with.
    """
    name = spec.objective.name
    if default is None or best is None or name not in default.metrics:
        return None
    if not is_feasible(spec, default):
        return None
    return _ratio(spec, default.metrics[name], best.metrics[name])


def _ratio(spec: StudySpec, default: float, best: float) -> float | None:
    if not (math.isfinite(default) and math.isfinite(best)) or default <= 0 or best <= 0:
        return None
    return best / default if spec.objective.goal is Goal.MAXIMIZE else default / best
