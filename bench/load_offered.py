"""SuggestTrials latency against the load offered: bench.load's BO workers, measuring each
trial for a while (``--think``) before they report it, in interleaved rounds.

``python -m bench.load_offered [--rounds 2] [--think 0,2,8] [--clients 64] [--bo-cycles 6]
[--storage sqlite|postgresql] [--replicas N] [--markdown]``

Why: ``bench.load``'s workers ask again the moment a suggestion is answered, so the
server is always saturated and a suggestion's latency is set by the queue, not by the
server. With ``N`` workers each asking again at once, Little's law gives the mean cycle
time as ``N / X`` (``X`` the cycles per second the machine sustains): 64 workers at 25 BO
cycles per second wait 2.6 s a cycle, whatever the server does, while one fit takes
about 0.1 s. Real workers measure a trial (seconds to hours) between a suggestion and its
report; ``--think S`` makes each sleep an exponential time of mean ``S`` seconds there,
which offers the server ``N / (S + cycle time)`` suggestions per second (each worker also
sleeps once before its first call, so the run starts in the steady state instead of with
all ``N`` first calls at once). This benchmark
sweeps ``S`` and reports, per setting, the SuggestTrials p50 / p99 against the time of
one fit on the idle server at the history size the run ended with (``bench.load``'s
yardstick), so one reads off the load up to which a suggestion costs about one fit.

Each round runs every ``--think`` value once on a fresh server (``bench.load.run_ours``,
with its database check: nothing lost, duplicated or handed out twice). Results:
``bench/results/load/offered/`` (``offered.json``, ``offered.png``: p99 / one fit against
the cycles per second offered, each run a dot).
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
from bench.load import checks_cells, mean_range, passed, run_ours, throwaway_postgres

OUT = Path(__file__).resolve().parent / "results" / "load" / "offered"
GOAL = 2.0  # issue 28: SuggestTrials p99 within twice one fit


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    meta = machine_info()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tuner-load-offered-") as tmp, ExitStack() as stack:
        pg_url = args.pg_url
        if args.storage == "postgresql" and not pg_url:
            pg_url = stack.enter_context(throwaway_postgres())
        for round_ in range(1, args.rounds + 1):
            for think in args.think:
                settings = argparse.Namespace(**vars(args) | {"think": think, "pg_url": pg_url})
                work = Path(tmp) / f"think-{think}-{round_}"
                work.mkdir()
                result = run_ours(settings, work, "bo")
                result.pop("latency_samples_ms")
                result |= {"round": round_, "think_s": think}
                console.print(
                    f"round {round_}, think {think:g} s: {result['cycles_per_s']} cycles/s, "
                    f"SuggestTrials p99 {result['rpcs']['SuggestTrials']['p99_ms']:.0f} ms, "
                    f"one fit {result['one_fit_ms']['p50_ms']:.0f} ms, "
                    f"checks {'PASS' if passed(result) else 'FAIL'}"
                )
                runs.append(result)
    show(table(runs), args.markdown)
    meta["load_note"] = load_note(meta["load_average"])
    meta["settings"] = vars(args) | {"out": str(args.out)}
    console.print(f"wrote {write_json('offered', {'meta': meta, 'runs': runs}, args.out)}")
    console.print(f"wrote {plot(runs, args.out / 'offered.png')}")
    ok = all(passed(r) for r in runs)
    console.print("checks: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def ratio(run: dict[str, Any]) -> float:
    """SuggestTrials p99 over one fit on the idle server (p50 of one per study)."""
    return float(run["rpcs"]["SuggestTrials"]["p99_ms"] / run["one_fit_ms"]["p50_ms"])


def table(runs: list[dict[str, Any]]) -> Table:
    out = Table(title="BO suggestions against the load offered: mean over rounds (min-max)")
    columns = ("think (s)", "rounds", "cycles/s", "suggest p50 (ms)",
               "suggest p99 (ms)", "one fit (ms)", "p99 / one fit", "complete p99 (ms)",
               "health <= 1 s", "lost/dup/twice")  # fmt: skip
    for column in columns:
        out.add_column(column, justify="right")
    for think in dict.fromkeys(r["think_s"] for r in runs):
        mine = [r for r in runs if r["think_s"] == think]
        out.add_row(
            f"{think:g}",
            str(len(mine)),
            mean_range([r["cycles_per_s"] for r in mine]),
            mean_range([r["rpcs"]["SuggestTrials"]["p50_ms"] for r in mine], 0),
            mean_range([r["rpcs"]["SuggestTrials"]["p99_ms"] for r in mine], 0),
            mean_range([r["one_fit_ms"]["p50_ms"] for r in mine], 0),
            mean_range([ratio(r) for r in mine], 1),
            mean_range([r["rpcs"]["CompleteTrial"]["p99_ms"] for r in mine], 0),
            *checks_cells(mine),
        )
    return out


def plot(runs: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for think in dict.fromkeys(r["think_s"] for r in runs):
        mine = [r for r in runs if r["think_s"] == think]
        ax.scatter([r["cycles_per_s"] for r in mine], [ratio(r) for r in mine], zorder=3,
                   label=f"mean measuring time {think:g} s")  # fmt: skip
    ax.axhline(GOAL, color="tab:red", linestyle="--", label=f"goal: {GOAL:g}x one fit")
    ax.set_xlabel("BO suggest/complete cycles per second (the load offered and served)")
    ax.set_ylabel("SuggestTrials p99 / one fit on the idle server")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks([1, 2, 5, 10, 20, 50])
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("bench.load_offered: 64 workers on 8 studies (2-CPU VM, loopback)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _thinks(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: seconds >= 0, a list") from exc
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: seconds >= 0, a list")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.load_offered", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--think", type=_thinks, default=[0.0, 2.0, 8.0],
        help="mean measuring times to sweep, seconds (default 0,2,8)",
    )  # fmt: skip
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--bo-cycles", type=int, default=6)
    parser.add_argument("--studies", type=int, default=8)
    parser.add_argument("--storage", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--pg-url", help="PostgreSQL server for the runs (default: throwaway)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--markdown", action="store_true")
    return parser


if __name__ == "__main__":
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    sys.exit(main())
