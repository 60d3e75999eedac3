"""What every peer runner shares: feasibility, the run's bookkeeping, candidate lists, bad values.

* ``Judge`` reads a ``SuiteProblem``'s outcome constraints with ``tuner.constraints`` and says
  what a ``Measurement`` is worth: its objective value, whether it is feasible (completed,
  objective present, every constraint met), and each constraint's violation.
* ``Tracker`` is one run: it measures configurations with the run's own generator
  (``contract.run_rng``), records them, keeps the best completed feasible measurement so far
  (every peer's reported best except Ax's, which reports its own) and builds the
  ``MethodRun``.
* **Candidate lists** (``problem.candidates``): a peer only ever measures candidates. A
  proposal of a candidate already measured is answered from the earlier measurement without
  using the budget while some candidate is still unmeasured (``bench/cloud.py``'s rule for
  Optuna); after ``REPEAT_CAP x budget`` proposals the rest of the budget goes to unmeasured
  candidates in a seeded random order (counted in ``notes["fallback"]``).
* ``BadValues`` is the rule of the peers that know no constraints (scikit-optimize,
  mlos-core): a measurement that breaks a constraint, breaks the system or fails is told the
  worst objective value (``sign * value``) the run has measured so far; before any value
  exists such measurements wait and are told once the first one arrives.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.contract import Measurement, MethodRun, SuiteProblem, run_rng
from tuner.constraints import OutcomeConstraint
from tuner.space import (
    Config,
    FloatKnob,
    IntKnob,
    Knob,
    OrdinalKnob,
    Scalar,
    SearchSpace,
    knob_from_dict,
    value_key,
)

OnEval = Callable[[], None]
#: Proposals per unit of budget before a candidate-list run falls back to unmeasured
#: candidates (bench/cloud.py's cap for Optuna).
REPEAT_CAP = 10
#: Int knobs with more values are given to Optuna's GP sampler and to Ax as float ranges and
#: rounded: both list every value of an int parameter when they optimize the acquisition
#: (5.3e9 values for sysbench-20's innodb_buffer_pool_size: tens of GiB, an OOM kill).
MAX_INT_VALUES = 10_000
#: The one dimension of a candidate list: the candidate's index.
CANDIDATE = "candidate"


def space_of(problem: SuiteProblem) -> SearchSpace:
    """The problem's knobs as a validated ``SearchSpace``."""
    return SearchSpace(tuple(knob_from_dict(k) for k in problem.knobs))


def config_key(config: Config) -> tuple[Any, ...]:
    """A hashable key of a configuration (``True`` apart from ``1``, ``1`` equal to ``1.0``)."""
    return tuple(sorted((name, value_key(value)) for name, value in config.items()))


def plain(value: Any) -> Scalar:
    """A numpy scalar (what skopt and Ax hand back) as the Python scalar."""
    out: Scalar = value.item() if hasattr(value, "item") else value
    return out


def missing(module: str, hint: str) -> str | None:
    """None when ``module`` can be imported, else why not and how to install it."""
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed ({hint})"
    return None


@contextlib.contextmanager
def quiet(*loggers: str) -> Iterator[None]:
    """Silence a peer library: its warnings, and its ``loggers`` below WARNING.

    The libraries warn about their own internals (repeated points, experimental features,
    model fits); the suite runs them as their users would and keeps its output readable.
    """
    levels = {name: logging.getLogger(name).level for name in loggers}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in loggers:
            logging.getLogger(name).setLevel(logging.WARNING)
        try:
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


class Judge:
    """Objective value, feasibility and constraint violations of measurements of a problem."""

    def __init__(self, problem: SuiteProblem) -> None:
        self.objective = problem.objective
        self.sign = problem.sign
        self.constraints = tuple(
            OutcomeConstraint.parse(text, f"{problem.name}.constraints")
            for text in problem.constraints
        )
        for constraint in self.constraints:
            if constraint.relative:
                raise ValueError(
                    f"{problem.name}: relative constraint {constraint} has no default to "
                    "resolve it against in the suite"
                )

    def value(self, measurement: Measurement) -> float | None:
        """The objective value of a completed measurement, None when there is none."""
        if measurement.status != "completed":
            return None
        value = measurement.metrics.get(self.objective)
        return None if value is None or not math.isfinite(value) else float(value)

    def violations(self, measurement: Measurement) -> list[float]:
        """One number per constraint, ``<= 0`` when met (a missing metric counts as 1.0)."""
        out = []
        for constraint in self.constraints:
            value = measurement.metrics.get(constraint.metric)
            out.append(1.0 if value is None else -constraint.slack(float(value)))
        return out

    def feasible(self, measurement: Measurement) -> bool:
        """Completed, with an objective value, and every outcome constraint met."""
        return self.value(measurement) is not None and all(
            v <= 0.0 for v in self.violations(measurement)
        )


