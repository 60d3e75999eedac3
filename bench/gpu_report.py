"""Tables and a plot from the GPU measurements in ``bench/results/gpu/`` (``bench/gpu_device.py``).

Run as ``python -m bench.gpu_report [--dir bench/results/gpu] [--markdown]``. It reads

* ``h200-inference.csv`` and ``h200-inference-log.jsonl`` (which device run and pass each row
  came from): the SLO is fixed by the rule chosen before any measurement, p99 <= 2 x the
  default cell's median p99. The energy saved at the SLO is judged without the winner's
  curse: the best feasible cell is **chosen on the first device run's measurements** and
  its energy per request is compared with the default clocks' (1980 MHz, default power
  limit, the best feasible batch of those clocks, chosen the same way) **on the second
  run's measurements**, with a 95 % bootstrap interval over those repeats;
* the default cell's interleaved control measurements over time (drift);
* ``h200-pipeline.csv``: throughput and energy per sample at each SM clock of the one-GPU
  pipeline, and the energy saved by the lowest clock within 1 % of the top throughput.

It writes ``h200-inference.png``: energy per request against p99 for every cell.

``--stages DIR`` reads instead ``DIR/stages-log.jsonl`` (``bench.gpu_device stages``: the
clock per pipeline stage in time on one GPU) and ``DIR/stage-switch.json``: on the first
pass it chooses the lowest-energy fixed clock (both clocks equal) and the lowest-energy cell
of all, each within 1 % of the unlocked default's throughput; their energy per sample
saved against the default and against each other is estimated on the later passes (95 %
bootstrap intervals over those passes; the same pass when there is only one, which the
table says).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import console, show

KNOBS = ("sm_mhz", "power_w", "batch")
ENERGY = "gpu_energy_j_per_request"
SLO_FACTOR = 2.0
BOOT = 4000
Cell = tuple[int, ...]


def load(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def cells_of(rows: Sequence[dict[str, Any]]) -> dict[Cell, list[dict[str, Any]]]:
    out: dict[Cell, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["status"] == "COMPLETED":
            out[tuple(int(float(row[k])) for k in KNOBS)].append(row)
    return out


def mean(rows: Sequence[dict[str, Any]], metric: str) -> float:
    return statistics.fmean(float(r[metric]) for r in rows)


def interval(values: Sequence[float], base: Sequence[float], seed: int = 0) -> tuple[float, ...]:
    """1 - mean(values)/mean(base), with a 95 % bootstrap interval over both samples."""
    rng = random.Random(seed)
    point = 1 - statistics.fmean(values) / statistics.fmean(base)
    draws = sorted(
        1
        - statistics.fmean(rng.choices(values, k=len(values)))
        / statistics.fmean(rng.choices(base, k=len(base)))
        for _ in range(BOOT)
    )
    return point, draws[int(0.025 * BOOT)], draws[int(0.975 * BOOT) - 1]


def best_feasible(
    cells: dict[Cell, list[dict[str, Any]]], slo: float, only: dict[str, int] | None = None
) -> Cell:
    allowed = [
        c
        for c, rows in cells.items()
        if mean(rows, "p99_ms") <= slo
        and all(c[KNOBS.index(k)] == v for k, v in (only or {}).items())
    ]
    if not allowed:
        raise SystemExit("no cell meets the SLO on average")
    return min(allowed, key=lambda c: mean(cells[c], ENERGY))


def inference(folder: Path) -> tuple[Table, Table, dict[str, Any]]:
    rows = load(folder / "h200-inference.csv")
    log = [json.loads(line) for line in (folder / "h200-inference-log.jsonl").open()]
    runs = sorted({entry["run"] for entry in log})
    default: Cell = tuple(int(float(rows[0][k])) for k in KNOBS)
    everything = cells_of(rows)
    slo = SLO_FACTOR * statistics.median(float(r["p99_ms"]) for r in everything[default])
    chosen_on = cells_of([e for e in log if e["run"] == runs[0]])
    judged_on = cells_of([e for e in log if e["run"] == runs[-1]])
    best = best_feasible(chosen_on, slo)
    top_clocks = {"sm_mhz": default[0], "power_w": default[1]}
    base = best_feasible(chosen_on, slo, top_clocks)
    table = Table(title=f"H200 inference: {len(rows)} measurements of {len(everything)} cells")
    for column in ("cell (SM MHz, W, batch)", "chosen as", "n", "mJ/request", "p99 ms", "req/s"):
        table.add_column(column, justify="left" if column.startswith("cell") else "right")
    for name, cell in (("best feasible", best), ("default clocks, best batch", base)):
        held = judged_on[cell]
        table.add_row(
            str(cell),
            name,
            str(len(held)),
            f"{1000 * mean(held, ENERGY):.2f}",
            f"{mean(held, 'p99_ms'):.2f}",
            f"{mean(held, 'requests_per_s'):.0f}",
        )
    saving = interval(
        [float(r[ENERGY]) for r in judged_on[best]], [float(r[ENERGY]) for r in judged_on[base]]
    )
    drift = Table(title="Default cell, interleaved controls (drift)")
    for column in ("run", "pass", "t s", "mJ/request", "p99 ms", "req/s"):
        drift.add_column(column, justify="right")
    for entry in log:
        if tuple(int(entry[k]) for k in KNOBS) == default and entry["status"] == "COMPLETED":
            drift.add_row(
                str(entry["run"]),
                str(entry["pass"]),
                f"{entry['t_s']:.0f}",
                f"{1000 * entry[ENERGY]:.2f}",
                f"{entry['p99_ms']:.2f}",
                f"{entry['requests_per_s']:.0f}",
            )
    facts = {
        "slo_p99_ms": slo,
        "best": best,
        "default_clocks_cell": base,
        "saving": saving,
        "cells": everything,
    }
    return table, drift, facts


def pipeline(folder: Path) -> tuple[Table, dict[str, Any]]:
    cells: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in load(folder / "h200-pipeline.csv"):
        if row["status"] == "COMPLETED":
            cells[int(row["sm_mhz"])].append(row)
    top = max(cells)
    top_rate = mean(cells[top], "samples_per_s")
    table = Table(title="H200, one-GPU pipeline (8,8,4,2 blocks, width 4096): SM clock sweep")
    for column in ("SM MHz", "n", "samples/s", "vs top", "mJ/sample", "saved", "W"):
        table.add_column(column, justify="right")
    within = top
    for clock in sorted(cells, reverse=True):
        rows = cells[clock]
        rate = mean(rows, "samples_per_s") / top_rate
        if rate >= 0.99:
            within = min(within, clock)
        saved = 1 - mean(rows, ENERGY) / mean(cells[top], ENERGY)
        table.add_row(
            str(clock),
            str(len(rows)),
            f"{mean(rows, 'samples_per_s'):.0f}",
            f"{rate:.3f}",
            f"{1000 * mean(rows, ENERGY):.1f}",
            f"{saved:+.1%}",
            f"{mean(rows, 'gpu_power_w'):.0f}",
        )
    saved = 1 - mean(cells[within], ENERGY) / mean(cells[top], ENERGY)
    return table, {"clock_within_1pct": within, "saved_within_1pct": saved}


STAGE_KNOBS = ("sm_mhz", "sm_mhz_memory")
THROUGHPUT_LOSS = 0.01


def stages(folder: Path) -> tuple[Table, dict[str, Any]]:
    """Issue 60's item 3 from ``bench.gpu_device stages`` (module doc)."""
    log = [json.loads(line) for line in (folder / "stages-log.jsonl").read_text().splitlines()]
    done = [e for e in log if e["status"] == "COMPLETED"]
    passes = sorted({e["pass"] for e in done})
    default = tuple(int(log[0][k]) for k in STAGE_KNOBS)

    def by_cell(entries: Sequence[dict[str, Any]]) -> dict[Cell, list[dict[str, Any]]]:
        out: dict[Cell, list[dict[str, Any]]] = defaultdict(list)
        for e in entries:
            out[tuple(int(e[k]) for k in STAGE_KNOBS)].append(e)
        return out

    chosen_on = by_cell([e for e in done if e["pass"] == passes[0]])
    later = [e for e in done if e["pass"] != passes[0]] or done
    judged_on = by_cell(later)
    floor = (1 - THROUGHPUT_LOSS) * mean(chosen_on[default], "samples_per_s")
    ok = [c for c, rows in chosen_on.items() if mean(rows, "samples_per_s") >= floor]
    fixed = min((c for c in ok if c[0] == c[1]), key=lambda c: mean(chosen_on[c], ENERGY))
    best = min(ok, key=lambda c: mean(chosen_on[c], ENERGY))
    title = f"one GPU, clock per stage: {len(done)} measurements, {len(passes)} passes"
    if len(passes) == 1:
        title += " (chosen and judged on the same pass)"
    table = Table(title=title)
    columns = ("cell (gemm MHz, memory MHz)", "chosen as", "n", "samples/s", "vs default",
               "mJ/sample", "saved vs default (95 %)", "saved vs best fixed (95 %)")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column.startswith("cell") else "right")
    base_rate = mean(judged_on[default], "samples_per_s")
    facts: dict[str, Any] = {"default": default, "fixed": fixed, "best": best}
    for name, cell in (("unlocked default", default), ("best fixed clock", fixed),
                       ("best per stage", best)):  # fmt: skip
        rows = judged_on[cell]
        energy = [float(r[ENERGY]) for r in rows]
        versus = [interval(energy, [float(r[ENERGY]) for r in judged_on[other]])
                  for other in (default, fixed)]  # fmt: skip
        facts[name] = {"saved_vs_default": versus[0], "saved_vs_fixed": versus[1],
                       "throughput": mean(rows, "samples_per_s") / base_rate}  # fmt: skip
        table.add_row(
            str(cell), name, str(len(rows)), f"{mean(rows, 'samples_per_s'):.0f}",
            f"{mean(rows, 'samples_per_s') / base_rate:.3f}", f"{1000 * mean(rows, ENERGY):.2f}",
            *(f"{p:+.1%} ({lo:+.1%} to {hi:+.1%})" for p, lo, hi in versus),
        )  # fmt: skip
    switch = folder / "stage-switch.json"
    if switch.exists():
        facts["switch"] = {k: v for k, v in json.loads(switch.read_text()).items() if k != "rounds"}
    return table, facts


