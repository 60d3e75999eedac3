"""The LlamaTune benchmark's problem type, ALEBO's embedded problems, and their published curves.

A ``KnobProblem`` is a tuning problem as every method of ``bench/llamatune.py`` sees it: a list
of knobs (the dictionaries ``tuner.space.knob_from_dict`` reads), one metric with a goal, and
``evaluate(config) -> value``. Every method, ours and the peers, calls the same ``evaluate``
in the benchmark's own process.

**ALEBO's embedded problems**, defined exactly as in ``facebookresearch/alebo`` @ ``2f8c7ba``
``benchmarks/benchmark_problems.py`` (read with git from the fetched repository; the same
definitions are in its initial commit ``fea0a1a``), which builds Ax ``BenchmarkProblem``s:

* ``Branin, D=100``: 100 float parameters ``x0..x99``; ``x0..x49`` in ``[-5, 10]`` and
  ``x50..x99`` in ``[0, 15]`` ("blocks of 50 for each with each of the bounds");
  ``BraninMetric(param_names=["x19", "x64"])``, i.e. ``f(x) = branin(x19, x64)``; minimize;
  ``optimal_value=0.397887``. 50 evaluations per run in ALEBO's ``run_ax_benchmarks.py``.
* ``Hartmann6, D=100``: 100 float parameters ``x0..x99`` in ``[0, 1]``;
  ``Hartmann6Metric(param_names=["x19", "x14", "x43", "x37", "x66", "x3"])``, i.e.
  ``f(x) = hartmann6(x19, x14, x43, x37, x66, x3)`` in that order (the indices are
  ``np.random.seed(10); np.random.shuffle(np.arange(100))[:6]``); minimize;
  ``optimal_value=-3.32237``; 200 evaluations.
* ``Hartmann6, D=1000``: 1000 float parameters ``x0..x999`` in ``[0, 1]``; active
  ``x190, x140, x430, x370, x660, x30`` in that order; otherwise as D=100; 200 evaluations.

**A guard of ours, not ALEBO's**: ``hartmann6-d20`` is Hartmann6 on six of 20 knobs in ``[0, 1]``
(``x3, x7, x11, x14, x17, x19`` in that order), 100 evaluations, a 16-dimensional embedding:
the size of the MySQL SYSBENCH problem with an interior optimum instead of one on the faces
of the box. A designer change tuned on SYSBENCH must not lose here (``bench/NOTES.md``, "Passed
on SYSBENCH, reverted": a linear prior mean took the mean best at 50 from -3.16 to -2.13). It
has no published curves.

The active parameters are therefore *not* the first coordinates, and Branin's two blocks carry
different bounds. Ax's ``NoisyFunctionMetric._evaluate`` passes ``[params[p] for p in
param_names]`` in ``param_names`` order (``facebook/Ax`` ``ax/metrics/noisy_function.py``);
``BraninMetric.f`` (``ax/metrics/branin.py``) and ``hartmann6``
(``ax/utils/measurement/synthetic_functions.py``: ``alpha = (1.0, 1.2, 3.0, 3.2)``, ``A``,
``P * 1e-4``, minimizer ``(0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573)``) are the
standard formulas, the same as ``bench/problems.py`` ``branin`` and ``hartmann6`` (which
``tests/bench`` checks against ``botorch.test_functions``). The noise is ``noise_sd=0.0``.

**Published curves**: ``shared/benchdata/hdbo_alebo_baselines/alebo_benchmark_curves.csv``
holds per-iteration best-value statistics over ALEBO's replicates (50; SMAC at D=1000: 10)
for ALEBO, REMBO, HeSBO, TuRBO, SMAC, CMA-ES, EBO, Add-GP-UCB, LineBO and Sobol, extracted
from the repository's ``benchmarks/results/*_aggregated_results.json`` (the data of the
paper's Fig. 5). ``inf`` means no feasible point yet (Gramacy only).

References:
    Letham, Calandra, Rai, Bakshy, "Re-examining linear embeddings for high-dimensional
    Bayesian optimization", NeurIPS 2020 (ALEBO).
    Nayebi, Munteanu, Poloczek, "A framework for Bayesian optimization in embedded
    subspaces", ICML 2019 (HeSBO).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.problems import branin, hartmann6
from tuner.space import Scalar

CURVES_CSV = Path("hdbo_alebo_baselines") / "alebo_benchmark_curves.csv"
BRANIN_ACTIVE = (19, 64)
HARTMANN6_ACTIVE = {100: (19, 14, 43, 37, 66, 3), 1000: (190, 140, 430, 370, 660, 30)}
HARTMANN6_GUARD_ACTIVE = (3, 7, 11, 14, 17, 19)  # hartmann6-d20: ours, not ALEBO's
#: Published methods shown next to ours (CSV name -> display name); the rest stay in the JSON.
SHOWN_PUBLISHED = {
    "ALEBO": "ALEBO",
    "HeSBO, d=d": "HeSBO d=d",
    "HeSBO, d=2d": "HeSBO d=2d",
    "REMBO": "REMBO",
    "turbo": "TuRBO",
    "smac": "SMAC",
    "cmaes": "CMA-ES",
    "Sobol": "Sobol",
}


@dataclass(frozen=True)
class KnobProblem:
    """A tuning problem: knobs, one metric and its goal, and a deterministic evaluation.

    Attributes:
        name: Short name (also the study name).
        knobs: Knob dictionaries as ``tuner.space.knob_from_dict`` reads them (kinds ``float``,
            ``int`` and ``categorical``; ``special_values`` on int knobs).
        evaluate: ``config -> metric value``; the one objective code every method calls.
        metric: Name of the metric (``f``, ``tps``, ``latency``).
        goal: ``minimize`` or ``maximize``.
        budget: Evaluations per run.
        quick_budget: Evaluations per run under ``--quick``.
        embed_dims: Dimension of the LlamaTune embedding (ours and mlos-core).
        optimum: The known optimum of the metric, when there is one.
        published: The problem's name in ALEBO's published curves, when they exist.
        source: Where the definition was read.
    """

    name: str
    knobs: tuple[dict[str, Any], ...]
    evaluate: Callable[[Mapping[str, Scalar]], float]
    metric: str
    goal: str
    budget: int
    quick_budget: int
    embed_dims: int
    optimum: float | None = None
    published: str | None = None
    source: str = ""

    @property
    def dim(self) -> int:
        return len(self.knobs)

    @property
    def sign(self) -> float:
        """``+1`` to minimize, ``-1`` to maximize: ``sign * value`` is always minimized."""
        return 1.0 if self.goal == "minimize" else -1.0

    def better(self, a: float, b: float) -> bool:
        """True when ``a`` is strictly better than ``b``."""
        return self.sign * a < self.sign * b


@dataclass(frozen=True)
class PublishedCurve:
    """One method's published best-value curve (index ``i`` = after ``i + 1`` evaluations).

    Attributes:
        method: The method's name in the CSV.
        reps: Number of replicates behind the statistics.
        mean: Mean best value (``inf`` before a feasible point).
        sem: Standard error of the mean.
        median: Median best value.
    """

    method: str
    reps: int
    mean: tuple[float, ...]
    sem: tuple[float, ...]
    median: tuple[float, ...]

    def at(self, evals: int) -> float | None:
        """Mean best after ``evals`` evaluations, or None beyond the published budget."""
        return self.mean[evals - 1] if 1 <= evals <= len(self.mean) else None


def branin_problem(budget: int = 50) -> KnobProblem:
    """ALEBO's ``Branin, D=100``: ``branin(x19, x64)``, x0..x49 in [-5, 10], x50..x99 in [0, 15]."""
    knobs = tuple(
        _float_knob(f"x{i}", -5.0, 10.0) if i < 50 else _float_knob(f"x{i}", 0.0, 15.0)
        for i in range(100)
    )
    names = tuple(f"x{i}" for i in BRANIN_ACTIVE)
    return KnobProblem(
        name="branin-d100",
        knobs=knobs,
        evaluate=_embedded(branin, names),
        metric="f",
        goal="minimize",
        budget=budget,
        quick_budget=25,
        embed_dims=16,
        optimum=0.397887,
        published="Branin, D=100",
        source="facebookresearch/alebo@2f8c7ba benchmarks/benchmark_problems.py branin_100",
    )


