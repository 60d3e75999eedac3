"""Suggest latency of one sequential BO step: our designer against scikit-optimize.

Run as ``python -m bench.latency [--quick] [--reps R] [--sizes 50,100,200] [--dims 6,16]``.

Both optimizers see the same history: ``n`` points drawn uniformly from ``[0, 1]^d`` (seeded)
with values of ``bench.problems.smooth`` plus Gaussian noise. What is timed is what a study
pays between a client reporting trial ``n`` and receiving trial ``n + 1``:

* **ours**: ``BODesigner.suggest(1, completed[:n], [])`` with a ``FitCache`` that already holds
  the hyperparameters fitted at ``n - 1`` (the server keeps one cache per process), i.e. a
  warm-started GP fit + qLogNEI + multi-start L-BFGS-B on the acquisition;
* **skopt**: ``Optimizer.tell(x_n, y_n)`` (refits its GP from scratch and optimizes EI) and
  ``Optimizer.ask()``, after telling the first ``n - 1`` points untimed.

Each cell times ``reps`` consecutive steps ``n, n + 1, ...`` for each optimizer, interleaved
(ours, skopt, ours, ...) so that load changes on the machine hit both, and reports medians and
the ratio skopt/ours (> 1: ours is faster). Results go to ``bench/results/latency.json``
(``latency-TAG.json`` with ``--tag TAG``).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import Progress
from rich.table import Table
from skopt import Optimizer

from bench.common import (
    completed_trial,
    console,
    limit_threads,
    load_note,
    machine_info,
    median,
    show,
    write_json,
)
from bench.problems import smooth, unit_box_spec
from tuner.designer import BODesigner, FitCache
from tuner.trial import Trial

NOISE_STD = 0.05
GOAL = {"d": 16, "n": 100, "seconds": 1.0}


@dataclass(frozen=True)
class Preset:
    """Default repetitions, history sizes and dimensions of a run."""

    reps: int
    sizes: tuple[int, ...]
    dims: tuple[int, ...]


FULL = Preset(reps=5, sizes=(50, 100, 200), dims=(6, 16))
QUICK = Preset(reps=3, sizes=(50, 100), dims=(6, 16))


@dataclass
class Cell:
    """Timings of one ``(d, n)`` cell, in seconds, one entry per repetition."""

    d: int
    n: int
    ours: list[float] = field(default_factory=list)
    skopt: list[float] = field(default_factory=list)
    ours_sources: list[str] = field(default_factory=list)
    ours_cold: float | None = None

    @property
    def ours_median(self) -> float:
        return median(self.ours)

    @property
    def skopt_median(self) -> float:
        return median(self.skopt)

    @property
    def ratio(self) -> float:
        """skopt / ours: how many times faster our step is."""
        return self.skopt_median / self.ours_median


def history(d: int, size: int, seed: int) -> tuple[np.ndarray, list[float]]:
    """``size x d`` uniform points and their noisy ``smooth`` values."""
    rng = np.random.default_rng([seed, d])
    X = rng.random((size, d))
    y = [smooth(x) + NOISE_STD * float(rng.standard_normal()) for x in X]
    return X, y


def time_cell(d: int, n: int, reps: int, seed: int = 0, cold: bool = False) -> Cell:
    """Time ``reps`` sequential steps at ``n, n + 1, ...`` completed trials for both sides."""
    X, y = history(d, n + reps - 1, seed)
    spec = unit_box_spec(f"latency-d{d}", d, seed)
    trials = [
        completed_trial(i + 1, {f"x{j + 1}": float(v) for j, v in enumerate(x)}, {"f": y[i]}, "")
        for i, x in enumerate(X)
    ]
    cell = Cell(d, n)
    if cold:  # a fresh cache: the first suggestion after a server restart
        start = time.perf_counter()
        BODesigner(spec, FitCache()).suggest(1, trials[:n], [])
        cell.ours_cold = time.perf_counter() - start
    designer = BODesigner(spec, FitCache())
    designer.suggest(1, trials[: n - 1], [])  # warms the cache, untimed
    peer = _skopt_optimizer(d, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peer.tell([_floats(x) for x in X[: n - 1]], y[: n - 1])  # untimed
    for m in range(n, n + reps):
        seconds, source = _time_ours(designer, trials[:m])
        cell.ours.append(seconds)
        cell.ours_sources.append(source)
        cell.skopt.append(_time_skopt(peer, _floats(X[m - 1]), y[m - 1]))
    return cell


def run_latency(
    dims: tuple[int, ...],
    sizes: tuple[int, ...],
    reps: int,
    seed: int = 0,
    cold: bool = False,
    progress: Progress | None = None,
) -> list[Cell]:
    """Every ``(d, n)`` cell, in order of ``dims`` then ``sizes``."""
    cells = []
    task = progress.add_task("latency", total=len(dims) * len(sizes)) if progress else None
    for d in dims:
        for n in sizes:
            if progress is not None and task is not None:
                progress.update(task, description=f"d={d} n={n}")
            cells.append(time_cell(d, n, reps, seed, cold))
            if progress is not None and task is not None:
                progress.advance(task)
    return cells


def goal_check(cells: list[Cell]) -> dict[str, Any]:
    """Whether our median step at ``GOAL``'s ``(d, n)`` is below ``GOAL['seconds']``."""
    for cell in cells:
        if (cell.d, cell.n) == (GOAL["d"], GOAL["n"]):
            value = cell.ours_median
            return {**GOAL, "ours_median_s": value, "passed": value < GOAL["seconds"]}
    return {**GOAL, "ours_median_s": None, "passed": None}


