"""The generation strategy: which kind of step makes the next configuration.

After Ax's ``GenerationStrategy`` (explicit steps with transition criteria) and Vizier's
designers: every suggestion is one *step*, and ``next_step`` chooses it from a
``Situation``, a digest of the stored history that ``read_situation`` computes. The whole
decision table, in order (the first row that applies wins)::

    default configuration wanted, not taken yet        -> DEFAULT
    initial design not complete, a transfer source's
      best configuration not taken yet                  -> TRANSFER
    initial design not complete, or nothing COMPLETED   -> SOBOL   (space-filling)
    this slot's draw of designer.random_fraction        -> RANDOM
    expert priors, fewer than 2 x initial designed      -> PRIOR   (BO inside the region)
    several objectives, or a candidate list             -> GLOBAL
    the portfolio (designer.portfolio) picks another
      generator than the GP from this study's evidence  -> its pick (EXPLORE, FOREST)
    trend probe open (narrow embedding), unless a
      fill-in exists and the model step is odd          -> TREND
    trust region (inner designer of an embedding),
      odd model step                                    -> LOCAL
    otherwise                                           -> GLOBAL

Two more kinds are outcomes of executing a step, never chosen here: FILL_IN (a random
configuration standing in for a model suggestion that was already taken) and FALLBACK
(quasi-random after numerical trouble). A LOCAL step while the trend probe is open keeps the
trend's linear prior mean (``LocalStep.trend_mean``).

Each step kind is a frozen dataclass; its constants are its fields, each with the reason and
the evidence for it. The table reads the history only through ``StepKind`` (stored with every
trial) and measured values, so a restarted server makes the same choices. An embedded
(LlamaTune) study runs the table twice: outside the embedding for the default and the prior
seeds, inside it for everything else (``steps/embedded.py``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from tuner.designer.base import History, derive_seed
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, is_feasible


@dataclass(frozen=True)
class DefaultStep:
    """The knobs' default configuration, measured first (LlamaTune's iteration 0): every
    later result is judged against it, and it is often a good configuration already."""

    kind: ClassVar[StepKind] = StepKind.DEFAULT


@dataclass(frozen=True)
class SobolStep:
    """The initial design: the study's scrambled Sobol sequence, read from its start and
    skipping taken configurations (``designer.initial_trials`` points, by default
    ``min(10, max(5, d + 1))``); squeezed into the recommended region with expert priors."""

    kind: ClassVar[StepKind] = StepKind.SOBOL


@dataclass(frozen=True)
class TransferStep:
    """The best configuration of a transfer source (``StudySpec.transfer_from``;
    ``models/transfer.py``), in place of a Sobol point of the initial design: sources in
    their order, each source's best by its own measurements, the knobs it lacks at this
    study's defaults. Only sources whose best configuration another source also expects to be
    better than its average are seeded ("when the sources agree", ``transfer_seeds``); a
    single source is seeded."""

    kind: ClassVar[StepKind] = StepKind.TRANSFER


@dataclass(frozen=True)
class RandomStep:
    """A uniformly random configuration, replacing a share ``designer.random_fraction`` of
    model-based steps (0 by default): a user's hedge against a misled model."""

    kind: ClassVar[StepKind] = StepKind.RANDOM


@dataclass(frozen=True)
class PriorStep:
    """Coarse-to-fine with expert priors (``sampling/priors.py``, GPTuner's idea): the
    acquisition is maximized inside the recommended region until ``phase`` times the initial
    design has been measured, then over the whole space. A wrong recommendation costs a
    bounded number of trials.

    Attributes:
        phase: The region's share, in initial designs (the design itself is the first).
    """

    kind: ClassVar[StepKind] = StepKind.PRIOR
    phase: int = 2


@dataclass(frozen=True)
class GlobalStep:
    """qLogNEI over the whole space (qLogNEHVI with several objectives; qLogPoF until some
    trial is feasible), pending trials as ``X_pending`` (``acquisition/criteria.py``).

    Attributes:
        candidate_margin: On candidate lists, qLogNEI counts only improvements beyond this
            many standard deviations of the observed objective. On the cloud benchmark
            (Scout, 18 workloads x 50 seeds, cost after 10 trials) it took best/optimum from
            1.125 to 1.092 together with candidate features and failure imputation: a list
            of a few dozen deployments is searched in ten trials, where a step to a near
            neighbour of the best costs as much as one to a far, uncertain one.
    """

    kind: ClassVar[StepKind] = StepKind.GLOBAL
    candidate_margin: float = 0.5


