"""Several objectives: the hypervolume ours reaches against Optuna and random search.

Run as ``python -m bench.pareto [--seeds N] [--problems branin-currin,dtlz2-d6]``.

Problems (both objectives minimized, on the unit box):

* ``branin-currin``: Branin and Currin on two knobs (Belakaria et al. 2019; BoTorch's
  ``BraninCurrin``), reference point (18, 6), budget 30. Largest hypervolume 59.36.
* ``dtlz2-d6``: DTLZ2 with two objectives on six knobs (Deb et al. 2002), reference point
  (1.1, 1.1), budget 40. Its front is the quarter circle, hypervolume 1.1² − π/4 ≈ 0.4246.

Methods, same seeds ``0 .. N-1`` in one process:

* ``ours``: our designer as the server runs it (``algorithm = "bo"``, default initial
  design, qLogNEHVI), told the reference point as each objective's ``reference``;
* ``optuna-tpe``: Optuna's multi-objective TPE (default settings, 10 startup trials);
* ``optuna-nsga2``: Optuna's NSGA-II (default population of 50);
* ``random``: uniform random points.

Reported: mean (std) hypervolume after 10, 20 and the budget's evaluations, the share of
the largest hypervolume, and time to target: evaluations ours needs to reach the best peer's
mean hypervolume at the budget, divided by the budget (a seed that never reaches it counts as
the budget, shown ``>=``). Results: ``bench/results/pareto.json`` and ``pareto.png``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from bench.common import (
    RESULTS_DIR,
    Measured,
    completed_trial,
    console,
    limit_threads,
    load_note,
    machine_info,
    show,
    write_json,
)
from runner.loop import run_trials
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import Trial, hypervolume

FULL_SEEDS = 10
METHODS = ("ours", "optuna-tpe", "optuna-nsga2", "random")
CHECKPOINTS = (10, 20)


@dataclass(frozen=True)
class MOProblem:
    name: str
    dim: int
    budget: int
    reference: tuple[float, float]
    max_hypervolume: float
    evaluate: Callable[[list[float]], tuple[float, float]]

    def spec(self, seed: int) -> StudySpec:
        return StudySpec.from_dict(
            {
                "name": self.name,
                "knobs": [
                    {"name": f"x{i}", "kind": "float", "low": 0.0, "high": 1.0}
                    for i in range(self.dim)
                ],
                "objectives": [
                    {"name": "f1", "goal": "minimize", "reference": self.reference[0]},
                    {"name": "f2", "goal": "minimize", "reference": self.reference[1]},
                ],
                "designer": {"algorithm": "bo", "seed": seed, "start_with_default": False},
            }
        )


def branin_currin(x: list[float]) -> tuple[float, float]:
    a, b = 15 * x[0] - 5, 15 * x[1]
    branin = (b - 5.1 / (4 * math.pi**2) * a**2 + 5 / math.pi * a - 6) ** 2
    branin += 10 * (1 - 1 / (8 * math.pi)) * math.cos(a) + 10
    x0, x1 = x[0], max(x[1], 1e-12)
    currin = (1 - math.exp(-1 / (2 * x1))) * (2300 * x0**3 + 1900 * x0**2 + 2092 * x0 + 60)
    currin /= 100 * x0**3 + 500 * x0**2 + 4 * x0 + 20
    return branin, currin


def dtlz2(x: list[float]) -> tuple[float, float]:
    g = sum((v - 0.5) ** 2 for v in x[1:])
    angle = x[0] * math.pi / 2
    return (1 + g) * math.cos(angle), (1 + g) * math.sin(angle)


PROBLEMS = {
    "branin-currin": MOProblem("branin-currin", 2, 30, (18.0, 6.0), 59.36011874867746,
                               branin_currin),
    "dtlz2-d6": MOProblem("dtlz2-d6", 6, 40, (1.1, 1.1), 1.1**2 - math.pi / 4, dtlz2),
}  # fmt: skip


@dataclass(frozen=True)
class MORun:
    method: str
    problem: str
    seed: int
    hypervolume: list[float]  # after each evaluation
    seconds: float


def run_method(method: str, problem: MOProblem, seed: int) -> MORun:
    start = time.perf_counter()
    if method == "ours":
        points = _run_ours(problem, seed)
    elif method.startswith("optuna-"):
        points = _run_optuna(problem, seed, method.removeprefix("optuna-"))
    elif method == "random":
        import random

        rng = random.Random(seed)
        points = [problem.evaluate([rng.random() for _ in range(problem.dim)])
                  for _ in range(problem.budget)]  # fmt: skip
    else:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    seconds = time.perf_counter() - start
    return MORun(method, problem.name, seed, hypervolume_curve(problem, points), seconds)


def hypervolume_curve(problem: MOProblem, points: list[tuple[float, float]]) -> list[float]:
    """Hypervolume of the first ``k`` points, for every ``k``."""
    spec = problem.spec(0)
    trials: list[Trial] = []
    out: list[float] = []
    for i, (f1, f2) in enumerate(points):
        trials.append(completed_trial(i + 1, {}, {"f1": f1, "f2": f2}, ""))
        out.append(hypervolume(spec, trials, problem.reference))
    return out


def _run_ours(problem: MOProblem, seed: int) -> list[tuple[float, float]]:
    spec = problem.spec(seed)
    points: list[tuple[float, float]] = []

    def measure(config: Config) -> Measured:
        f1, f2 = problem.evaluate([float(config[f"x{j}"]) for j in range(problem.dim)])
        points.append((f1, f2))
        return Measured({"f1": f1, "f2": f2})

    run_trials(spec, measure, problem.budget)
    return points


def _run_optuna(problem: MOProblem, seed: int, sampler: str) -> list[tuple[float, float]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    chosen = (
        optuna.samplers.TPESampler(seed=seed)
        if sampler == "tpe"
        else optuna.samplers.NSGAIISampler(seed=seed)
    )
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=chosen)
    points: list[tuple[float, float]] = []

    def objective(trial: Any) -> tuple[float, float]:
        x = [trial.suggest_float(f"x{j}", 0.0, 1.0) for j in range(problem.dim)]
        value = problem.evaluate(x)
        points.append(value)
        return value

    study.optimize(objective, n_trials=problem.budget)
    return points


def summarize(problem: MOProblem, runs: list[MORun]) -> dict[str, Any]:
    methods: dict[str, Any] = {}
    for method in dict.fromkeys(r.method for r in runs):
        curves = [r.hypervolume for r in runs if r.method == method]
        checkpoints = {}
        for at in (*CHECKPOINTS, problem.budget):
            values = [c[at - 1] for c in curves]
            checkpoints[str(at)] = {
                "mean": statistics.fmean(values),
                "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            }
        methods[method] = {
            "runs": len(curves),
            "checkpoints": checkpoints,
            "mean_curve": [statistics.fmean(v) for v in zip(*curves, strict=True)],
            "seconds": statistics.fmean(r.seconds for r in runs if r.method == method),
        }
    summary: dict[str, Any] = {
        "budget": problem.budget,
        "reference": list(problem.reference),
        "max_hypervolume": problem.max_hypervolume,
        "methods": methods,
    }
    peers = {m: d for m, d in methods.items() if m != "ours"}
    if "ours" in methods and peers:
        best_peer = max(peers, key=lambda m: peers[m]["checkpoints"][str(problem.budget)]["mean"])
        target = peers[best_peer]["checkpoints"][str(problem.budget)]["mean"]
        reach = [_reach(r.hypervolume, target) for r in runs if r.method == "ours"]
        summary["time_to_target"] = {
            "peer": best_peer,
            "target": target,
            "ratio": statistics.fmean(n or problem.budget for n in reach) / problem.budget,
            "reached": sum(n is not None for n in reach),
            "runs": len(reach),
        }
    return summary


def _reach(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, v in enumerate(curve) if v >= target), None)


def quality_table(summaries: dict[str, Any], seeds: int) -> Table:
    table = Table(title=f"Hypervolume: mean (std) over {seeds} seeds, higher is better")
    table.add_column("problem")
    table.add_column("evals", justify="right")
    methods = list(dict.fromkeys(m for s in summaries.values() for m in s["methods"]))
    for method in methods:
        table.add_column(method, justify="right")
    table.add_column("largest", justify="right")
    for name, summary in summaries.items():
        for at in (*CHECKPOINTS, summary["budget"]):
            cells = []
            best = max(d["checkpoints"][str(at)]["mean"] for d in summary["methods"].values())
            for method in methods:
                data = summary["methods"].get(method)
                if data is None:
                    cells.append("-")
                    continue
                stats = data["checkpoints"][str(at)]
                share = stats["mean"] / summary["max_hypervolume"]
                text = f"{stats['mean']:.4g} ({stats['std']:.2g}; {share:.0%})"
                cells.append(f"**{text}**" if stats["mean"] == best else text)
            table.add_row(name, str(at), *cells, f"{summary['max_hypervolume']:.4g}")
    return table


def target_table(summaries: dict[str, Any]) -> Table:
    table = Table(title="Time to target: evaluations ours needs to reach the best peer's mean "
                  "hypervolume at the budget, / budget")  # fmt: skip
    for column in ("problem", "best peer", "its hypervolume", "ours", "seeds reaching it",
                   "seconds per run"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("problem", "best peer") else "right")
    for name, summary in summaries.items():
        target = summary.get("time_to_target")
        if target is None:
            continue
        sign = "" if target["reached"] == target["runs"] else ">= "
        seconds = ", ".join(f"{m} {d['seconds']:.1f}" for m, d in summary["methods"].items())
        table.add_row(
            name,
            target["peer"],
            f"{target['target']:.4g}",
            f"{sign}{target['ratio']:.2f}",
            f"{target['reached']}/{target['runs']}",
            seconds,
        )
    return table


def plot(summaries: dict[str, Any], path: Path) -> Path:
    """Mean hypervolume gap to the largest (log scale) against evaluations, per problem."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summaries), figsize=(5 * len(summaries), 4), squeeze=False)
    for ax, (name, summary) in zip(axes[0], summaries.items(), strict=True):
        for method, data in summary["methods"].items():
            gap = [max(summary["max_hypervolume"] - v, 1e-6) for v in data["mean_curve"]]
            ax.plot(range(1, len(gap) + 1), gap, label=f"{method} ({data['runs']} runs)")
        ax.set_yscale("log")
        ax.set_title(f"{name} (largest hypervolume {summary['max_hypervolume']:.4g})")
        ax.set_xlabel("evaluations")
        ax.set_ylabel("largest − mean hypervolume")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    problems = [PROBLEMS[name] for name in args.problems.split(",")]
    methods = tuple(args.methods.split(","))
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method {unknown[0]!r}; expected some of {METHODS}")
    limit_threads(args.threads)
    meta = machine_info()
    meta.update(seeds=args.seeds, threads=args.threads)
    runs: list[MORun] = []
    columns = [*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("runs", total=len(problems) * len(methods) * args.seeds)
        for problem in problems:
            for method in methods:
                for seed in range(args.seeds):
                    progress.update(task, description=f"{problem.name} {method} seed {seed}")
                    runs.append(run_method(method, problem, seed))
                    progress.advance(task)
    meta["load_note"] = load_note(meta["load_average"])
    summaries = {p.name: summarize(p, [r for r in runs if r.problem == p.name]) for p in problems}
    show(quality_table(summaries, args.seeds), args.markdown)
    show(target_table(summaries), args.markdown)
    console.print(f"[dim]{meta['load_note']}[/dim]")
    data = {"benchmark": "pareto", "meta": meta, "summary": summaries,
            "runs": [asdict(r) for r in runs]}  # fmt: skip
    out = args.out or RESULTS_DIR
    console.print(f"wrote {write_json('pareto', data, out)}")
    if not args.no_plot:
        console.print(f"wrote {plot(summaries, out / 'pareto.png')}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.pareto", description=__doc__)
    parser.add_argument("--seeds", type=int, default=FULL_SEEDS, help="runs per method")
    parser.add_argument("--problems", default=",".join(PROBLEMS), help="comma-separated")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    parser.add_argument("--threads", type=int, help="torch and BLAS threads (default: library)")
    parser.add_argument("--out", type=Path, help="results folder (default bench/results)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