def plot(facts: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells: dict[Cell, list[dict[str, Any]]] = facts["cells"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    clocks = sorted({c[0] for c in cells})
    colours = plt.get_cmap("viridis")
    for cell, rows in cells.items():
        energy = [1000 * float(r[ENERGY]) for r in rows]
        p99 = [float(r["p99_ms"]) for r in rows]
        colour = colours(clocks.index(cell[0]) / max(1, len(clocks) - 1))
        marker = {8: "v", 64: "o", 256: "s", 1024: "D"}.get(cell[2], "x")
        ax.errorbar(
            statistics.fmean(p99),
            statistics.fmean(energy),
            yerr=statistics.stdev(energy) if len(energy) > 1 else 0,
            fmt=marker,
            color=colour,
            alpha=0.8,
            ms=5,
        )
    ax.axvline(facts["slo_p99_ms"], color="red", lw=1, ls="--", label="SLO (2 x default p99)")
    for name, cell in (("best", facts["best"]), ("default clocks", facts["default_clocks_cell"])):
        rows = cells[cell]
        ax.annotate(name, (mean(rows, "p99_ms"), 1000 * mean(rows, ENERGY)), fontsize=8)
    for clock in clocks:
        ax.plot([], [], "o", color=colours(clocks.index(clock) / max(1, len(clocks) - 1)),
                label=f"SM {clock} MHz")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks([1, 2, 3, 5, 10, 20, 50], labels=["1", "2", "3", "5", "10", "20", "50"])
    ax.minorticks_off()
    ax.set_xlabel("p99 latency, ms (marker: batch 8 v, 64 o, 256 s, 1024 D)")
    ax.set_ylabel("energy per request, mJ (mean +- sd)")
    ax.set_ylim(0, 35)
    ax.set_title("H200, encoder inference: every cell of the sweep", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_report", description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("bench/results/gpu"))
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--stages", type=Path, help="a `bench.gpu_device stages` folder")
    args = parser.parse_args(argv)
    if args.stages is not None:
        table, found = stages(args.stages)
        show(table, args.markdown)
        if "switch" in found:
            console.print(f"switching cost: {json.dumps(found['switch'])}", highlight=False)
        return 0
    table, drift, facts = inference(args.dir)
    show(table, args.markdown)
    point, low, high = facts["saving"]
    console.print(
        f"SLO p99 <= {facts['slo_p99_ms']:.3f} ms; energy per request saved at the SLO against "
        f"the default clocks: {point:.1%} (95 % bootstrap interval {low:.1%} to {high:.1%})"
    )
    show(drift, args.markdown)
    pipe, pipe_facts = pipeline(args.dir)
    show(pipe, args.markdown)
    console.print(
        f"lowest clock within 1 % of the top throughput: {pipe_facts['clock_within_1pct']} MHz, "
        f"energy saved {pipe_facts['saved_within_1pct']:.1%}"
    )
    console.print(f"wrote {plot(facts, args.dir / 'h200-inference.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