class Tracker:
    """One run of a peer: measures, records, keeps the best so far, builds the ``MethodRun``.

    Args:
        method: The peer's name.
        problem: The problem.
        seed: The run's seed (also orders the candidate fallback).
        budget: Evaluations of the run.
        on_eval: Called after each evaluation.
    """

    def __init__(
        self,
        method: str,
        problem: SuiteProblem,
        seed: int,
        budget: int,
        on_eval: OnEval | None = None,
    ) -> None:
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        self.method, self.problem, self.seed, self.budget = method, problem, seed, budget
        self.judge = Judge(problem)
        self.space = space_of(problem)
        self.configs: list[Config] = []
        self.measurements: list[Measurement] = []
        self.reported: list[Config | None] = []
        self.notes: Counter[str] = Counter()
        self.best: Config | None = None
        self._best_score = math.inf
        self._rng = run_rng(problem.name, seed)
        self._on_eval = on_eval
        self._candidates = {config_key(c): i for i, c in enumerate(problem.candidates)}
        self._seen: dict[tuple[Any, ...], Measurement] = {}
        self._proposals = 0
        self._start = time.perf_counter()

    @property
    def done(self) -> bool:
        """Whether the budget is spent."""
        return len(self.configs) >= self.budget

    @property
    def stalled(self) -> bool:
        """Whether a candidate-list run has proposed ``REPEAT_CAP x budget`` times."""
        return self._proposals >= REPEAT_CAP * self.budget

    def propose(self, config: Config) -> tuple[Measurement, bool]:
        """Measure a proposal, or answer a repeated candidate from its earlier measurement.

        Returns:
            The measurement and whether it was new (used one evaluation of the budget).
        """
        config = self.space.validate_config(config)
        self._proposals += 1
        if self.problem.candidates:
            key = config_key(config)
            if key not in self._candidates:
                raise ValueError(f"{self.method} proposed a non-candidate {config}")
            if key in self._seen and len(self._seen) < len(self._candidates):
                self.notes["repeats"] += 1
                return self._seen[key], False
        return self.measure(config), True

    def measure(self, config: Config) -> Measurement:
        """Measure ``config`` (one evaluation) and record it."""
        measurement = self.problem.measure(config, self._rng)
        self.configs.append(config)
        self.measurements.append(measurement)
        self._seen.setdefault(config_key(config), measurement)
        value = self.judge.value(measurement)
        if value is not None and self.judge.feasible(measurement):
            score = self.judge.sign * value
            if score < self._best_score:
                self._best_score, self.best = score, config
        self.reported.append(self.best)
        if self._on_eval is not None:
            self._on_eval()
        return measurement

    def report(self, config: Config | None) -> None:
        """Replace what the last evaluation reports (for a peer with its own best-point rule)."""
        self.reported[-1] = config

    def fill(self, note: str | None = "fallback") -> None:
        """Spend the rest of the budget on unmeasured candidates, in a seeded random order.

        Once every candidate is measured, they are measured again in the same order.
        ``note``: the counter of ``notes`` that counts these evaluations (None: none).
        """
        if not self.problem.candidates:
            raise ValueError(f"{self.problem.name} has no candidate list to fill from")
        order = np.random.default_rng(self.seed).permutation(len(self.problem.candidates))
        unmeasured = [
            int(i) for i in order if config_key(self.problem.candidates[i]) not in self._seen
        ]
        queue = unmeasured + [int(i) for i in order] * self.budget
        for index in queue:
            if self.done:
                return
            if note is not None:
                self.notes[note] += 1
            self.measure(self.space.validate_config(self.problem.candidates[index]))

    def result(self) -> MethodRun:
        """The run as the suite stores it."""
        return MethodRun(
            method=self.method,
            problem=self.problem.name,
            seed=self.seed,
            configs=list(self.configs),
            measurements=list(self.measurements),
            reported=list(self.reported),
            seconds=time.perf_counter() - self._start,
            notes=dict(self.notes),
        )


