"""Synthetic test problems with known optima, as plain functions and as tuner studies.

* **Branin** (2-d, ``x1 in [-5, 10]``, ``x2 in [0, 15]``): minimum 0.397887 at
  ``(-pi, 12.275)``, ``(pi, 2.275)`` and ``(9.42478, 2.475)``.
* **Hartmann6** (``[0, 1]^6``): minimum -3.32237 at
  ``(0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573)``; ``A``, ``P * 1e-4`` and
  ``alpha = (1.0, 1.2, 3.0, 3.2)`` as in the Virtual Library of Simulation Experiments.
* **Gramacy** (2-d, ``[0, 1]^2``): minimize ``x1 + x2`` subject to
  ``c1 = 1.5 - x1 - 2 x2 - 0.5 sin(2 pi (x1^2 - 2 x2)) <= 0`` and
  ``c2 = x1^2 + x2^2 - 1.5 <= 0``; minimum 0.59979 at ``(0.19512, 0.40467)``; the worst
  feasible value is ``sqrt(3)`` at ``(sqrt(3)/2, sqrt(3)/2)``.

The formulas are written out here in plain Python; ``tests/bench`` checks them against
``botorch.test_functions`` and the optima above. ``smooth`` is the noisy test function of the
latency benchmark (any dimension, no constraints).

References:
    Surjanovic, Bingham, "Virtual Library of Simulation Experiments: Test Functions and
    Datasets", https://www.sfu.ca/~ssurjano (Branin, Hartmann6).
    Gramacy, Gray, Le Digabel, Lee, Ranjan, Wells, Wild, "Modeling an augmented Lagrangian for
    blackbox constrained optimization", Technometrics 58(1), 2016.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.space import Config
from tuner.study import StudySpec

OBJECTIVE = "f"

_H6_ALPHA = (1.0, 1.2, 3.0, 3.2)
_H6_A = (
    (10.0, 3.0, 17.0, 3.5, 1.7, 8.0),
    (0.05, 10.0, 17.0, 0.1, 8.0, 14.0),
    (3.0, 3.5, 1.7, 10.0, 17.0, 8.0),
    (17.0, 8.0, 0.05, 10.0, 0.1, 14.0),
)
_H6_P = (
    (1312, 1696, 5569, 124, 8283, 5886),
    (2329, 4135, 8307, 3736, 1004, 9991),
    (2348, 1451, 3522, 2883, 3047, 6650),
    (4047, 8828, 8732, 5743, 1091, 381),
)


def branin(x: Sequence[float]) -> float:
    """Branin-Hoo function of ``(x1, x2)``."""
    x1, x2 = x
    t1 = x2 - 5.1 / (4 * math.pi**2) * x1**2 + 5 / math.pi * x1 - 6
    return t1**2 + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1) + 10


def hartmann6(x: Sequence[float]) -> float:
    """Six-dimensional Hartmann function on ``[0, 1]^6``."""
    total = 0.0
    for alpha, a_row, p_row in zip(_H6_ALPHA, _H6_A, _H6_P, strict=True):
        inner = sum(a * (xi - 1e-4 * p) ** 2 for a, xi, p in zip(a_row, x, p_row, strict=True))
        total += alpha * math.exp(-inner)
    return -total


def gramacy_objective(x: Sequence[float]) -> float:
    """Objective of the Gramacy et al. (2016) toy problem: ``x1 + x2``."""
    return x[0] + x[1]


def gramacy_constraints(x: Sequence[float]) -> tuple[float, float]:
    """``(c1, c2)`` of the Gramacy toy problem; a point is feasible when both are ``<= 0``."""
    x1, x2 = x
    c1 = 1.5 - x1 - 2 * x2 - 0.5 * math.sin(2 * math.pi * (x1**2 - 2 * x2))
    c2 = x1**2 + x2**2 - 1.5
    return c1, c2


def smooth(x: Sequence[float]) -> float:
    """A smooth multimodal function on ``[0, 1]^d`` (minimum near ``x_i = 0.3 + 0.4 i/(d-1)``).

    ``sum_i (x_i - c_i)^2 - 0.1 cos(4 pi (x_i - c_i))``: a bowl with ripples, so the GP has
    something to learn in every dimension. The latency benchmark adds Gaussian noise.
    """
    d = len(x)
    total = 0.0
    for i, xi in enumerate(x):
        c = 0.3 + 0.4 * i / max(1, d - 1)
        total += (xi - c) ** 2 - 0.1 * math.cos(4 * math.pi * (xi - c))
    return total


@dataclass(frozen=True)
class Problem:
    """A minimization problem on a box, optionally with constraints ``c_i(x) <= 0``.

    Attributes:
        name: Short name, also the study name.
        bounds: ``(low, high)`` per input dimension.
        objective: ``x -> f(x)``.
        optimum: The known minimum of ``f`` over the feasible set.
        budget: Evaluations per run in the synthetic benchmark.
        checkpoints: Budgets at which the benchmark reports the best value.
        constraints: ``x -> (c_1(x), ..., c_m(x))``, or None when unconstrained.
        worst_feasible: The largest feasible value of ``f``; stands in for "no feasible point
            found yet" when averaging best values (only used by constrained problems).
    """

    name: str
    bounds: tuple[tuple[float, float], ...]
    objective: Callable[[Sequence[float]], float]
    optimum: float
    budget: int
    checkpoints: tuple[int, ...]
    constraints: Callable[[Sequence[float]], tuple[float, ...]] | None = None
    worst_feasible: float = math.inf
    constraint_names: tuple[str, ...] = field(default=())

    @property
    def dim(self) -> int:
        return len(self.bounds)

    @property
    def knob_names(self) -> tuple[str, ...]:
        return tuple(f"x{i + 1}" for i in range(self.dim))

    def metrics(self, x: Sequence[float]) -> dict[str, float]:
        """Everything a trial reports: the objective and each constraint value."""
        out = {OBJECTIVE: self.objective(x)}
        if self.constraints is not None:
            out.update(zip(self.constraint_names, self.constraints(x), strict=True))
        return out

    def is_feasible(self, x: Sequence[float]) -> bool:
        return self.constraints is None or all(c <= 0 for c in self.constraints(x))

    def point(self, config: Config) -> list[float]:
        """A configuration of ``spec()`` as the input vector of the functions."""
        return [float(config[name]) for name in self.knob_names]

    def spec(self, seed: int, initial_trials: int | None = None) -> StudySpec:
        """The problem as a study: float knobs ``x1..xd``, minimize ``f``, ``c_i <= 0``.

        Args:
            seed: The study's designer seed.
            initial_trials: Size of the Sobol initial design (None: the product default).
        """
        designer: dict[str, Any] = {"algorithm": "bo", "seed": seed}
        if initial_trials is not None:
            designer["initial_trials"] = initial_trials
        return StudySpec.from_dict(
            {
                "name": self.name,
                "knobs": [
                    {"name": name, "kind": "float", "low": low, "high": high}
                    for name, (low, high) in zip(self.knob_names, self.bounds, strict=True)
                ],
                "objectives": [{"name": OBJECTIVE, "goal": "minimize"}],
                "outcome_constraints": [f"{c} <= 0" for c in self.constraint_names],
                "designer": designer,
            }
        )


BRANIN = Problem(
    name="branin",
    bounds=((-5.0, 10.0), (0.0, 15.0)),
    objective=branin,
    optimum=0.397887,
    budget=30,
    checkpoints=(10, 20, 30),
)
HARTMANN6 = Problem(
    name="hartmann6",
    bounds=((0.0, 1.0),) * 6,
    objective=hartmann6,
    optimum=-3.32237,
    budget=50,
    checkpoints=(10, 25, 50),
)
GRAMACY = Problem(
    name="gramacy",
    bounds=((0.0, 1.0), (0.0, 1.0)),
    objective=gramacy_objective,
    optimum=0.59979,
    budget=30,
    checkpoints=(10, 20, 30),
    constraints=gramacy_constraints,
    worst_feasible=math.sqrt(3.0),
    constraint_names=("c1", "c2"),
)
PROBLEMS: dict[str, Problem] = {p.name: p for p in (BRANIN, HARTMANN6, GRAMACY)}


def unit_box_spec(name: str, d: int, seed: int = 0) -> StudySpec:
    """A study over ``[0, 1]^d`` (float knobs ``x1..xd``) minimizing an unconstrained ``f``."""
    problem = Problem(name, ((0.0, 1.0),) * d, smooth, math.nan, 0, ())
    return problem.spec(seed)