def hartmann6_problem(dim: int, budget: int = 200) -> KnobProblem:
    """ALEBO's ``Hartmann6, D=100`` or ``D=1000``: [0, 1]^D, six scattered active parameters."""
    if dim not in HARTMANN6_ACTIVE:
        raise ValueError(f"ALEBO defines Hartmann6 for D in {sorted(HARTMANN6_ACTIVE)}, not {dim}")
    names = tuple(f"x{i}" for i in HARTMANN6_ACTIVE[dim])
    return KnobProblem(
        name=f"hartmann6-d{dim}",
        knobs=tuple(_float_knob(f"x{i}", 0.0, 1.0) for i in range(dim)),
        evaluate=_embedded(hartmann6, names),
        metric="f",
        goal="minimize",
        budget=budget,
        quick_budget=50,
        embed_dims=16,
        optimum=-3.32237,
        published=f"Hartmann6, D={dim}",
        source=f"facebookresearch/alebo@2f8c7ba benchmarks/benchmark_problems.py hartmann6_{dim}",
    )


def hartmann6_guard_problem() -> KnobProblem:
    """``hartmann6-d20``: Hartmann6 on 6 of 20 knobs in [0, 1], 100 evaluations (module doc)."""
    names = tuple(f"x{i}" for i in HARTMANN6_GUARD_ACTIVE)
    return KnobProblem(
        name="hartmann6-d20",
        knobs=tuple(_float_knob(f"x{i}", 0.0, 1.0) for i in range(20)),
        evaluate=_embedded(hartmann6, names),
        metric="f",
        goal="minimize",
        budget=100,
        quick_budget=50,
        embed_dims=16,
        optimum=-3.32237,
        source="bench/hdbo.py hartmann6_guard_problem (a guard of this repository)",
    )


