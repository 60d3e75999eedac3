"""Scheduler study: tune Tiresias's 2D-LAS on some job traces, judge it on traces not used.

``python -m bench.gpusched [--seeds N] [--budget B] [--methods ours,random,optuna]
[--aggregate worst,geomean]``

Each method tunes the ``gpusched`` target (``targets/scheduler/gpusched.py``: number of
queues, queue limits, starvation promotion and its interval) on the *training* traces, minimizing
``jct_ratio_geomean`` (average JCT relative to Tiresias's default policy, geometric mean
over the traces) subject to ``p99_ratio_worst <= P99_LIMIT``: the 99th-percentile JCT may
grow by at most that factor on *every* training trace, so a policy that starves long jobs
on one trace does not count. ``--aggregate geomean`` constrains the geometric mean of the
p99 ratios instead (the old rule, kept for comparison; its runs are labelled
``<method>-geomean``). Every method measures Tiresias's defaults first, then:

* ``ours``: our designer (``make_designer``, product defaults: Sobol design, qLogNEI with
  the outcome constraint), one ``suggest(1, ...)`` per trial;
* ``random``: uniform random configurations (numpy, seeded);
* ``optuna``: Optuna's TPE (``n_startup_trials=10``, seeded), the constraint reported with
  ``Trial.set_constraint`` (Optuna 5's constrained TPE).

The best feasible configuration of each run is then simulated on every *held-out* trace,
whole, next to FIFO (no backfill), LAS (preemptive least attained GPU time), Tiresias's
defaults (limits 3250/7200/18000 GPU-s) and Lucid's two-queue Tiresias (one limit, 18000
GPU-s). Traces: Philly-derived Gavel traces (``gavel_msr_seed0``, MIT, shipped with the
target in ``targets/scheduler/traces/``; ``--traces`` reads another folder), durations on
V100s; each cluster is sized to the
trace (``--load``), and a preempted job pays ``--restart-s`` seconds when it resumes.

Tables: best ``jct_ratio_geomean`` on the training traces after 10/20/budget trials (mean
over seeds); per held-out trace the average JCT in hours of every policy, with the
geometric mean of each one's ratio to Tiresias's defaults; and per held-out trace how many
runs' configurations keep the p99 JCT within ``P99_LIMIT`` of Tiresias's (with the worst
ratio). Results: ``bench/results/gpusched.json`` (per run and held-out trace the p99 ratio
under ``held_out_p99``) and ``gpusched.png``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from bench.common import console, limit_threads, load_note, machine_info, show, write_json
from runner.loop import run_trials
from targets.base import full_config
from targets.scheduler.gpusched import (
    SHIPPED_TRACES,
    GpuSchedTarget,
    policy_of,
    tiresias_policy,
)
from targets.scheduler.simulator import Policy, simulate
from tuner.space import Config, FloatKnob, IntKnob, Knob, SearchSpace
from tuner.study import StudySpec

METHODS = ("ours", "random", "optuna")
AGGREGATES = ("worst", "geomean")
OBJECTIVE = "jct_ratio_geomean"
TRAIN = ("0e4a51", "103959", "6c71a0")
TEST = ("6214e9", "7f04ca", "11cb48", "2869ce")
P99_LIMIT = 1.1
LOAD = 0.9  # the trace's GPU time fills 90 % of the cluster (``cluster_size``)
RESTART_S = 30.0  # a preempted job pays this when it resumes
MAX_JOBS = 300  # first jobs of a training trace
TRACES = SHIPPED_TRACES / "gavel_msr_seed0"  # Gavel's traces, shipped with the target
CHECKPOINTS = (10, 20)
TIRESIAS = "Tiresias (3250/7200/18000)"
BASELINES = {
    "FIFO": Policy("fifo"),
    "LAS": Policy("las"),
    TIRESIAS: tiresias_policy(),
    "Tiresias 2 queues (18000)": Policy("dlas", thresholds=(18000.0,)),
}


@dataclass
class Run:
    method: str
    seed: int
    best: list[float | None]  # best feasible jct_ratio_geomean after each trial
    config: Config | None  # the best feasible configuration
    seconds: float
    aggregate: str = "worst"  # how the p99 constraint covered the training traces
    train_p99: dict[str, float] | None = None  # the config's p99 ratio per training trace

    @property
    def label(self) -> str:
        """The method, marked when the constraint was the old geometric mean."""
        return self.method if self.aggregate == "worst" else f"{self.method}-geomean"


def constraint_metric(aggregate: str) -> str:
    """The p99 metric the training constraint bounds: worst trace or geometric mean."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"unknown aggregate {aggregate!r}; expected one of {AGGREGATES}")
    return f"p99_ratio_{aggregate}"


