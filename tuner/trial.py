"""Trials, their life cycle, and feasibility-aware ranking.

A trial is one configuration of a study and what happened to it. Its status owns the
allowed transitions::

    PENDING ──> ACTIVE ──> COMPLETED     measured; metrics recorded
       │           ├─────> INFEASIBLE    the configuration broke the system (reason recorded)
       │           ├─────> FAILED        infrastructure failure, not the config's fault
       │           ├─────> TIMED_OUT     the measurement ran past its time limit
       │           └─────> ABANDONED     given up by the client (never re-suggested)
       └─────────────────> any of the five (a queued trial measured elsewhere)

A trial the *service* gave up because its lease expired (ABANDONED or FAILED, with
``expired_at`` set) may still take its worker's late result once; see
``server.service.LeasePolicy``.

``COMPLETED`` trials whose metrics violate an outcome constraint are *infeasible by
measurement*; ``best_trial`` ranks only trials that satisfy every constraint.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from tuner.errors import StateError
from tuner.space import Config
from tuner.study import Goal, StudySpec


class StepKind(StrEnum):
    """Which step of the generation strategy made a trial's configuration (stored per trial).

    The designer reads a trial's history through this enum only; ``Trial.source`` is a label
    for people. ``tuner/designer/strategy.py`` holds the table that chooses among them.
    """

    DEFAULT = "default"  # the knobs' default configuration
    SOBOL = "sobol"  # the initial design: scrambled Sobol (inside the prior region, if any)
    PRIOR = "prior"  # expert priors: the acquisition maximized inside the recommended region
    GLOBAL = "global"  # the acquisition (qLogNEI, qLogNEHVI, qLogPoF) over the whole space
    LOCAL = "local"  # Thompson sampling in a trust region around the best trial
    TREND = "trend"  # global qLogNEI on GPs with a linear prior mean (the trend probe)
    RANDOM = "random"  # uniformly random, by ``designer.random_fraction``
    FILL_IN = "fill-in"  # random, standing in for a model suggestion already taken
    FALLBACK = "fallback"  # quasi-random after numerical trouble in the model
    IMPORT = "import"  # not made by the designer: imported, or measured by the user
    FOREST = "forest"  # the portfolio: expected improvement on a random forest (SMAC-style)
    EXPLORE = "explore"  # the portfolio after stagnation: farthest from every configuration
    TRANSFER = "transfer"  # a transfer source's best configuration, in the initial design

    @property
    def model_based(self) -> bool:
        """Whether a fitted model chose the configuration."""
        return self in _MODEL_BASED


_MODEL_BASED = frozenset(
    {StepKind.PRIOR, StepKind.GLOBAL, StepKind.LOCAL, StepKind.TREND, StepKind.FOREST}
)


class TrialStatus(StrEnum):
    PENDING = "PENDING"
    ACTIVE = "ACTIVE"
    COMPLETED = "COMPLETED"
    INFEASIBLE = "INFEASIBLE"
    FAILED = "FAILED"
    ABANDONED = "ABANDONED"
    TIMED_OUT = "TIMED_OUT"
    #: Ended before its full measurement because what it measured so far showed it could
    #: not win (``tuner.stopping``); keeps what it measured, which the model learns from.
    EARLY_STOPPED = "EARLY_STOPPED"

    @property
    def is_final(self) -> bool:
        return self not in (TrialStatus.PENDING, TrialStatus.ACTIVE)

    @property
    def measured(self) -> bool:
        """The trial's metrics are measured values of its configuration (COMPLETED, or
        EARLY_STOPPED with its partial measurement): the model learns them as values."""
        return self in (TrialStatus.COMPLETED, TrialStatus.EARLY_STOPPED)

    @property
    def is_pending(self) -> bool:
        """Handed out or queued but not finished: the optimizer treats it as pending."""
        return not self.is_final

    def can_become(self, other: TrialStatus) -> bool:
        return other in _TRANSITIONS[self]

    def check_transition(self, other: TrialStatus, trial_id: int | str = "") -> None:
        if not self.can_become(other):
            allowed = sorted(s.value for s in _TRANSITIONS[self]) or ["none: the trial is finished"]
            raise StateError(
                f"trial {trial_id} is {self.value} and cannot become {other.value} "
                f"(allowed from {self.value}: {', '.join(allowed)})"
            )


_FINAL = {
    TrialStatus.COMPLETED,
    TrialStatus.INFEASIBLE,
    TrialStatus.FAILED,
    TrialStatus.TIMED_OUT,
    TrialStatus.ABANDONED,
    TrialStatus.EARLY_STOPPED,
}
_TRANSITIONS: dict[TrialStatus, set[TrialStatus]] = {
    TrialStatus.PENDING: {TrialStatus.ACTIVE, *_FINAL},
    TrialStatus.ACTIVE: set(_FINAL),
    **{s: set() for s in _FINAL},
}

# Outcomes the model learns from: measured ones and those the configuration caused.
OBSERVED = (
    TrialStatus.COMPLETED,
    TrialStatus.INFEASIBLE,
    TrialStatus.TIMED_OUT,
    TrialStatus.EARLY_STOPPED,
)


class MeasurementKind(StrEnum):
    """Why a configuration was measured (stored with every measurement)."""

    REPEAT = "repeat"  # one of the trial's own repeats: the trial's metrics are their mean
    CONTROL = "control"  # the configuration re-measured between trials, to watch the machine
    CONFIRM = "confirm"  # re-measured in a closing confirmation, round by round
    PROGRESS = "progress"  # one window of an ACTIVE trial's measurement, as it runs


@dataclass(frozen=True)
class Measurement:
    """One run of a trial's configuration on the target.

    Attributes:
        metrics: What the run measured.
        kind: Why it ran.
        at: Unix time the run ended (0: the storage stamps the time it is stored).
        round: For a confirmation, its round (the configurations of one round ran back to
            back, so they are compared pairwise); for a window of a measurement in progress,
            its number from 1; 0 otherwise.
        trial_id: The trial whose configuration ran (set when read back).
    """

    metrics: dict[str, float]
    kind: MeasurementKind = MeasurementKind.REPEAT
    at: float = 0.0
    round: int = 0
    trial_id: int = 0


def repeat_summary(
    repeats: Sequence[Measurement],
) -> tuple[dict[str, float], dict[str, float]]:
    """Per metric of the first repeat: the mean of the repeats and (with two or more) their
    sample standard deviation: what a trial measured ``len(repeats)`` times reports."""
    means = {k: statistics.fmean(m.metrics[k] for m in repeats) for k in repeats[0].metrics}
    if len(repeats) < 2:
        return means, {}
    return means, {k: statistics.stdev(m.metrics[k] for m in repeats) for k in means}


@dataclass(frozen=True)
class Trial:
    """One configuration of a study and its outcome.

    Attributes:
        id: Number of the trial within its study, from 1.
        config: Knob name -> value.
        status: Where the trial is in its life cycle.
        metrics: Reported metrics (COMPLETED trials have all the study's metrics).
        reason: Why a trial is INFEASIBLE, FAILED, TIMED_OUT or ABANDONED.
        client_id: The worker the trial was handed to.
        source: A label for people: the step kind's name for the designer's trials,
            ``import`` or ``import:<origin>`` for imported ones. Code reads ``step``.
        step: The step of the generation strategy that made the configuration.
        warning: Numerical trouble met while suggesting it (e.g. a fallback to Sobol).
        embedded: For a study searched in an embedding, the low-dimensional point the
            configuration was projected from (empty otherwise, and for the default
            configuration, which is evaluated outside the embedding).
        lease_expires_at: For a trial handed out by a service with leases: when it is
            given up unless its worker sends a heartbeat (None without a lease).
        expired_at: When the service gave the trial up because its lease ran out.
        reported_late: Its worker's result arrived after the lease had expired (and was
            stored, once).
        reoffered_as: The trial that offers this trial's configuration again.
        repeats: How many measurements the metrics are the mean of (1 for a single one).
        spread: For a trial measured more than once: the sample standard deviation of its
            repeats, per metric (empty otherwise).
        windows: How many windows of its measurement the trial reported in progress
            (``MeasurementKind.PROGRESS``) before it finished: its fidelity. A trial
            measured to the end reports them all; one EARLY_STOPPED after ``w`` of a
            study's ``W`` windows has metrics from ``w / W`` of a full measurement, which
            the model weighs as a noisier value (``designer/models/model.py``). 0: not
            measured in windows.
        transfer: For a study with transfer sources: how much each source weighed in the
            model that chose the configuration, ``(source, weight)`` pairs with the study's
            own model as ``""`` (``designer/models/transfer.py``); empty otherwise.
    """

    id: int
    config: Config
    status: TrialStatus = TrialStatus.ACTIVE
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    client_id: str = ""
    source: str = ""
    warning: str = ""
    embedded: tuple[float, ...] = ()
    step: StepKind = StepKind.IMPORT
    created_at: float = 0.0
    updated_at: float = 0.0
    lease_expires_at: float | None = None
    expired_at: float | None = None
    reported_late: bool = False
    reoffered_as: int | None = None
    repeats: int = 1
    spread: dict[str, float] = field(default_factory=dict)
    windows: int = 0
    transfer: tuple[tuple[str, float], ...] = ()


def with_resolved_constraints(spec: StudySpec, trials: Iterable[Trial]) -> StudySpec:
    """``spec`` with each relative outcome constraint (``"tps >= 0.99 * default"``) turned
    into an absolute one by the value the default configuration measured. A constraint whose
    metric the default trial has not (yet) reported stays relative, and nothing satisfies it.
    """
    if not any(c.relative for c in spec.outcome_constraints):
        return spec
    default = next(
        (t for t in sorted(trials, key=lambda t: t.id)
         if t.step is StepKind.DEFAULT and t.status is TrialStatus.COMPLETED),
        None,
    )  # fmt: skip
    resolved = []
    for constraint in spec.outcome_constraints:
        value = default.metrics.get(constraint.metric) if default is not None else None
        if constraint.relative and value is not None and math.isfinite(value):
            constraint = constraint.resolved(value)
        resolved.append(constraint)
    return replace(spec, outcome_constraints=tuple(resolved))


def is_feasible(spec: StudySpec, trial: Trial) -> bool:
    """COMPLETED with every study metric present, finite, and inside every outcome constraint
    (a relative constraint must be resolved first: ``with_resolved_constraints``)."""
    if trial.status is not TrialStatus.COMPLETED:
        return False
    for name in spec.metric_names:
        value = trial.metrics.get(name)
        if value is None or not math.isfinite(value):
            return False
    return all(c.satisfied(trial.metrics[c.metric]) for c in spec.outcome_constraints)


def best_trial(spec: StudySpec, trials: Iterable[Trial]) -> Trial | None:
    """The feasible trial with the best objective value (earliest wins ties); None if none."""
    trials = list(trials)
    spec = with_resolved_constraints(spec, trials)
    objective = spec.objective
    best: Trial | None = None
    for trial in sorted(trials, key=lambda t: t.id):
        if not is_feasible(spec, trial):
            continue
        if best is None or objective.better(
            trial.metrics[objective.name], best.metrics[objective.name]
        ):
            best = trial
    return best


def dominates(spec: StudySpec, a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    """True when metrics ``a`` are at least as good as ``b`` in every objective and strictly
    better in one."""
    strictly = False
    for objective in spec.objectives:
        x, y = a[objective.name], b[objective.name]
        if objective.better(y, x):
            return False
        strictly = strictly or objective.better(x, y)
    return strictly


def pareto_front(spec: StudySpec, trials: Iterable[Trial]) -> list[Trial]:
    """Feasible trials no other feasible trial dominates, in id order. Of trials with equal
    objective values only the earliest is kept. With one objective: the best trial."""
    trials = list(trials)
    spec = with_resolved_constraints(spec, trials)
    feasible = sorted((t for t in trials if is_feasible(spec, t)), key=lambda t: t.id)
    names = [o.name for o in spec.objectives]
    front: list[Trial] = []
    seen: set[tuple[float, ...]] = set()
    for trial in feasible:
        values = tuple(trial.metrics[n] for n in names)
        if values in seen or any(dominates(spec, o.metrics, trial.metrics) for o in feasible):
            continue
        seen.add(values)
        front.append(trial)
    return front


REFERENCE_MARGIN = 0.1


def reference_point(spec: StudySpec, trials: Iterable[Trial]) -> list[float] | None:
    """The hypervolume reference point, one value per objective in metric units: the
    objective's ``reference`` where set, otherwise ``REFERENCE_MARGIN`` of the Pareto front's
    range beyond its worst value (of ``|worst|``, or 1, when the front is a single value), as
    BoTorch's ``infer_reference_point``. None while no trial is feasible and some objective
    has no reference."""
    front = pareto_front(spec, trials)
    out: list[float] = []
    for objective in spec.objectives:
        if objective.reference is not None:
            out.append(objective.reference)
            continue
        if not front:
            return None
        values = [t.metrics[objective.name] for t in front]
        sign = 1.0 if objective.goal is Goal.MAXIMIZE else -1.0  # larger signed is better
        worst = min(sign * v for v in values)
        span = max(sign * v for v in values) - worst or abs(worst) or 1.0
        out.append(sign * (worst - REFERENCE_MARGIN * span))
    return out


def hypervolume(spec: StudySpec, trials: Iterable[Trial], reference: Sequence[float]) -> float:
    """The volume the feasible trials dominate between their Pareto front and ``reference``
    (in metric units, one value per objective); 0 when no trial is better than it."""
    import torch  # only the multi-objective reports need it
    from botorch.utils.multi_objective.hypervolume import Hypervolume

    signs = [1.0 if o.goal is Goal.MAXIMIZE else -1.0 for o in spec.objectives]
    ref = torch.tensor([s * r for s, r in zip(signs, reference, strict=True)], dtype=torch.float64)
    points = [
        [s * t.metrics[o.name] for s, o in zip(signs, spec.objectives, strict=True)]
        for t in pareto_front(spec, trials)
    ]
    kept = [p for p in points if all(v > r for v, r in zip(p, ref.tolist(), strict=True))]
    if not kept:
        return 0.0
    return float(Hypervolume(ref).compute(torch.tensor(kept, dtype=torch.float64)))


def best_so_far(spec: StudySpec, trials: Iterable[Trial]) -> list[float | None]:
    """Best feasible objective value after each trial, in id order (None before the first)."""
    trials = list(trials)
    spec = with_resolved_constraints(spec, trials)
    objective = spec.objective
    out: list[float | None] = []
    current: float | None = None
    for trial in sorted(trials, key=lambda t: t.id):
        if is_feasible(spec, trial):
            value = trial.metrics[objective.name]
            if current is None or objective.better(value, current):
                current = value
        out.append(current)
    return out
