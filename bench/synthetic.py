"""Solution quality on synthetic problems: ours against scikit-optimize and random search.

Run as ``python -m bench.synthetic [--quick] [--seeds N] [--problems branin,hartmann6,gramacy]``.

Every method runs on every problem with the same seeds ``0 .. N-1`` in one process (see
``bench/methods.py`` for what each method does). For each problem and budget checkpoint the
table reports the mean (and standard deviation over seeds) of the best feasible value found,
and the ratio of mean simple regret (``best - optimum``) of each peer to ours: above 1, ours
got closer to the optimum. A run without a feasible point yet counts as the problem's worst
feasible value. Results: ``bench/results/synthetic.json`` and a convergence plot
``bench/results/synthetic.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from bench.common import (
    RESULTS_DIR,
    console,
    limit_threads,
    load_note,
    machine_info,
    show,
    write_json,
)
from bench.methods import METHODS, PENALTY, RunResult, run_method
from bench.problems import PROBLEMS, Problem

FULL_SEEDS = 10
QUICK_SEEDS = 3
PEERS = ("skopt", "random")


def run_synthetic(
    problems: list[Problem],
    seeds: int,
    methods: tuple[str, ...] = METHODS,
    budget: int | None = None,
    skopt_initial: str = "ours",
    progress: Progress | None = None,
) -> list[RunResult]:
    """Every method on every problem and seed; ``budget`` overrides the problems' budgets.

    Args:
        skopt_initial: ``ours`` gives skopt as many initial points as our Sobol design has;
            ``default`` keeps skopt's 10.
    """
    total = sum((budget or p.budget) * seeds * len(methods) for p in problems)
    task = progress.add_task("synthetic", total=total) if progress is not None else None

    def tick() -> None:
        if progress is not None and task is not None:
            progress.advance(task)

    runs = []
    for problem in problems:
        n = budget or problem.budget
        initial = initial_sizes(problem)[skopt_initial]
        for seed in range(seeds):
            for method in methods:
                if progress is not None and task is not None:
                    progress.update(task, description=f"{problem.name} seed {seed} {method}")
                runs.append(run_method(method, problem, seed, n, initial, tick))
    return runs


def initial_sizes(problem: Problem) -> dict[str, int]:
    """skopt's ``n_initial_points`` per ``--skopt-initial`` choice."""
    ours = problem.spec(0).designer.initial_size(problem.dim)
    return {"ours": ours, "default": 10}


def summarize(problem: Problem, runs: list[RunResult], budget: int) -> dict[str, Any]:
    """Mean curves, checkpoint statistics and regret ratios of one problem's runs."""
    checkpoints = [c for c in problem.checkpoints if c <= budget] or [budget]
    methods: dict[str, Any] = {}
    for method in sorted({r.method for r in runs}, key=METHODS.index):
        curves = [_imputed(problem, r.best) for r in runs if r.method == method]
        raw = [r.best for r in runs if r.method == method]
        stats = {}
        for c in checkpoints:
            values = [curve[c - 1] for curve in curves]
            regrets = [v - problem.optimum for v in values]
            stats[str(c)] = {
                "mean": statistics.fmean(values),
                "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                "mean_regret": statistics.fmean(regrets),
                "median_regret": statistics.median(regrets),
                "no_feasible": sum(curve[c - 1] is None for curve in raw),
            }
        methods[method] = {
            "runs": len(curves),
            "mean_curve": [statistics.fmean(col) for col in zip(*curves, strict=True)],
            "checkpoints": stats,
            "seconds_per_run": statistics.fmean(r.seconds for r in runs if r.method == method),
        }
    ratios: dict[str, dict[str, float | None]] = {}
    if "ours" in methods:
        for peer in PEERS:
            if peer in methods:
                ratios[f"{peer}/ours"] = {
                    str(c): _ratio(
                        methods[peer]["checkpoints"][str(c)]["mean_regret"],
                        methods["ours"]["checkpoints"][str(c)]["mean_regret"],
                    )
                    for c in checkpoints
                }
    return {
        "optimum": problem.optimum,
        "dim": problem.dim,
        "budget": budget,
        "checkpoints": checkpoints,
        "methods": methods,
        "regret_ratio": ratios,
    }


def quality_table(summaries: dict[str, dict[str, Any]], title: str) -> Table:
    """Mean best (std) per checkpoint and method, and the peers' regret ratios to ours."""
    table = Table(title=title)
    table.add_column("problem")
    table.add_column("optimum", justify="right")
    table.add_column("evals", justify="right")
    methods = [m for m in METHODS if any(m in s["methods"] for s in summaries.values())]
    for method in methods:
        table.add_column(method, justify="right")
    ratio_names = [
        f"{peer}/ours"
        for peer in PEERS
        if any(f"{peer}/ours" in s["regret_ratio"] for s in summaries.values())
    ]
    for name in ratio_names:
        table.add_column(f"regret {name}", justify="right")
    for problem, summary in summaries.items():
        for i, c in enumerate(summary["checkpoints"]):
            row = [problem, f"{summary['optimum']:g}"] if i == 0 else ["", ""]
            row.append(str(c))
            for method in methods:
                stats = summary["methods"].get(method, {}).get("checkpoints", {}).get(str(c))
                row.append(_cell(stats))
            for name in ratio_names:
                value = summary["regret_ratio"].get(name, {}).get(str(c))
                row.append("-" if value is None else f"{value:.2f}")
            table.add_row(*row)
    return table


