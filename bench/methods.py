"""One optimization run per method on a ``Problem``: ours, scikit-optimize, random search.

Every runner evaluates the problem ``budget`` times, one point at a time, and returns the best
*feasible* objective value after each evaluation (None until a feasible point is found), so
all methods are scored by the same rule on the true objective:

* **ours**: ``BODesigner`` on ``problem.spec(seed)`` with a ``FitCache`` (as the server runs
  it), one ``suggest(1, completed, [])`` per trial, product defaults (Sobol initial design of
  ``min(10, max(5, d + 1))`` points, qLogNEI with outcome constraints, qLogPoF before the first
  feasible point).
* **skopt**: ``skopt.gp_minimize`` with its defaults (GP with Matern kernel, ``gp_hedge``
  acquisition, L-BFGS acquisition optimizer, random initial points) except ``n_calls``,
  ``random_state`` and ``n_initial_points``. It has no constraints: on a constrained problem it
  minimizes the penalty objective ``f + PENALTY * sum(max(0, c_i))`` and is still scored on the
  best feasible ``f``.
* **random**: uniform points in the box (numpy, seeded), best feasible value.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from skopt import gp_minimize

from bench.common import Measured
from bench.problems import Problem
from runner.loop import run_trials
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import Trial

PENALTY = 10.0
METHODS = ("ours", "skopt", "random")

OnEval = Callable[[], None]


@dataclass
class RunResult:
    """The outcome of one run.

    Attributes:
        method: ``ours``, ``skopt`` or ``random``.
        problem: The problem's name.
        seed: Seed of the run (study seed, ``random_state``, numpy seed).
        best: Best feasible objective value after each evaluation; None before the first.
        seconds: Wall time of the whole run (the evaluations themselves take microseconds).
        notes: Counters, e.g. how ours produced its suggestions (``sobol``, ``bo``, ...).
    """

    method: str
    problem: str
    seed: int
    best: list[float | None]
    seconds: float
    notes: dict[str, int] = field(default_factory=dict)


def run_method(
    method: str,
    problem: Problem,
    seed: int,
    budget: int,
    skopt_initial: int | None = None,
    on_eval: OnEval | None = None,
) -> RunResult:
    """Run ``method`` once; ``skopt_initial`` is skopt's ``n_initial_points`` (None: 10)."""
    if method == "ours":
        return run_ours(problem, seed, budget, on_eval)
    if method == "skopt":
        return run_skopt(problem, seed, budget, skopt_initial, on_eval)
    if method == "random":
        return run_random(problem, seed, budget, on_eval)
    raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")


def drive(
    spec: StudySpec,
    budget: int,
    measure: Callable[[Config], dict[str, float]],
    on_eval: OnEval | None = None,
) -> tuple[list[Trial], dict[str, int]]:
    """``budget`` trials of the study through ``runner.loop.run_trials`` (the service's loop:
    each trial stored as the server stores it, with its step kind and its low-dimensional
    point when the study searches an embedding). Returns the trials and their step counts.
    """
    trials = run_trials(
        spec,
        lambda config: Measured(measure(config)),
        budget,
        on_trial=lambda trial: _tick(on_eval),
    )
    sources = Counter(t.step.value for t in trials)
    if any(t.warning for t in trials):
        sources["warnings"] = sum(bool(t.warning) for t in trials)
    return trials, dict(sources)


def run_ours(problem: Problem, seed: int, budget: int, on_eval: OnEval | None = None) -> RunResult:
    """Our designer, one suggestion at a time, with a warm-starting ``FitCache``."""
    start = time.perf_counter()
    trials, sources = drive(
        problem.spec(seed), budget, lambda config: problem.metrics(problem.point(config)), on_eval
    )
    seconds = time.perf_counter() - start
    points = [problem.point(t.config) for t in trials]
    return RunResult("ours", problem.name, seed, best_curve(problem, points), seconds, sources)


def run_skopt(
    problem: Problem,
    seed: int,
    budget: int,
    n_initial: int | None = None,
    on_eval: OnEval | None = None,
) -> RunResult:
    """``skopt.gp_minimize`` on the (penalized) objective."""
    points: list[list[float]] = []

    def objective(x: list[float]) -> float:
        x = [float(v) for v in x]
        points.append(x)
        _tick(on_eval)
        return penalized(problem, x)

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # repeated-point and GP convergence notes
        gp_minimize(
            objective,
            dimensions=[tuple(b) for b in problem.bounds],
            n_calls=budget,
            n_initial_points=10 if n_initial is None else n_initial,
            random_state=seed,
        )
    seconds = time.perf_counter() - start
    return RunResult("skopt", problem.name, seed, best_curve(problem, points), seconds)


def run_random(
    problem: Problem, seed: int, budget: int, on_eval: OnEval | None = None
) -> RunResult:
    """Uniform random search in the box."""
    rng = np.random.default_rng(seed)
    low = np.array([b[0] for b in problem.bounds])
    high = np.array([b[1] for b in problem.bounds])
    start = time.perf_counter()
    points = []
    for _ in range(budget):
        points.append([float(v) for v in low + (high - low) * rng.random(problem.dim)])
        _tick(on_eval)
    seconds = time.perf_counter() - start
    return RunResult("random", problem.name, seed, best_curve(problem, points), seconds)


def penalized(problem: Problem, x: Sequence[float]) -> float:
    """``f(x)``, plus ``PENALTY`` times the total constraint violation when constrained."""
    value = problem.objective(x)
    if problem.constraints is not None:
        value += PENALTY * sum(max(0.0, c) for c in problem.constraints(x))
    return value


def best_curve(problem: Problem, points: Sequence[Sequence[float]]) -> list[float | None]:
    """Best feasible objective value after each point, in order (None before the first)."""
    out: list[float | None] = []
    best: float | None = None
    for x in points:
        if problem.is_feasible(x):
            value = problem.objective(x)
            if best is None or value < best:
                best = value
        out.append(best)
    return out


def _tick(on_eval: OnEval | None) -> None:
    if on_eval is not None:
        on_eval()