def spec_of(target: GpuSchedTarget, seed: int, aggregate: str = "worst") -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "gpusched",
            "objectives": [{"name": OBJECTIVE, "goal": "minimize"}],
            "outcome_constraints": [f"{constraint_metric(aggregate)} <= {P99_LIMIT}"],
            "designer": {"algorithm": "bo", "seed": seed},
        },
        knobs=target.describe_knobs(),
    )


def run_method(
    method: str, target: GpuSchedTarget, seed: int, budget: int, aggregate: str = "worst"
) -> Run:
    start = time.perf_counter()
    limited = constraint_metric(aggregate)
    knobs = target.describe_knobs()
    default = SearchSpace(knobs).default_config()
    assert default is not None
    if method == "ours":
        trials = run_trials(spec_of(target, seed, aggregate), target.run_trial, budget)
        measured = [(t.config, t.metrics) for t in trials]
    elif method == "random":
        rng = np.random.default_rng(seed)
        configs = [default] + [_uniform(knobs, rng) for _ in range(budget - 1)]
        measured = [(c, target.run_trial(c).metrics) for c in configs]
    elif method == "optuna":
        measured = _optuna(target, knobs, default, seed, budget, limited)
    else:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    best: list[float | None] = []
    top: tuple[float, Config, dict[str, float]] | None = None
    for config, metrics in measured:
        feasible = bool(metrics) and metrics[limited] <= P99_LIMIT
        if feasible and (top is None or metrics[OBJECTIVE] < top[0]):
            top = (metrics[OBJECTIVE], config, metrics)
        best.append(top[0] if top else None)
    seconds = time.perf_counter() - start
    if top is None:
        return Run(method, seed, best, None, seconds, aggregate)
    p99 = {t.name: top[2][f"p99_ratio__{t.name}"] for t in target.traces}
    return Run(method, seed, best, top[1], seconds, aggregate, p99)


def _uniform(knobs: Sequence[Knob], rng: np.random.Generator) -> Config:
    out: Config = {}
    for knob in knobs:
        if isinstance(knob, IntKnob):
            out[knob.name] = int(rng.integers(int(knob.low), int(knob.high) + 1))
        elif isinstance(knob, FloatKnob) and knob.log:
            out[knob.name] = float(math.exp(rng.uniform(math.log(knob.low), math.log(knob.high))))
        elif isinstance(knob, FloatKnob):
            out[knob.name] = float(rng.uniform(knob.low, knob.high))
        else:
            raise TypeError(f"no uniform sampler for {knob.kind} knob {knob.name}")
    return out


def _optuna(
    target: GpuSchedTarget,
    knobs: Sequence[Knob],
    default: Config,
    seed: int,
    budget: int,
    limited: str,
) -> list[tuple[Config, dict[str, float]]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=10)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    study.enqueue_trial(dict(default))
    measured: list[tuple[Config, dict[str, float]]] = []

    def objective(trial: Any) -> float:
        config: Config = {}
        for knob in knobs:
            if isinstance(knob, IntKnob):
                config[knob.name] = trial.suggest_int(knob.name, int(knob.low), int(knob.high))
            elif isinstance(knob, FloatKnob):
                low, high = knob.low, knob.high
                config[knob.name] = trial.suggest_float(knob.name, low, high, log=knob.log)
        metrics = target.run_trial(config).metrics
        measured.append((config, metrics))
        trial.set_constraint("p99", metrics[limited] - P99_LIMIT)  # <= 0: feasible
        return metrics[OBJECTIVE]

    study.optimize(objective, n_trials=budget)
    return measured