def time_table(summaries: dict[str, dict[str, Any]]) -> Table:
    """Mean wall time per run of ours and skopt (secondary: this benchmark is about quality)."""
    table = Table(title="Optimizer time per run (s)")
    for name in ("problem", "budget", "ours", "skopt", "skopt/ours"):
        table.add_column(name, justify="right" if name != "problem" else "left")
    for problem, summary in summaries.items():
        ours = summary["methods"].get("ours", {}).get("seconds_per_run")
        peer = summary["methods"].get("skopt", {}).get("seconds_per_run")
        table.add_row(
            problem,
            str(summary["budget"]),
            "-" if ours is None else f"{ours:.1f}",
            "-" if peer is None else f"{peer:.1f}",
            "-" if ours is None or peer is None else f"{peer / ours:.2f}",
        )
    return table


def plot(summaries: dict[str, dict[str, Any]], path: Path) -> Path:
    """Mean best-so-far minus the optimum (log scale) against evaluations, per problem."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summaries), figsize=(5 * len(summaries), 4), squeeze=False)
    for ax, (problem, summary) in zip(axes[0], summaries.items(), strict=True):
        for method, data in summary["methods"].items():
            gap = [max(v - summary["optimum"], 1e-6) for v in data["mean_curve"]]
            ax.plot(range(1, len(gap) + 1), gap, label=f"{method} ({data['runs']} runs)")
        ax.set_yscale("log")
        ax.set_title(f"{problem} (optimum {summary['optimum']:g})")
        ax.set_xlabel("evaluations")
        ax.set_ylabel("mean best so far − optimum")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.report is not None:  # re-print the tables of an earlier run
        data = json.loads(args.report.read_text())
        _print_report(data, args.markdown)
        return 0
    seeds = args.seeds or (QUICK_SEEDS if args.quick else FULL_SEEDS)
    problems = [PROBLEMS[name] for name in args.problems.split(",")]
    methods = tuple(args.methods.split(","))
    limit_threads(args.threads)
    meta = machine_info()
    meta.update(seeds=seeds, quick=args.quick, skopt_initial=args.skopt_initial)
    meta.update(penalty=PENALTY, budget_override=args.budget, threads=args.threads)
    meta["skopt_n_initial_points"] = {
        p.name: initial_sizes(p)[args.skopt_initial] for p in problems
    }
    columns = [*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        runs = run_synthetic(problems, seeds, methods, args.budget, args.skopt_initial, progress)
    meta["load_note"] = load_note(meta["load_average"])
    summaries = {
        p.name: summarize(p, [r for r in runs if r.problem == p.name], args.budget or p.budget)
        for p in problems
    }
    data = {
        "benchmark": "synthetic",
        "meta": meta,
        "summary": summaries,
        "runs": [asdict(r) for r in runs],
    }
    _print_report(data, args.markdown)
    out = args.out or RESULTS_DIR
    console.print(f"wrote {write_json('synthetic', data, out)}")
    if not args.no_plot:
        console.print(f"wrote {plot(summaries, out / 'synthetic.png')}")
    return 0


def _print_report(data: dict[str, Any], markdown: bool) -> None:
    summaries = data["summary"]
    title = f"Best feasible value: mean (std) over {data['meta']['seeds']} seeds"
    for table in (quality_table(summaries, title), time_table(summaries)):
        show(table, markdown)
    console.print(f"[dim]{data['meta']['load_note']}[/dim]")


def _imputed(problem: Problem, best: list[float | None]) -> list[float]:
    return [problem.worst_feasible if v is None else v for v in best]


def _ratio(peer: float, ours: float) -> float | None:
    if ours <= 0:
        return None if peer <= 0 else math.inf
    return peer / ours


def _cell(stats: dict[str, Any] | None) -> str:
    if stats is None:
        return "-"
    text = f"{stats['mean']:.4g} ({stats['std']:.2g})"
    if stats["no_feasible"]:
        text += f", {stats['no_feasible']} none feasible"
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.synthetic", description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SEEDS} seeds")
    parser.add_argument("--seeds", type=int, help=f"runs per method and problem ({FULL_SEEDS})")
    parser.add_argument("--problems", default=",".join(PROBLEMS), help="comma-separated")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    parser.add_argument("--budget", type=int, help="override every problem's budget")
    parser.add_argument(
        "--skopt-initial",
        choices=("ours", "default"),
        default="ours",
        help="skopt n_initial_points: as many as our Sobol design (default) or skopt's 10",
    )
    parser.add_argument("--threads", type=int, help="torch and BLAS threads (default: library)")
    parser.add_argument("--out", type=Path, help="results folder (default bench/results)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    parser.add_argument("--report", type=Path, help="only print the tables of a results file")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