@dataclass(frozen=True)
class LocalStep:
    """Thompson sampling in a trust region around the best trial, TuRBO-style (Eriksson et
    al., NeurIPS 2019; ``acquisition.thompson_candidates``): a box of side ``length`` of the
    unit box, stretched per knob by the GP's lengthscales, halved after every ``patience``
    trials in a row without an improvement by more than ``improvement x |best|``, and back to
    ``length`` after ``halvings`` halvings. The inner designer of an embedding takes every
    second model step here: global BO in 16 or more dimensions keeps sampling the box's
    faces after it has found the right basin, and a posterior sample also tries the side of
    the best point the model is unsure about. TuRBO's published constants.

    Attributes:
        trend_mean: Fit the trend probe's linear prior mean (set while the probe is open).
    """

    kind: ClassVar[StepKind] = StepKind.LOCAL
    length: float = 0.8
    halvings: int = 5
    patience: int = 3
    improvement: float = 1e-3
    trend_mean: bool = False


@dataclass(frozen=True)
class TrendStep:
    """Global qLogNEI on GPs with a linear prior mean (``models/model.py``, ``trend``), which carry
    the fitted slopes out to the faces of the box where a constant-mean GP falls back to the
    average. Only in embeddings of at most ``narrow`` knobs per coordinate (there a
    coordinate stands for one knob or two, so its slope is a knob's trend), and only while
    the measurements support it: each model step of the probe scores the share of earlier
    feasible trials it beat (0 when it broke the system); after ``probe`` scored steps the
    probe goes on only while their mean score is at least ``keep``.

    Evidence (``bench/NOTES.md``, "The trend probe"): on the MySQL SYSBENCH-20 surrogate,
    whose good configurations lie on the faces, the running mean score from the sixth step
    until the target stayed >= 0.40 in 29 seeds of 30 (0.399 in the last); on Hartmann6 in
    20 knobs (interior optimum) the first six steps scored below 0.40 in 10 of 10 seeds. The
    threshold sits at the edge of both samples, chosen on those two problems only.
    """

    kind: ClassVar[StepKind] = StepKind.TREND
    narrow: float = 2.0
    probe: int = 6
    keep: float = 0.4


@dataclass(frozen=True)
class ForestStep:
    """Expected improvement on a random forest, SMAC's model for step-like surfaces (Hutter,
    Hoos, Leyton-Brown, LION 2011; ``models/forest.py``): the GP smooths over the thresholds
    of buffer and cache sizes, a forest's leaves follow them. Maximized over scrambled-Sobol
    points and one-exchange neighbours of the best trials (SMAC's local search), as SMAC3
    does; trials that broke the system or a constraint count as the worst value measured.
    A generator of the portfolio (``PortfolioStep``)."""

    kind: ClassVar[StepKind] = StepKind.FOREST


@dataclass(frozen=True)
class ExploreStep:
    """The configuration farthest from every one measured or pending (maximin over
    scrambled-Sobol points of the box): the portfolio's answer when the search stagnates,
    so that a stalled study leaves its basin instead of refining it further."""

    kind: ClassVar[StepKind] = StepKind.EXPLORE


@dataclass(frozen=True)
class PortfolioStep:
    """Which generator makes a model step, chosen from this study's own measured evidence
    (``portfolio_pick``), never from the problem's shape or name.

    * Stagnation: when as many model steps as the initial design had points (the scale the
      study already uses for "enough points to learn from") ran in a row since the last
      new best (by more than ``improvement x |best|``) and since the last EXPLORE, the next
      step is EXPLORE.
    * The GP (GLOBAL, LOCAL, TREND, PRIOR: the table's rows below) leads until the search
      stalls once (an EXPLORE in the history). From then on the forest (FOREST) competes:
      each model step of the past is scored by the share of the earlier feasible trials it
      beat (0 when it broke the system or a constraint), as the trend probe scores its
      steps, and the next model step takes the generator of the higher upper confidence
      bound on its mean score, UCB1 (Auer, Cesa-Bianchi, Fischer, Machine Learning 2002:
      mean + sqrt(2 ln N / n), no constant to choose); an untried generator goes first, the
      GP breaks ties.

    Why the forest waits for a stall (``bench/NOTES.md``, "The portfolio"): with both
    competing from the first model step, UCB1 spent about a third of the steps on the forest
    where the GP was right (smooth problems, the scheduler), and choosing by cross-validated
    ranking instead let the forest lead almost nowhere.

    Attributes:
        improvement: What counts as a new best, relative (TuRBO's, as ``LocalStep``).
    """

    improvement: float = 1e-3


Step = (
    DefaultStep
    | TransferStep
    | SobolStep
    | RandomStep
    | PriorStep
    | GlobalStep
    | LocalStep
    | TrendStep
    | ForestStep
    | ExploreStep
)

