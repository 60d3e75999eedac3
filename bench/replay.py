"""Optimizers on a measured table: how many trials each needs to get within 5 % of the best.

Run as ``python -m bench.replay --table CSV --objective NAME --goal minimize|maximize
[--knobs A,B] [--constraint "p99_ms <= 60"] [--seeds 20] [--budget N]
[--methods ours,grid,random,skopt]``.

The table is a replay table (``targets/replay.py``, written by ``runner.sweep``): every cell
of a knob grid measured a few times. Each method tunes the table through the replay target,
so it sees one recorded repetition per trial (measurement noise included, in a seeded order)
and never a number that was not measured. The answer is judged on the cells' *means*: the
best feasible cell is the one with the best mean objective among the cells whose means meet
every constraint (and that never broke); a run has reached the target at the first trial
whose cell is feasible and within 5 % of that best. A run that never reaches it counts as
the budget (shown ``>=``). Methods, the same seeds ``0 .. N-1``:

* ``ours``: our designer as a session drives it (the default cell first, then Sobol and
  constrained BO on the ordinal knobs);
* ``grid``: every cell in order, each knob from its highest value down (a Zeus-style sweep
  from the device's top setting);
* ``random``: cells in a random order, without repeats;
* ``skopt``: ``gp_minimize`` over the knobs' level indices (10 initial points, or half the
  budget when smaller); an observation that breaks a constraint is reported as the worst
  value seen so far, the usual penalty for an optimizer without constraints.

Results: ``bench/results/replay/<table>.json`` and a PNG of the share of seeds that reached
the target after each trial.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import Measured, console, limit_threads, load_note, machine_info, show, write_json
from runner.loop import run_trials
from targets.replay import ReplayTarget
from tuner.constraints import OutcomeConstraint
from tuner.errors import ConfigRejected, TargetError, TrialTimedOut
from tuner.space import Config, Scalar
from tuner.study import StudySpec
from tuner.trial import TrialStatus

METHODS = ("ours", "grid", "random", "skopt")
WITHIN = 0.05
Cell = tuple[Scalar, ...]


@dataclass(frozen=True)
class Truth:
    """The table as judged: cell means, feasibility, the best and the target."""

    names: tuple[str, ...]
    means: dict[Cell, float]
    feasible: set[Cell]
    best: float
    target: float
    maximize: bool

    def hit(self, cell: Cell) -> bool:
        if cell not in self.feasible:
            return False
        value = self.means[cell]
        return value >= self.target if self.maximize else value <= self.target


def truth_of(
    path: Path,
    objective: str,
    maximize: bool,
    constraints: Sequence[OutcomeConstraint],
    knobs: list[str] | None = None,
) -> Truth:
    metrics = [objective, *(c.metric for c in constraints)]
    target = ReplayTarget(table=str(path), metrics=metrics, knobs=knobs)
    names = target.knob_names
    sums: dict[Cell, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    broken: set[Cell] = set()
    for cell, rows in target.cell_rows().items():
        for row in rows:
            if (row.get("status") or "COMPLETED") != "COMPLETED":
                broken.add(cell)
                continue
            for metric in {objective, *(c.metric for c in constraints)}:
                sums[cell][metric].append(float(row[metric]))
    means = {cell: statistics.fmean(values[objective]) for cell, values in sums.items()}
    feasible = {
        cell
        for cell, values in sums.items()
        if cell not in broken
        and all(c.satisfied(statistics.fmean(values[c.metric])) for c in constraints)
    }
    if not feasible:
        raise SystemExit("no cell of the table meets the constraints on average")
    best = (max if maximize else min)(means[c] for c in feasible)
    goal = best * (1 - WITHIN) if maximize == (best >= 0) else best * (1 + WITHIN)
    return Truth(names, means, feasible, best, goal, maximize)


@dataclass(frozen=True)
class ReplayRun:
    method: str
    seed: int
    cells: list[list[Scalar]]  # the cell of each trial
    reached: int | None  # first trial (1-based) on a target cell


def run_method(
    method: str,
    path: Path,
    spec: StudySpec,
    truth: Truth,
    seed: int,
    budget: int,
    knob_columns: list[str] | None = None,
) -> ReplayRun:
    target = ReplayTarget(
        table=str(path), metrics=list(spec.metric_names), seed=seed, knobs=knob_columns
    )
    knobs = {k.name: k for k in target.describe_knobs()}
    if method == "ours":
        configs = _ours(target, spec, budget)
    elif method == "skopt":
        configs = _skopt(target, spec, knobs, seed, budget)
    elif method in ("grid", "random"):
        configs = (_grid(knobs) if method == "grid" else _shuffled(knobs, seed))[:budget]
        for config in configs:
            _measure(target, config)  # the same replayed sequence as the others
    else:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    cells = [tuple(c[n] for n in truth.names) for c in configs]
    reached = next((i + 1 for i, cell in enumerate(cells) if truth.hit(cell)), None)
    return ReplayRun(method, seed, [list(c) for c in cells], reached)


def _measure(target: ReplayTarget, config: Config) -> tuple[TrialStatus, dict[str, float], str]:
    target.apply(config)
    try:
        return TrialStatus.COMPLETED, target.measure(), ""
    except ConfigRejected as exc:
        return TrialStatus.INFEASIBLE, {}, str(exc)
    except TrialTimedOut as exc:
        return TrialStatus.TIMED_OUT, {}, str(exc)
    except TargetError as exc:
        return TrialStatus.FAILED, {}, str(exc)
    finally:
        target.restore()


def _ours(target: ReplayTarget, spec: StudySpec, budget: int) -> list[Config]:
    def measure(config: Config) -> Measured:
        status, metrics, reason = _measure(target, config)
        return Measured(metrics, status, reason)

    return [t.config for t in run_trials(spec, measure, budget)]


def _skopt(
    target: ReplayTarget,
    spec: StudySpec,
    knobs: dict[str, Any],
    seed: int,
    budget: int,
) -> list[Config]:
    from skopt import gp_minimize
    from skopt.space import Integer

    names = list(knobs)
    sign = -1.0 if spec.objective.goal.value == "maximize" else 1.0
    configs: list[Config] = []
    seen: list[float] = []

    def objective(x: list[int]) -> float:
        config = {n: knobs[n].choices[int(i)] for n, i in zip(names, x, strict=True)}
        configs.append(config)
        status, metrics, _ = _measure(target, config)
        ok = status is TrialStatus.COMPLETED and all(
            c.satisfied(metrics[c.metric]) for c in spec.outcome_constraints
        )
        if ok:
            seen.append(sign * metrics[spec.objective.name])
            return seen[-1]
        return max(seen) if seen else 0.0  # the worst seen so far

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gp_minimize(
            objective,
            [Integer(0, len(knobs[n].choices) - 1, name=n) for n in names],
            n_calls=budget,
            n_initial_points=min(10, max(1, budget // 2)),
            random_state=seed,
        )
    return configs


def _grid(knobs: dict[str, Any]) -> list[Config]:
    import itertools

    names = list(knobs)
    values = [sorted(knobs[n].choices, reverse=True) for n in names]
    return [dict(zip(names, v, strict=True)) for v in itertools.product(*values)]


def _shuffled(knobs: dict[str, Any], seed: int) -> list[Config]:
    cells = _grid(knobs)
    random.Random(seed).shuffle(cells)
    return cells


def summarize(runs: list[ReplayRun], budget: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for method in dict.fromkeys(r.method for r in runs):
        reached = [r.reached for r in runs if r.method == method]
        counted = [n or budget for n in reached]
        curve = [sum(1 for n in reached if n is not None and n <= k) / len(reached)
                 for k in range(1, budget + 1)]  # fmt: skip
        out[method] = {
            "runs": len(reached),
            "mean": statistics.fmean(counted),
            "median": statistics.median(counted),
            "reached": sum(n is not None for n in reached),
            "curve": curve,
        }
    return out


def report(summary: dict[str, Any], truth: dict[str, Any], budget: int) -> Table:
    table = Table(
        title=f"Trials to a cell within {WITHIN:.0%} of the best feasible mean "
        f"({truth['best']:.4g}; {truth['target_cells']} of {truth['cells']} cells qualify), "
        f"budget {budget}"
    )
    for column in ("method", "mean", "median", "seeds reaching it", "mean / ours"):
        table.add_column(column, justify="left" if column == "method" else "right")
    ours = summary.get("ours", {}).get("mean")
    for method, data in summary.items():
        sign = "" if data["reached"] == data["runs"] else ">= "
        ratio = f"{data['mean'] / ours:.2f}" if ours else "-"
        table.add_row(
            method,
            f"{sign}{data['mean']:.2f}",
            f"{data['median']:.1f}",
            f"{data['reached']}/{data['runs']}",
            ratio,
        )
    return table


def plot(summary: dict[str, Any], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for method, data in summary.items():
        ax.step(range(1, len(data["curve"]) + 1), data["curve"], where="post",
                label=f"{method} (mean {data['mean']:.1f})")  # fmt: skip
    ax.set_xlabel("trials")
    ax.set_ylabel(f"share of seeds within {WITHIN:.0%} of the best")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    limit_threads(args.threads)
    constraints = [OutcomeConstraint.parse(c, "--constraint") for c in args.constraint]
    maximize = args.goal == "maximize"
    columns = args.knobs.split(",") if args.knobs else None
    truth = truth_of(args.table, args.objective, maximize, constraints, columns)
    target = ReplayTarget(
        table=str(args.table),
        metrics=[args.objective, *(c.metric for c in constraints)],
        knobs=columns,
    )
    knobs = target.describe_knobs()

    def spec_for(seed: int) -> StudySpec:
        return StudySpec.from_dict(
            {
                "name": args.table.stem,
                "objectives": [{"name": args.objective, "goal": args.goal}],
                "outcome_constraints": args.constraint,
                "designer": {"algorithm": "bo", "seed": seed},
            },
            knobs=knobs,
        )

    budget = args.budget or target.cells
    meta = machine_info()
    runs: list[ReplayRun] = []
    methods = args.methods.split(",")
    for method in methods:
        for seed in range(args.seeds):
            spec = spec_for(seed)
            runs.append(run_method(method, args.table, spec, truth, seed, budget, columns))
        console.print(f"{method}: done")
    summary = summarize(runs, budget)
    facts = {
        "best": truth.best,
        "target": truth.target,
        "cells": target.cells,
        "feasible_cells": len(truth.feasible),
        "target_cells": sum(truth.hit(c) for c in truth.means),
    }
    show(report(summary, facts, budget), args.markdown)
    meta["load_note"] = load_note(meta["load_average"])
    console.print(f"[dim]{meta['load_note']}[/dim]")
    data = {"benchmark": "replay", "table": str(args.table), "objective": args.objective,
            "goal": args.goal, "constraints": args.constraint, "budget": budget,
            "seeds": args.seeds, "truth": facts, "summary": summary, "meta": meta,
            "runs": [asdict(r) for r in runs]}  # fmt: skip
    out = args.out or args.table.parent
    console.print(f"wrote {write_json(f'replay-{args.table.stem}', data, out)}")
    title = f"{args.table.name}: {args.goal} {args.objective}, {', '.join(args.constraint)}"
    console.print(f"wrote {plot(summary, out / f'replay-{args.table.stem}.png', title)}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    parser.add_argument("--table", type=Path, required=True)
    parser.add_argument("--objective", required=True)
    parser.add_argument(
        "--knobs",
        metavar="A,B",
        help="the knob columns (default: every column that is not the objective or a "
        "constraint's metric; name them when the table has other metric columns)",
    )
    parser.add_argument("--goal", choices=("minimize", "maximize"), required=True)
    parser.add_argument("--constraint", action="append", default=[], metavar="'M <= X'")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, help="trials per run (default: the cell count)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="results folder (default: the table's)")
    parser.add_argument("--markdown", action="store_true")
    return parser


if __name__ == "__main__":
    sys.exit(main())
