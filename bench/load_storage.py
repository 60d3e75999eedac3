"""Storage backends under load: bench.load's workers against one server on SQLite, one on
PostgreSQL, and two replicas sharing one PostgreSQL database, in interleaved rounds.

``python -m bench.load_storage [--rounds 2] [--designer sobol,bo] [--clients 64]
[--cycles 50] [--bo-cycles 10] [--markdown]``

Each round runs every (designer, storage) configuration once, in the same order, so a
machine that gets busier or quieter during the run weighs on every configuration alike;
the table gives the mean over rounds and the range (min-max). A run is
``bench.load.run_ours`` (a fresh ``tuner serve`` per run, or N of them on a fresh
PostgreSQL database on a throwaway server) with its database check: 0 lost, duplicated or
handed out twice, every health check answered. Results: ``bench/results/load/storage/``
(``storage.json``, ``storage.png``: cycles per second and CompleteTrial p99 per
configuration, each round a dot).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import console, load_note, machine_info, show, write_json
from bench.load import (
    DESIGNERS,
    _designers,
    checks_cells,
    mean_range,
    passed,
    run_ours,
    throwaway_postgres,
)

OUT = Path(__file__).resolve().parent / "results" / "load" / "storage"
CONFIGS = (("sqlite", 1), ("postgresql", 1), ("postgresql", 2))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    meta = machine_info()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tuner-load-storage-") as tmp, ExitStack() as stack:
        pg_url = args.pg_url or stack.enter_context(throwaway_postgres())
        for round_ in range(1, args.rounds + 1):
            for designer in args.designer:
                for storage, replicas in CONFIGS:
                    settings = argparse.Namespace(
                        **vars(args) | {"storage": storage, "replicas": replicas, "pg_url": pg_url}
                    )
                    work = Path(tmp) / f"{designer}-{storage}-{replicas}-{round_}"
                    work.mkdir()
                    result = run_ours(settings, work, designer)
                    result.pop("latency_samples_ms")
                    result["round"] = round_
                    console.print(
                        f"round {round_}: {result['method']}: {result['cycles_per_s']} cycles/s, "
                        f"CompleteTrial p99 {result['rpcs']['CompleteTrial']['p99_ms']} ms, "
                        f"checks {'PASS' if passed(result) else 'FAIL'}"
                    )
                    runs.append(result)
    show(table(runs), args.markdown)
    meta["load_note"] = load_note(meta["load_average"])
    meta["settings"] = vars(args) | {"out": str(args.out)}
    console.print(f"wrote {write_json('storage', {'meta': meta, 'runs': runs}, args.out)}")
    console.print(f"wrote {plot(runs, args.out / 'storage.png')}")
    ok = all(passed(r) for r in runs)
    console.print("checks: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def table(runs: list[dict[str, Any]]) -> Table:
    out = Table(title="Storage under load: mean over rounds (min-max)")
    columns = ("configuration", "rounds", "cycles/s", "suggest p99 (ms)", "complete p50 (ms)",
               "complete p99 (ms)", "health <= 1 s", "lost/dup/twice")  # fmt: skip
    for column in columns:
        out.add_column(column, justify="left" if column == "configuration" else "right")
    for method in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == method]
        out.add_row(
            method,
            str(len(mine)),
            mean_range([r["cycles_per_s"] for r in mine]),
            mean_range([r["rpcs"]["SuggestTrials"]["p99_ms"] for r in mine], 0),
            mean_range([r["rpcs"]["CompleteTrial"]["p50_ms"] for r in mine], 0),
            mean_range([r["rpcs"]["CompleteTrial"]["p99_ms"] for r in mine], 0),
            *checks_cells(mine),
        )
    return out


def plot(runs: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in runs))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in (
        (axes[0], lambda r: r["cycles_per_s"], "suggest/complete cycles per second"),
        (axes[1], lambda r: r["rpcs"]["CompleteTrial"]["p99_ms"], "CompleteTrial p99 (ms)"),
    ):
        for i, method in enumerate(methods):
            values = [key(r) for r in runs if r["method"] == method]
            ax.scatter([i] * len(values), values, color="tab:blue", zorder=3)
            ax.hlines(sum(values) / len(values), i - 0.25, i + 0.25, color="tab:red")
        ax.set_xticks(range(len(methods)), [_label(m) for m in methods], rotation=20,
                      ha="right")  # fmt: skip
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("bench.load_storage: each dot a round, the line the mean (2-CPU VM, loopback)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(method: str) -> str:
    """``ours (bo)`` -> ``bo, sqlite x1``; ``ours (bo, postgresql x2)`` -> ``bo, postgresql x2``."""
    inner = method.removeprefix("ours (").removesuffix(")")
    return inner if "postgresql" in inner else f"{inner}, sqlite x1"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.load_storage", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--designer", type=_designers, default=list(DESIGNERS), help="sobol, bo or both"
    )
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--bo-cycles", type=int, default=10)
    parser.add_argument("--studies", type=int, default=8)
    parser.add_argument("--pg-url", help="PostgreSQL server for the runs (default: throwaway)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--markdown", action="store_true")
    return parser


if __name__ == "__main__":
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    sys.exit(main())
