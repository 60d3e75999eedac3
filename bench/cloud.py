"""Cloud configuration benchmark: pick the fastest or cheapest of Scout's 69 deployments.

``python -m bench.cloud [--seeds 50] [--budget 30] [--objectives runtime_s,cost_usd]
[--methods ours,random,optuna] [--jobs 2] [--resume [--redo ours]]``

Every method searches the ``cloud_replay`` target (``targets/cloud/target.py``): 18 Scout
workloads (Hadoop and Spark jobs), each measured on 69 AWS deployments (c4/m4/r4, large to
2xlarge, 4 to 48 nodes), read from ``../shared/benchdata/cloud_config_scout_bbo_arena`` at
run time. A run that failed or timed out in the measurements is an INFEASIBLE evaluation:
it uses one of the budget's evaluations and yields no value. Per workload and objective
(runtime, or cost = nodes x price x runtime), for seeds 0..N-1:

* ``ours``: our designer through the product's candidate-list path (``make_designer`` over
  the target's 69 candidates and their features, total vCPUs and memory; Sobol design of
  ``INITIAL`` points snapped to candidates, then qLogNEI maximized exactly over the untaken
  candidates), one ``suggest(1, ...)`` per
  evaluation; the user's current deployment is not measured first (``start_with_default =
  false``), so no method gets a free known point;
* ``random``: the candidates in a seeded random order (no repeats), which checks the data
  against the published random-search runs;
* ``optuna``: Optuna's TPE (seeded; family and size categorical, the node count a
  categorical conditional on the size); a configuration it proposes again is answered from
  the earlier evaluation without using the budget (at most ``10 x budget`` proposals).

Reported per objective, averaged over workloads and seeds: best value found / the
workload's optimum after 6, 10, 20 and 30 evaluations, the probability of having found the
optimum, and of being within 10 % of it; next to the published runs of "Do the best cloud
configurations grow on trees?" (Bilal et al., VLDB'20; ``bbo_arena_published_baselines.csv``,
50 runs each, the same 18 workloads): random search, GP-EI (3 and 6 initial points), RF-EI,
GBRT-EI and TPE. Results: ``bench/results/cloud/cloud.json`` and ``cloud.png``.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from rich.markup import escape
from rich.table import Table

from bench.common import console, limit_threads, load_note, machine_info, show, write_json
from runner.loop import run_trials
from targets.cloud.target import CloudReplayTarget, read_lookup
from tuner.errors import ValidationError
from tuner.space import Config
from tuner.study import StudySpec

METHODS = ("ours", "random", "optuna")
OBJECTIVES = ("runtime_s", "cost_usd")
CHECKPOINTS = (6, 10, 20, 30)
INITIAL = 3  # Sobol points before the model; the published GP-EI runs used 3 and 6
DATA = Path(__file__).resolve().parents[2] / "shared" / "benchdata" / "cloud_config_scout_bbo_arena"
PUBLISHED = {
    "random_search": "random search",
    "GP_EI_init3_xi0.01": "GP-EI (3 init)",
    "GP_EI_init6_xi0.01": "GP-EI (6 init)",
    "RF_EI_init3": "RF-EI (3 init)",
    "GBRT_EI_init3": "GBRT-EI (3 init)",
    "TPE_init3": "TPE (3 init)",
}
_OBJECTIVE_NAMES = {"runtime_s": "runtime", "cost_usd": "cost"}
# A run that failed or timed out, scored as bbo-arena scores it (so a prefix of failures has
# a finite best/optimum, as in the published runs)
FAILED_VALUE = {"runtime_s": 3600.0, "cost_usd": 100.0}
GOAL_AT_10 = 1.10
GOAL_P_OPT_30 = 0.80


def workloads(table: Path) -> tuple[str, ...]:
    with table.open(newline="") as handle:
        return tuple(sorted({row["workload"] for row in csv.DictReader(handle)}))


def run_one(
    method: str,
    workload: str,
    objective: str,
    seed: int,
    budget: int,
    table: Path,
    catalog: str = "aws_2017",
) -> list[float]:
    """Best value found after each evaluation (failed runs count as ``FAILED_VALUE``)."""
    target = CloudReplayTarget(workload=workload, table=str(table), catalog=catalog)
    candidates = target.describe_candidates()
    values: list[float | None] = []
    if method == "ours":
        spec = StudySpec.from_dict(
            {
                "name": "cloud",
                "objectives": [{"name": objective, "goal": "minimize"}],
                "designer": {"seed": seed, "start_with_default": False, "initial_trials": INITIAL},
                "candidates": list(candidates),
                "candidate_features": list(target.describe_candidate_features()),
            },
            knobs=target.describe_knobs(),
        )
        trials = run_trials(spec, target.run_trial, min(budget, len(candidates)))
        values = [t.metrics.get(objective) for t in trials]
    elif method == "random":
        order = np.random.default_rng(seed).permutation(len(candidates))[:budget]
        for index in order:
            values.append(target.run_trial(candidates[int(index)]).metrics.get(objective))
    elif method == "optuna":
        values = _optuna(target, candidates, objective, seed, budget)
    else:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    best, top = [], math.inf
    for value in values:
        top = min(top, FAILED_VALUE[objective] if value is None else value)
        best.append(top)
    return best


def _optuna(
    target: CloudReplayTarget, candidates: Sequence[Config], objective: str, seed: int, budget: int
) -> list[float | None]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sizes: dict[str, list[int]] = {}
    for c in candidates:
        sizes.setdefault(str(c["size"]), []).append(int(c["nodes"]))
    families = sorted({str(c["family"]) for c in candidates})
    allowed = {(c["family"], c["size"], c["nodes"]) for c in candidates}
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    seen: dict[tuple[Any, ...], float | None] = {}
    values: list[float | None] = []
    for _ in range(10 * budget):
        if len(values) == budget:
            break
        trial = study.ask()
        size = trial.suggest_categorical("size", sorted(sizes))
        config: Config = {
            "family": trial.suggest_categorical("family", families),
            "size": size,
            "nodes": trial.suggest_categorical(f"nodes_{size}", sizes[size]),
        }
        key = (config["family"], config["size"], config["nodes"])
        assert key in allowed
        if key not in seen:
            seen[key] = target.run_trial(config).metrics.get(objective)
            values.append(seen[key])
        value = seen[key]
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, value)
    return values


def optima(table: Path) -> dict[tuple[str, str], float]:
    """(workload, objective) -> the best value over the completed runs."""
    out: dict[tuple[str, str], float] = {}
    for workload, runs in read_lookup(table).items():
        done = [r for r in runs.values() if r.completed]
        out[(workload, "runtime_s")] = min(r.runtime_s for r in done)
        out[(workload, "cost_usd")] = min(r.cost_usd for r in done)
    return out


def summarize(curves: list[list[float]], optimum: float) -> dict[str, list[float]]:
    """Per evaluation: mean best/optimum, P(optimum found), P(within 10 %) over the runs."""
    ratios = np.array(curves) / optimum
    return {
        "mean_best_over_opt": np.round(ratios.mean(axis=0), 5).tolist(),
        "frac_found_opt": np.round((ratios <= 1 + 1e-9).mean(axis=0), 5).tolist(),
        "frac_within_10pct": np.round((ratios <= 1.1 + 1e-9).mean(axis=0), 5).tolist(),
    }


def published(path: Path, names: Sequence[str]) -> dict[tuple[str, str], dict[int, list[float]]]:
    """(objective, algorithm) -> k -> [mean best/opt, P(opt), P(within 10 %)], averaged over
    the workloads in ``names``."""
    sums: dict[tuple[str, str], dict[int, list[list[float]]]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["workload"] not in names or row["algorithm"] not in PUBLISHED:
                continue
            objective = "runtime_s" if row["objective"] == "runtime" else "cost_usd"
            k = int(row["k_evals"])
            cell = sums.setdefault((objective, row["algorithm"]), {}).setdefault(k, [])
            cell.append(
                [
                    float(row["mean_best_over_opt"]),
                    float(row["frac_found_opt"]),
                    float(row["frac_within_10pct"]),
                ]
            )
    return {
        key: {k: np.mean(np.array(rows), axis=0).tolist() for k, rows in ks.items()}
        for key, ks in sums.items()
    }


def tables(
    results: dict[str, Any], baseline: dict[tuple[str, str], dict[int, list[float]]]
) -> list[Table]:
    out = []
    for objective in OBJECTIVES:
        mine: dict[str, dict[str, list[float]]] = {}
        for method in METHODS:
            summary = _mean_over_workloads(results, objective, method)
            if summary is not None:
                mine[method] = summary
        if not mine:
            continue
        seeds = {
            len(results[objective][m][w]["seeds"]) for m in mine for w in results[objective][m]
        }
        table = Table(
            title=f"{_OBJECTIVE_NAMES[objective]}: best/optimum after k evaluations, "
            f"P(optimum found), P(within 10 %) (18 workloads; seeds per run: "
            f"{'/'.join(map(str, sorted(seeds)))})"
        )
        table.add_column("method")
        for k in CHECKPOINTS:
            table.add_column(f"@{k}", justify="right")
        table.add_column("P(opt) @10 / @30", justify="right")
        table.add_column("P(10 %) @10 / @30", justify="right")
        for method, summary in mine.items():
            best, found, near = (
                summary["mean_best_over_opt"],
                summary["frac_found_opt"],
                summary["frac_within_10pct"],
            )
            table.add_row(
                f"{method} (this run)",
                *[_at(best, k) for k in CHECKPOINTS],
                f"{_at(found, 10)} / {_at(found, 30)}",
                f"{_at(near, 10)} / {_at(near, 30)}",
            )
        for algorithm, label in PUBLISHED.items():
            row = baseline.get((objective, algorithm))
            if row is None:
                continue
            table.add_row(
                f"{label} (published)",
                *[f"{row[k][0]:.3f}" for k in CHECKPOINTS],
                f"{row[10][1]:.3f} / {row[30][1]:.3f}",
                f"{row[10][2]:.3f} / {row[30][2]:.3f}",
            )
        out.append(table)
    return out


def _at(curve: list[float], k: int) -> str:
    return f"{curve[k - 1]:.3f}" if len(curve) >= k else "-"


def goals(results: dict[str, Any]) -> list[str]:
    lines = []
    for objective in OBJECTIVES:
        summary = _mean_over_workloads(results, objective, "ours")
        if summary is None or len(summary["mean_best_over_opt"]) < 30:
            continue
        at10 = summary["mean_best_over_opt"][9]
        p30 = summary["frac_found_opt"][29]
        ok10 = "PASS" if at10 <= GOAL_AT_10 else "FAIL"
        okp = "PASS" if p30 >= GOAL_P_OPT_30 else "FAIL"
        lines.append(
            f"{_OBJECTIVE_NAMES[objective]}: best/opt @10 = {at10:.3f} (goal <= {GOAL_AT_10}: "
            f"{ok10}); P(optimum) @30 = {p30:.3f} (goal >= {GOAL_P_OPT_30}: {okp})"
        )
    return lines


def _mean_over_workloads(
    results: dict[str, Any], objective: str, method: str
) -> dict[str, list[float]] | None:
    per = results.get(objective, {}).get(method, {})
    if not per:
        return None
    keys = ("mean_best_over_opt", "frac_found_opt", "frac_within_10pct")
    return {
        key: [round(float(v), 5) for v in np.array([w[key] for w in per.values()]).mean(axis=0)]
        for key in keys
    }


def plot(results: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, objective in zip(axes, OBJECTIVES, strict=True):
        for method in METHODS:
            summary = _mean_over_workloads(results, objective, method)
            if summary is None:
                continue
            curve = summary["mean_best_over_opt"]
            ax.plot(range(1, len(curve) + 1), curve, label=method)
        ax.axhline(GOAL_AT_10, color="grey", linestyle=":", label=f"{GOAL_AT_10} (goal @10)")
        ax.set_ylim(0.98, 1.6)
        ax.set_xlabel("evaluations")
        ax.set_ylabel("best / optimum (mean of 18 workloads)")
        ax.set_title(f"Scout deployments, {_OBJECTIVE_NAMES[objective]}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _work(
    args: tuple[str, str, str, int, int, Path, str],
) -> tuple[str, str, str, int, list[float]]:
    method, workload, objective, seed, budget, table, catalog = args
    limit_threads(1)
    return (
        method,
        workload,
        objective,
        seed,
        run_one(method, workload, objective, seed, budget, table, catalog),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    table = args.data / "cloud_config_lookup.csv"
    names = args.workloads.split(",") if args.workloads else workloads(table)
    path = args.out / "cloud.json"
    results: dict[str, Any] = {}
    if args.resume and path.exists():
        import json

        results = json.loads(path.read_text())["results"]
    try:  # a table the catalog does not cover is named now, not deep in a worker
        for workload in names:
            CloudReplayTarget(workload=workload, table=str(table), catalog=args.catalog)
    except ValidationError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return 2
    best = optima(table)
    seeds = list(range(args.seeds))
    jobs = []
    for objective in args.objectives.split(","):
        for method in args.methods.split(","):
            for workload in names:
                done = results.get(objective, {}).get(method, {}).get(workload)
                if (
                    done is not None
                    and done["seeds"] == seeds
                    and done["budget"] == args.budget
                    and method not in args.redo.split(",")
                ):
                    continue
                jobs += [
                    (method, workload, objective, s, args.budget, table, args.catalog)
                    for s in seeds
                ]
    meta = machine_info()
    start = time.perf_counter()
    curves: dict[tuple[str, str, str], dict[int, list[float]]] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for i, (method, workload, objective, seed, curve) in enumerate(
            pool.map(_work, jobs, chunksize=1)
        ):
            cell = curves.setdefault((objective, method, workload), {})
            cell[seed] = curve
            if len(cell) == len(seeds):
                summary = summarize([cell[s] for s in seeds], best[(workload, objective)])
                results.setdefault(objective, {}).setdefault(method, {})[workload] = {
                    "seeds": seeds,
                    "budget": args.budget,
                    **summary,
                }
                elapsed = time.perf_counter() - start
                console.print(
                    f"[{i + 1}/{len(jobs)} runs, {elapsed:.0f} s] {objective} {method} {workload}: "
                    f"best/opt @10 {summary['mean_best_over_opt'][min(9, args.budget - 1)]:.3f}, "
                    f"P(opt) @{args.budget} {summary['frac_found_opt'][-1]:.2f}"
                )
    baseline = published(args.data / "bbo_arena_published_baselines.csv", names)
    for t in tables(results, baseline):
        show(t, args.markdown)
    for line in goals(results):
        console.print(line)
    meta["load_note"] = load_note(meta["load_average"])
    data = {
        "benchmark": "cloud",
        "initial_trials": INITIAL,
        "optima": {f"{w}/{o}": v for (w, o), v in best.items()},
        "meta": meta,
        "results": results,
    }
    console.print(f"wrote {write_json('cloud', data, args.out)}")
    console.print(f"wrote {plot(results, args.out / 'cloud.png')}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.cloud", description=__doc__)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument("--objectives", default=",".join(OBJECTIVES))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--workloads", default="", help="comma-separated; default: all 18")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--resume", action="store_true", help="keep finished cells of cloud.json")
    parser.add_argument(
        "--redo",
        default="",
        help="with --resume: methods to run again all the same (after a change to them)",
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--catalog", default="aws_2017",
        help="the instance catalog: a shipped name or the path of a catalog TOML file",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "cloud"
    )
    parser.add_argument("--markdown", action="store_true")
    return parser


if __name__ == "__main__":
    sys.exit(main())