def results_table(cells: list[Cell], title: str) -> Table:
    """The ratio table printed at the end of a run."""
    table = Table(title=title)
    for name in ("d", "n", "ours median s", "skopt median s", "skopt/ours", "ours cold s"):
        table.add_column(name, justify="right")
    for cell in cells:
        cold = f"{cell.ours_cold:.2f}" if cell.ours_cold is not None else "-"
        table.add_row(
            str(cell.d),
            str(cell.n),
            f"{cell.ours_median:.2f}",
            f"{cell.skopt_median:.2f}",
            f"{cell.ratio:.2f}",
            cold,
        )
    return table


def to_json(cells: list[Cell], meta: dict[str, Any]) -> dict[str, Any]:
    """The results file's content."""
    rows = []
    for cell in cells:
        row = asdict(cell)
        row.update(
            ours_median_s=cell.ours_median, skopt_median_s=cell.skopt_median, ratio=cell.ratio
        )
        rows.append(row)
    return {"benchmark": "latency", "meta": meta, "cells": rows, "goal": goal_check(cells)}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.report is not None:  # re-print the table of an earlier run
        data = json.loads(args.report.read_text())
        _print_report(cells_from_json(data), data["meta"], args.markdown)
        return 0
    preset = QUICK if args.quick else FULL
    reps = args.reps or preset.reps
    sizes = _ints(args.sizes) if args.sizes else preset.sizes
    dims = _ints(args.dims) if args.dims else preset.dims
    limit_threads(args.threads)
    meta = machine_info()
    meta.update(reps=reps, sizes=list(sizes), dims=list(dims), seed=args.seed, quick=args.quick)
    meta.update(threads=args.threads, cold=args.cold, tag=args.tag, noise_std=NOISE_STD)
    with Progress(console=console, transient=True) as progress:
        cells = run_latency(dims, sizes, reps, args.seed, args.cold, progress)
    meta["load_note"] = load_note(meta["load_average"])
    _print_report(cells, meta, args.markdown)
    name = f"latency-{args.tag}" if args.tag else "latency"
    path = write_json(name, to_json(cells, meta), args.out)
    console.print(f"wrote {path}")
    return 0


def cells_from_json(data: dict[str, Any]) -> list[Cell]:
    """The cells of a results file written by ``to_json``."""
    names = {f.name for f in fields(Cell)}
    return [Cell(**{k: v for k, v in row.items() if k in names}) for row in data["cells"]]


def _print_report(cells: list[Cell], meta: dict[str, Any], markdown: bool) -> None:
    table = results_table(cells, f"Suggest latency, one sequential step ({meta['reps']} reps)")
    show(table, markdown)
    console.print(f"[dim]{meta['load_note']}[/dim]")
    goal = goal_check(cells)
    if goal["passed"] is None:
        console.print("goal (ours at n=100, d=16 < 1 s): not measured in this run")
    else:
        verdict = "[green]PASS[/green]" if goal["passed"] else "[red]FAIL[/red]"
        console.print(
            f"goal (ours at n=100, d=16 < 1 s): {verdict} ({goal['ours_median_s']:.2f} s)"
        )


def _time_ours(designer: BODesigner, completed: list[Trial]) -> tuple[float, str]:
    start = time.perf_counter()
    suggestions = designer.suggest(1, completed, [])
    return time.perf_counter() - start, suggestions[0].step.value


def _time_skopt(peer: Optimizer, x: list[float], y: float) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn convergence notes on the GP fit
        start = time.perf_counter()
        peer.tell(x, y)
        peer.ask()
        return time.perf_counter() - start


def _skopt_optimizer(d: int, seed: int) -> Optimizer:
    return Optimizer(
        dimensions=[(0.0, 1.0)] * d,
        base_estimator="GP",
        acq_func="EI",
        n_initial_points=10,
        random_state=seed,
    )


def _floats(x: np.ndarray) -> list[float]:
    return [float(v) for v in x]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="reps 3, sizes 50,100, dims 6,16")
    parser.add_argument("--reps", type=int, help="steps timed per cell (default 5)")
    parser.add_argument("--sizes", help="completed trials n, comma-separated (50,100,200)")
    parser.add_argument("--dims", help="dimensions d, comma-separated (6,16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the history and optimizers")
    parser.add_argument("--threads", type=int, help="torch and BLAS threads (default: library)")
    parser.add_argument("--cold", action="store_true", help="also time ours with an empty cache")
    parser.add_argument("--out", type=Path, help="results folder (default bench/results)")
    parser.add_argument("--tag", help="write latency-TAG.json instead of latency.json")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--report", type=Path, help="only print the table of a results file")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