def held_out(target: GpuSchedTarget, runs: list[Run]) -> dict[str, dict[str, Any]]:
    """Per held-out trace: avg and p99 JCT (s) of every baseline and every run's config."""
    knobs = target.describe_knobs()
    out: dict[str, dict[str, Any]] = {}
    for trace in target.traces:
        row: dict[str, Any] = {"gpus": trace.gpus, "jobs": len(trace.jobs), "policies": {}}
        for name, policy in BASELINES.items():
            policy = replace(policy, restart_s=target.restart_s)
            row["policies"][name] = simulate(trace.jobs, trace.gpus, policy).summary()
        for run in runs:
            if run.config is None:
                continue
            policy = policy_of(full_config("gpusched", knobs, run.config), target.restart_s)
            summary = simulate(trace.jobs, trace.gpus, policy).summary()
            row["policies"][f"{run.label}:{run.seed}"] = summary
        out[trace.name] = row
        console.print(f"held-out {trace.name}: {len(row['policies'])} policies simulated")
    return out


def held_out_p99(runs: list[Run], test: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per run label and held-out trace: each run's p99 JCT / Tiresias's, and how many of
    the runs' configurations stay within ``P99_LIMIT`` (runs without one are left out)."""
    out: dict[str, Any] = {}
    for label in dict.fromkeys(r.label for r in runs):
        rows: dict[str, Any] = {}
        for name, row in test.items():
            base = row["policies"][TIRESIAS]["p99_jct_s"]
            ratios = {
                str(r.seed): row["policies"][f"{label}:{r.seed}"]["p99_jct_s"] / base
                for r in runs
                if r.label == label and f"{label}:{r.seed}" in row["policies"]
            }
            within = sum(v <= P99_LIMIT for v in ratios.values())
            rows[name] = {"ratios": ratios, "within": within, "runs": len(ratios)}
        out[label] = rows
    return out


def tables(runs: list[Run], test: dict[str, dict[str, Any]], budget: int) -> list[Table]:
    methods = list(dict.fromkeys(r.label for r in runs))
    train = Table(title=f"Best {OBJECTIVE} on the training traces (p99 ratio <= {P99_LIMIT})")
    train.add_column("trials", justify="right")
    for method in methods:
        train.add_column(method, justify="right")
    for k in sorted({*(c for c in CHECKPOINTS if c < budget), budget}):
        cells = []
        for method in methods:
            values = [r.best[k - 1] for r in runs if r.label == method and len(r.best) >= k]
            found = [v for v in values if v is not None]
            cells.append(f"{np.mean(found):.3f} ({np.std(found):.3f})" if found else "-")
        train.add_row(str(k), *cells)
    policies = list(BASELINES) + [f"{m} (tuned, mean of seeds)" for m in methods]
    held = Table(title="Held-out traces: average JCT (hours) per policy")
    held.add_column("policy")
    for name, row in test.items():
        held.add_column(f"{name} ({row['jobs']} jobs, {row['gpus']} GPUs)", justify="right")
    held.add_column("avg JCT / Tiresias (geo-mean)", justify="right")
    held.add_column("p99 JCT / Tiresias (geo-mean)", justify="right")
    base = TIRESIAS
    for policy in policies:
        cells, ratios, p99s = [], [], []
        for row in test.values():
            results = _results(row["policies"], policy)
            if not results:
                cells.append("-")
                continue
            avg = float(np.mean([r["avg_jct_s"] for r in results]))
            p99 = float(np.mean([r["p99_jct_s"] for r in results]))
            cells.append(f"{avg / 3600:.1f}")
            ratios.append(avg / row["policies"][base]["avg_jct_s"])
            p99s.append(p99 / row["policies"][base]["p99_jct_s"])
        held.add_row(policy, *cells, _geo(ratios), _geo(p99s))
    return [train, held, limit_table(runs, test)]


def limit_table(runs: list[Run], test: dict[str, dict[str, Any]]) -> Table:
    """Per held-out trace: runs whose configuration keeps p99 JCT <= P99_LIMIT x Tiresias's
    (``k/n``) and the worst run's ratio; then the same on all held-out and training traces."""
    summary = held_out_p99(runs, test)
    table = Table(
        title=f"Held-out traces: runs keeping p99 JCT <= {P99_LIMIT} x Tiresias (worst ratio)"
    )
    table.add_column("method (training constraint)")
    for name in test:
        table.add_column(name, justify="right")
    table.add_column("every held-out trace", justify="right")
    table.add_column("every training trace", justify="right")
    for label, rows in summary.items():
        cells = []
        for row in rows.values():
            worst = max(row["ratios"].values(), default=None)
            cells.append("-" if worst is None else f"{row['within']}/{row['runs']} ({worst:.3f})")
        mine = [r for r in runs if r.label == label]
        chosen = [r for r in mine if r.config is not None]
        every = sum(
            all(row["ratios"][str(r.seed)] <= P99_LIMIT for row in rows.values()) for r in chosen
        )
        trained = sum(max((r.train_p99 or {}).values(), default=0.0) <= P99_LIMIT for r in chosen)
        table.add_row(
            f"{mine[0].method} ({'worst trace' if mine[0].aggregate == 'worst' else 'geomean'})",
            *cells,
            f"{every}/{len(chosen)}",
            f"{trained}/{len(chosen)}",
        )
    return table


def _results(policies: dict[str, Any], name: str) -> list[dict[str, float]]:
    if name in policies:
        return [policies[name]]
    method = name.split(" ")[0]
    return [v for k, v in policies.items() if k.split(":")[0] == method and ":" in k]


def _geo(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{math.exp(sum(math.log(v) for v in values) / len(values)):.3f}"


def plot(runs: list[Run], path: Path, budget: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for method in dict.fromkeys(r.label for r in runs):
        curves = [
            [v if v is not None else np.nan for v in r.best] for r in runs if r.label == method
        ]
        ax.plot(range(1, budget + 1), np.nanmean(np.array(curves), axis=0), label=method)
    ax.axhline(1.0, color="grey", linestyle=":", label="Tiresias defaults")
    ax.set_xlabel("trials")
    ax.set_ylabel("best avg JCT / Tiresias (training traces, geo-mean)")
    ax.set_title(f"2D-LAS tuning, p99 JCT <= {P99_LIMIT} x Tiresias")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    limit_threads(args.threads)
    folder = args.traces

    def target_of(names: Sequence[str], max_jobs: int | None) -> GpuSchedTarget:
        options: dict[str, Any] = {
            "traces": [str(folder / f"{n}.trace") for n in names],
            "load": args.load,
            "restart_s": args.restart_s,
        }
        if max_jobs:
            options["max_jobs"] = max_jobs
        return GpuSchedTarget.from_options(options)

    train = target_of(args.train.split(","), args.max_jobs)
    test = target_of(args.test.split(","), None)
    meta = machine_info()
    runs: list[Run] = []
    aggregates = args.aggregate.split(",")
    for aggregate in aggregates:
        constraint_metric(aggregate)  # an unknown one fails before any run
    with train:
        for method in args.methods.split(","):
            for aggregate in aggregates:
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    run = run_method(method, train, seed, args.budget, aggregate)
                    runs.append(run)
                    console.print(
                        f"{run.label} seed {seed}: best {run.best[-1]} in {run.seconds:.0f} s"
                    )
    results = held_out(test, runs)
    for table in tables(runs, results, args.budget):
        show(table, args.markdown)
    meta["load_note"] = load_note(meta["load_average"])
    console.print(f"[dim]{meta['load_note']}[/dim]")
    data = {"benchmark": "gpusched", "train": args.train, "test": args.test,
            "max_jobs": args.max_jobs, "load": args.load, "restart_s": args.restart_s,
            "p99_limit": P99_LIMIT, "aggregates": aggregates, "objective": OBJECTIVE,
            "budget": args.budget, "meta": meta, "runs": [asdict(r) for r in runs],
            "held_out": results, "held_out_p99": held_out_p99(runs, results)}  # fmt: skip
    console.print(f"wrote {write_json('gpusched', data, args.out)}")
    console.print(f"wrote {plot(runs, args.out / 'gpusched.png', args.budget)}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.gpusched", description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument(
        "--aggregate",
        default="worst",
        help="p99 constraint over the training traces: worst (every trace), geomean, or both "
        "(worst,geomean) to compare",
    )
    parser.add_argument("--train", default=",".join(TRAIN), help="Gavel trace names")
    parser.add_argument("--test", default=",".join(TEST), help="held-out trace names")
    parser.add_argument(
        "--max-jobs", type=int, default=MAX_JOBS, help="first jobs of a training trace"
    )
    parser.add_argument("--load", type=float, default=LOAD)
    parser.add_argument("--restart-s", type=float, default=RESTART_S)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--traces", type=Path, default=TRACES, help="the folder of the Gavel traces (NAME.trace)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--markdown", action="store_true")
    return parser


if __name__ == "__main__":
    sys.exit(main())
