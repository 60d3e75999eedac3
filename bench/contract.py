"""What every method of the suite sees of a problem, and what every method returns.

``bench.suite`` runs our designer and the peers (``bench/peers/``) on the same
``SuiteProblem``s with the same seeds. A problem is knobs, one objective with a goal,
outcome constraints, and ``measure(config, rng)``: one measurement, noisy for the noisy
twins, that can also report that the configuration broke the system (``infeasible``) or
that the measurement itself failed (``failed``). ``true_value(config)`` is the noise-free
objective, or None when the configuration is infeasible; it is used only for scoring.

Every method returns a ``MethodRun``: the configurations it measured in order, what each
measurement said, and after each evaluation the configuration the method would *report* as
its best (its own rule: the best sample for most peers, the model's choice for ours). The
suite scores a run by ``true_value`` of the reported configuration after each evaluation,
so a method that reports a lucky noisy sample is scored on what that configuration really
gives.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuner.space import Config

STATUSES = ("completed", "infeasible", "failed")
HALVES = ("develop", "report")


@dataclass(frozen=True)
class Measurement:
    """One measurement of a configuration.

    Attributes:
        status: ``completed``, ``infeasible`` (the configuration broke the system: a crash,
            out of memory) or ``failed`` (the measurement failed; says nothing about the
            configuration).
        metrics: Metric name -> value (the objective and every constrained metric when
            ``completed``; may be empty otherwise).
    """

    status: str
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Measurement.status: got {self.status!r}; allowed {STATUSES}")


@dataclass(frozen=True)
class SuiteProblem:
    """A tuning problem of the suite.

    Attributes:
        name: ``<family>:<name>``, with ``~cov05`` / ``~cov15`` for noisy twins.
        family: ``db``, ``hdbo``, ``cloud``, ``sched`` or ``yahpo``.
        half: ``develop`` or ``report`` (``bench/suite.toml``).
        knobs: Knob dictionaries as ``tuner.space.knob_from_dict`` reads them.
        objective: The metric to optimize.
        goal: ``minimize`` or ``maximize``.
        constraints: Outcome constraints in the study syntax (``"p99_ratio <= 1.1"``).
        budget: Evaluations per run.
        measure: ``(config, rng) -> Measurement``; ``rng`` is the run's own generator (the
            noisy twins draw their noise from it).
        true_value: Noise-free objective of a configuration, None when it is infeasible
            (breaks a constraint, or the system).
        candidates: For list-shaped spaces (cloud deployments): the allowed configurations.
        candidate_features: One feature table per candidate (``StudySpec.candidate_features``).
        embed_dims: Our LlamaTune embedding's dimension, or None to search the knobs directly.
        optimum: The known optimum of the objective, when there is one.
        source: Where the definition and the data come from.
    """

    name: str
    family: str
    half: str
    knobs: tuple[dict[str, Any], ...]
    objective: str
    goal: str
    constraints: tuple[str, ...]
    budget: int
    measure: Callable[[Config, random.Random], Measurement]
    true_value: Callable[[Config], float | None]
    candidates: tuple[Config, ...] = ()
    candidate_features: tuple[dict[str, float], ...] = ()
    embed_dims: int | None = None
    optimum: float | None = None
    source: str = ""

    @property
    def sign(self) -> float:
        """``+1`` to minimize, ``-1`` to maximize: ``sign * value`` is always minimized."""
        return 1.0 if self.goal == "minimize" else -1.0


@dataclass(frozen=True)
class MethodRun:
    """One run of one method on one problem.

    Attributes:
        method: The method's name (``ours``, ``ax``, ``optuna-gp``, ...).
        problem: The problem's name.
        seed: The run's seed.
        configs: The measured configurations, in order.
        measurements: What each measurement said.
        reported: After each evaluation, the configuration the method reports as its best
            (None while it has none).
        seconds: Wall time of the run.
        notes: Counters (how ours made its suggestions, fallbacks, ...).
        generators: What made each configuration, in order (ours: the trial's stored step,
            ``tuner.trial.StepKind``); empty for a peer, which does not say.
    """

    method: str
    problem: str
    seed: int
    configs: list[Config]
    measurements: list[Measurement]
    reported: list[Config | None]
    seconds: float
    notes: dict[str, int] = field(default_factory=dict)
    generators: list[str] = field(default_factory=list)


def run_rng(problem: str, seed: int) -> random.Random:
    """The measurement generator of a run: the same for every method on a problem and seed."""
    return random.Random(f"{problem}:{seed}")