class BadValues:
    """The value told to a peer without constraints for each measurement (module docstring).

    ``add`` takes a token (whatever the peer needs to tell a point) and its measurement and
    returns the ``(token, value)`` pairs to tell now, in order; values are ``sign * value``,
    to be minimized.
    """

    def __init__(self, judge: Judge) -> None:
        self._judge = judge
        self._worst: float | None = None
        self._waiting: list[Any] = []

    def add(self, token: Any, measurement: Measurement) -> list[tuple[Any, float]]:
        """The tells due after ``measurement`` of the point ``token``."""
        value = self._judge.value(measurement)
        if value is not None:
            score = self._judge.sign * value
            self._worst = score if self._worst is None else max(self._worst, score)
        if self._worst is None:
            self._waiting.append(token)
            return []
        out = [(t, self._worst) for t in self._waiting]
        self._waiting = []
        good = value is not None and self._judge.feasible(measurement)
        out.append((token, self._judge.sign * value if good and value is not None else self._worst))
        return out


@dataclass(frozen=True)
class Dim:
    """One dimension as the peers' libraries see it.

    Attributes:
        name: The knob's name (``CANDIDATE`` for a candidate list).
        kind: ``float``, ``int``, ``categorical`` (unordered indices ``0..high``) or
            ``ordinal`` (ordered indices ``0..high``).
        low: Lower bound (0 for indices).
        high: Upper bound (the last index for choices).
        log: Log-scaled (float and int knobs).
    """

    name: str
    kind: str
    low: float
    high: float
    log: bool = False


class Encoding:
    """The problem's space as ``Dim``s, and the way back to a configuration.

    Choice knobs are handed to the libraries as indices into their values, so that mixed-type
    choices (``0``, ``"auto"``) and bools survive every library: categorical and bool knobs
    as unordered indices, ordinal knobs as ordered ones. A candidate list is one unordered
    dimension, ``CANDIDATE``, over the candidates' indices.
    """

    def __init__(self, problem: SuiteProblem) -> None:
        self.space = space_of(problem)
        self.candidates = problem.candidates
        self.dims: tuple[Dim, ...]
        if self.candidates:
            self.dims = (Dim(CANDIDATE, "categorical", 0, len(self.candidates) - 1),)
        else:
            self.dims = tuple(_dim(knob) for knob in self.space.knobs)

    def decode(self, raw: Mapping[str, Any]) -> Config:
        """The configuration of a library's point (name -> value, indices for choices)."""
        if self.candidates:
            return dict(self.candidates[int(raw[CANDIDATE])])
        out: Config = {}
        for knob in self.space.knobs:
            value = plain(raw[knob.name])
            if isinstance(knob, FloatKnob):
                out[knob.name] = min(knob.high, max(knob.low, float(value)))
            elif isinstance(knob, IntKnob):
                out[knob.name] = int(min(knob.high, max(knob.low, round(float(value)))))
            else:
                out[knob.name] = knob.choices[int(value)]  # type: ignore[attr-defined]
        return out


def random_config(space: SearchSpace, rng: np.random.Generator) -> Config:
    """A configuration drawn uniformly over each knob as the knob is scaled.

    Float knobs uniform on ``[low, high]`` (on ``[log low, log high]`` when ``log``); int knobs
    uniform over the integers, or log-uniform (``floor(exp(U[log low, log(high + 1)]))``);
    choice knobs (categorical, bool, ordinal) uniform over their values.
    """
    return {knob.name: _draw(knob, rng) for knob in space.knobs}


def _draw(knob: Knob, rng: np.random.Generator) -> Scalar:
    if isinstance(knob, FloatKnob):
        if knob.log:
            return float(
                min(knob.high, max(knob.low, math.exp(rng.uniform(*_logs(knob.low, knob.high)))))
            )
        return float(rng.uniform(knob.low, knob.high))
    if isinstance(knob, IntKnob):
        low, high = int(knob.low), int(knob.high)
        if knob.log:
            drawn = math.floor(math.exp(rng.uniform(*_logs(low, high + 1))))
            return int(min(high, max(low, drawn)))
        return int(rng.integers(low, high, endpoint=True))
    choices = knob.choices  # type: ignore[attr-defined]
    return choices[int(rng.integers(len(choices)))]  # type: ignore[no-any-return]


def _logs(low: float, high: float) -> tuple[float, float]:
    return math.log(low), math.log(high)


def _dim(knob: Knob) -> Dim:
    if isinstance(knob, FloatKnob | IntKnob):
        return Dim(knob.name, knob.kind, knob.low, knob.high, knob.log)
    kind = "ordinal" if isinstance(knob, OrdinalKnob) else "categorical"
    return Dim(knob.name, kind, 0, len(knob.choices) - 1)  # type: ignore[attr-defined]