DEFAULT = DefaultStep()
SOBOL = SobolStep()
TRANSFER = TransferStep()
RANDOM = RandomStep()
PRIOR = PriorStep()
GLOBAL = GlobalStep()
LOCAL = LocalStep()
TREND = TrendStep()
FOREST = ForestStep()
EXPLORE = ExploreStep()
PORTFOLIO = PortfolioStep()


@dataclass(frozen=True)
class Situation:
    """What the decision table reads, every field derived from the stored history.

    Attributes:
        default_due: The study wants its default configuration measured, and it is not taken.
        designed: Trials that count toward the initial design (all but the default).
        initial: Size of the initial design.
        seeds: Transfer sources' best configurations not taken yet (``TransferStep``).
        learned: Some trial COMPLETED: a model has something to learn from.
        random_draw: This slot's draw of ``designer.random_fraction`` came up.
        prior_region: The study has expert priors with a recommended region.
        single_incumbent: One objective on a box (not a candidate list): a trust region and
            a trend can follow one best trial.
        trust_region: The designer takes every second model step locally.
        trend_probe: The trend probe is on for this designer (a narrow embedding).
        trend_open: Replayed over the history, the probe still goes on.
        plateau: Some trial is a fill-in: suggestions met plateaus of choice knobs.
        portfolio_pick: The portfolio's generator when it is not the GP (FOREST, EXPLORE),
            else None (``portfolio_pick``).
    """

    default_due: bool = False
    designed: int = 0
    initial: int = 5
    seeds: int = 0
    learned: bool = False
    random_draw: bool = False
    prior_region: bool = False
    single_incumbent: bool = True
    trust_region: bool = False
    trend_probe: bool = False
    trend_open: bool = False
    plateau: bool = False
    portfolio_pick: ForestStep | ExploreStep | None = None


def next_step(s: Situation) -> Step:
    """The whole decision table (module doc)."""
    if s.default_due:
        return DEFAULT
    if s.designed < s.initial and s.seeds > 0:
        return TRANSFER
    if s.designed < s.initial or not s.learned:
        return SOBOL
    if s.random_draw:
        return RANDOM
    if s.prior_region and s.designed < PRIOR.phase * s.initial:
        return PRIOR
    if not s.single_incumbent:
        return GLOBAL
    if s.portfolio_pick is not None:
        return s.portfolio_pick
    odd = (s.designed - s.initial) % 2 == 1  # every second model step
    if s.trend_probe and s.trend_open:
        return LocalStep(trend_mean=True) if s.plateau and odd else TREND
    if s.trust_region and odd:
        return LOCAL
    return GLOBAL


def read_situation(
    spec: StudySpec,
    history: History,
    *,
    prior_region: bool = False,
    trust_region: bool = False,
    trend_probe: bool = False,
) -> Situation:
    """The situation of the first suggestion of a call (``plan`` advances it per slot)."""
    single = not spec.multi_objective and not spec.candidates
    probe = trend_probe and single
    initial = spec.designer.initial_size(len(spec.space))
    pick = None
    if single and spec.designer.portfolio:
        pick = portfolio_pick(spec, (*history.observed, *history.pending), initial)
    return Situation(
        designed=history.designed,
        initial=initial,
        learned=history.learned,
        prior_region=prior_region,
        single_incumbent=single,
        trust_region=trust_region,
        trend_probe=probe,
        trend_open=probe and trend_probe_open(spec, history.observed),
        plateau=any(t.step is StepKind.FILL_IN for t in (*history.observed, *history.pending)),
        portfolio_pick=pick,
    )


def plan(spec: StudySpec, history: History, first: Situation, count: int) -> list[Step]:
    """The steps of a call for ``count`` suggestions: ``next_step`` per slot, each slot
    seeing the steps planned before it (the default is taken, the design grows)."""
    steps: list[Step] = []
    situation = first
    for slot in range(count):
        step = next_step(replace(situation, random_draw=random_draw(spec, history, slot)))
        steps.append(step)
        if isinstance(step, DefaultStep):
            situation = replace(situation, default_due=False)
        elif isinstance(step, TransferStep):
            situation = replace(
                situation, designed=situation.designed + 1, seeds=situation.seeds - 1
            )
        else:
            situation = replace(situation, designed=situation.designed + 1)
    return steps


def random_draw(spec: StudySpec, history: History, slot: int) -> bool:
    """Whether slot ``slot`` of a call is a RANDOM step, drawn with ``random_fraction``
    from the study seed and the history size (the same draw after a restart)."""
    fraction = spec.designer.random_fraction
    if fraction <= 0:
        return False
    seed = derive_seed(spec.designer.seed, "bo", history.size, slot)
    return random.Random(seed).random() < fraction