def alebo_problems() -> dict[str, KnobProblem]:
    """The three embedded problems with published curves, by name."""
    problems = (branin_problem(), hartmann6_problem(100), hartmann6_problem(1000))
    return {p.name: p for p in problems}


def read_published(data_dir: Path) -> dict[str, dict[str, PublishedCurve]]:
    """``problem name -> method -> curve`` from ALEBO's published per-iteration curves.

    Args:
        data_dir: The ``shared/benchdata`` folder.
    """
    rows: dict[tuple[str, str], list[dict[str, str]]] = {}
    with (data_dir / CURVES_CSV).open(newline="") as handle:
        for row in csv.DictReader(handle):
            rows.setdefault((row["problem"], row["method"]), []).append(row)
    out: dict[str, dict[str, PublishedCurve]] = {}
    for (problem, method), group in rows.items():
        group.sort(key=lambda r: int(r["iteration"]))
        if [int(r["iteration"]) for r in group] != list(range(1, len(group) + 1)):
            raise ValueError(f"{CURVES_CSV}: iterations of {problem} / {method} are not 1..n")
        out.setdefault(problem, {})[method] = PublishedCurve(
            method=method,
            reps=int(group[0]["n_reps"]),
            mean=tuple(_number(r["mean_best"]) for r in group),
            sem=tuple(_number(r["sem_best"]) for r in group),
            median=tuple(_number(r["median_best"]) for r in group),
        )
    return out


def published_summary(
    curves: Mapping[str, PublishedCurve] | None, checkpoints: Sequence[int]
) -> dict[str, Any]:
    """The shown methods' replicates, mean best at ``checkpoints`` and mean curves."""
    out: dict[str, Any] = {}
    for method, label in SHOWN_PUBLISHED.items():
        curve = (curves or {}).get(method)
        if curve is not None:
            out[label] = {
                "reps": curve.reps,
                "at": {str(c): curve.at(c) for c in checkpoints},
                "mean_curve": list(curve.mean),
            }
    return out


def _float_knob(name: str, low: float, high: float) -> dict[str, Any]:
    return {"name": name, "kind": "float", "low": low, "high": high}


def _embedded(
    function: Callable[[Sequence[float]], float], names: tuple[str, ...]
) -> Callable[[Mapping[str, Scalar]], float]:
    """``config -> function(config[names[0]], config[names[1]], ...)``."""

    def evaluate(config: Mapping[str, Scalar]) -> float:
        return function([float(config[name]) for name in names])

    return evaluate


def _number(text: str) -> float:
    """A CSV cell as a float (``inf`` and ``nan`` included)."""
    return float(text) if text.strip() else math.nan