def trust_region_length(
    spec: StudySpec, observed: Sequence[Trial], skip: int = 0, step: LocalStep = LOCAL
) -> float:
    """The trust region's side after ``observed`` (in trial id order; ``LocalStep``).

    The first ``skip`` trials (the initial design) set the best but count no failures.
    Trials with negative ids (a caller's pseudo-observations) are ignored.
    """
    name = spec.objective.name
    sign = -1.0 if spec.objective.goal.value == "maximize" else 1.0
    best: float | None = None
    failures = 0
    ordered = sorted((t for t in observed if t.id >= 0), key=lambda t: t.id)
    for index, trial in enumerate(ordered):
        value = trial.metrics.get(name)
        if value is not None and is_feasible(spec, trial):
            y = sign * value
            if best is None or y < best - step.improvement * abs(best):
                best, failures = y, 0
                continue
        if best is not None and index >= skip:
            failures += 1
    return step.length * 0.5 ** ((failures // step.patience) % (step.halvings + 1))


def trend_probe_open(spec: StudySpec, observed: Sequence[Trial], step: TrendStep = TREND) -> bool:
    """Whether the trend probe (``TrendStep``) still goes on after ``observed``.

    Replayed in trial id order: while the probe is open every model step is one of its
    steps (TREND, or LOCAL with the trend's mean); its score is the share of the earlier
    feasible trials it beat (0 when it has no feasible objective value); the probe stays
    open for ``probe`` scored steps and then while their mean score is at least ``keep``.
    """
    scores: list[float] = []
    for _, _, score in _replay(spec, observed):
        if score is not None:
            scores.append(score)
            if len(scores) >= step.probe and sum(scores) / len(scores) < step.keep:
                return False
    return True


def _replay(
    spec: StudySpec, trials: Sequence[Trial]
) -> Iterator[tuple[Trial, float, float | None]]:
    """The trials in id order (a caller's pseudo-observations, negative ids, left out), each
    with its signed feasible objective (lower wins; inf without one) and, for a finished
    model step after some feasible trial, its score: the share of the earlier feasible
    trials it beat (0 when it broke the system or a constraint)."""
    name = spec.objective.name
    sign = -1.0 if spec.objective.goal.value == "maximize" else 1.0
    earlier: list[float] = []  # signed feasible values so far
    for trial in sorted((t for t in trials if t.id >= 0), key=lambda t: t.id):
        value = trial.metrics.get(name)
        ok = value is not None and math.isfinite(value) and is_feasible(spec, trial)
        y = sign * value if ok and value is not None else math.inf
        score = None
        if trial.status.is_final and trial.step.model_based and earlier:
            score = sum(e > y for e in earlier) / len(earlier)
        yield trial, y, score
        if ok:
            earlier.append(y)


def portfolio_pick(
    spec: StudySpec, trials: Sequence[Trial], initial: int, step: PortfolioStep = PORTFOLIO
) -> ForestStep | ExploreStep | None:
    """The portfolio's generator for the next model step after ``trials`` (observed and
    pending, replayed in id order; ``PortfolioStep``): EXPLORE after stagnation, FOREST when
    the search has stagnated once and the forest's upper confidence bound is the higher,
    None for the GP."""
    scores: dict[bool, list[float]] = {False: [], True: []}  # forest? -> scores
    best: float | None = None
    stalled = 0  # model steps since the last new best or EXPLORE
    explored = False  # the search stagnated once: the forest may compete from then on
    for trial, y, score in _replay(spec, trials):
        if trial.step is StepKind.EXPLORE:
            stalled, explored = 0, True
        if not trial.status.is_final:
            stalled += trial.step.model_based  # pending: no result yet, no new best
            continue
        if score is not None:
            scores[trial.step is StepKind.FOREST].append(score)
        if y < math.inf and (best is None or y < best - step.improvement * abs(best)):
            best, stalled = y, 0
        elif trial.step.model_based:
            stalled += 1
    if best is None:
        return None  # nothing feasible yet: the GP's feasibility search (qLogPoF) leads
    if stalled >= initial:
        return EXPLORE
    if not explored:
        return None  # the GP leads until it stalls
    return FOREST if _ucb(scores[True], scores) > _ucb(scores[False], scores) else None


def _ucb(own: list[float], scores: dict[bool, list[float]]) -> float:
    """UCB1's index of one generator: its mean score plus sqrt(2 ln N / n); inf untried."""
    if not own:
        return math.inf
    total = sum(len(v) for v in scores.values())
    return sum(own) / len(own) + math.sqrt(2.0 * math.log(total) / len(own))
