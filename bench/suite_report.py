"""Tables and the plot of ``bench.suite`` (from the summaries of ``bench/suite_score.py``).

* one table per problem: each method's seeds, its mean (std) of the true value of its
  reported best at the checkpoints, its time to the best peer's target (mean ratio; ``>=``
  when a seed never got there, with how many did), its mean rank at each checkpoint (over the
  seeds every method ran, counted in the title) and its seconds per run;
* the summary over problems: for each ``ours*`` method the fraction of problems where it
  reaches the best peer's target, its median time-to-target ratio, and the fractions where
  its mean at 25 and at 50 is no worse than the best peer's there; every method's mean
  rank at 25/50/100 evaluations (with the number of problems it ran), and again per family
  when the problems span several; when some method did
  not run on every problem, both again over the problems every method ran; on the noisy
  twins, whether ours' true value beats every peer at 50 and 100;
* a PNG of small multiples, one panel per problem, the mean normalized curve of each method:
  ``(value - best) / (worst - best)``, where best is the known optimum when there is one
  (else the best mean any method reached) and worst the problem's worst reported value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import show
from bench.suite_score import KEEP_UP_AT, SUMMARY_AT, TWIN_AT


def problem_table(name: str, summary: Mapping[str, Any]) -> Table:
    """The per-problem table (module doc)."""
    marks = summary["checkpoints"]
    target = summary.get("target")
    goal = "max" if summary["goal"] == "maximize" else "min"
    title = f"{name}: {goal} {summary['objective']}, budget {summary['budget']}"
    if summary.get("optimum") is not None:
        title += f", optimum {_num(summary['optimum'])}"
    if target is not None:
        title += f"; target {_num(target['value'])} = {target['by']}'s mean @{target['ref']}"
    table = Table(title=title + f"; ranks over {summary.get('rank_seeds', '?')} common seeds")
    table.add_column("method")
    table.add_column("seeds", justify="right")
    for mark in marks:
        table.add_column(f"@{mark}", justify="right")
    table.add_column("to target / ref (reached)", justify="right")
    table.add_column("rank @" + "/".join(map(str, marks)), justify="right")
    table.add_column("s/run", justify="right")
    ttt = summary.get("time_to_target", {})
    for method, stats in summary["methods"].items():
        cells = []
        for mark in marks:
            cell = stats["at"][str(mark)]
            text = f"{_num(cell['mean'])} ({_num(cell['std'])})"
            none = stats["no_feasible"][str(mark)]
            cells.append(text + (f" [{none} none]" if none else ""))
        ranks = "/".join(f"{summary['ranks'][str(m)].get(method, math.nan):.2f}" for m in marks)
        table.add_row(
            method,
            _seeds(stats["seeds"]),
            *cells,
            _ratio(ttt.get(method)),
            ranks,
            f"{stats['seconds_per_run']:.1f}",
        )
    return table


def summary_tables(suite: Mapping[str, Any]) -> list[Table]:
    """The tables over problems (module doc)."""
    out = [
        _reach_table(suite["ours"], "Ours against the best peer, over problems"),
        _rank_table(
            suite["ranks"],
            "Mean rank over problems (at the budget where it is smaller)",
            suite.get("rank_problems"),
        ),
    ]
    families = suite.get("family_ranks", {})
    if len(families) > 1:
        out.append(_family_table(families, suite["family_problems"]))
    complete = suite.get("complete", [])
    scored = suite.get("rank_problems", {})
    if complete and any(count != len(complete) for count in scored.values()):
        where = f"the {len(complete)} problems every method ran"
        out.append(_reach_table(suite["ours_complete"], f"Ours against the best peer, {where}"))
        out.append(_rank_table(suite["ranks_complete"], f"Mean rank over {where}"))
    if suite["twins"]:
        twins = Table(title="Noisy twins: ours' mean true value beats every peer")
        twins.add_column("problem")
        twins.add_column("method")
        for at in TWIN_AT:
            twins.add_column(f"@{at}", justify="right")
        for name, by in suite["twins"].items():
            for method, cells in by.items():
                twins.add_row(name, method, *(_yes(cells[str(at)]) for at in TWIN_AT))
        out.append(twins)
    return out


def _reach_table(rows: Mapping[str, Any], title: str) -> Table:
    reach = Table(title=title)
    reach.add_column("method")
    reach.add_column("problems", justify="right")
    reach.add_column("reaches the best peer's target", justify="right")
    reach.add_column("median trials to target / ref", justify="right")
    for at in KEEP_UP_AT:
        reach.add_column(f"no worse than the best peer @{at}", justify="right")
    for method, row in rows.items():
        fraction, ratio = row["reach_fraction"], row["median_ratio"]
        early = row.get("keeps_up", {})  # absent in a summary written before it existed
        reach.add_row(
            method,
            str(row["problems"]),
            _fraction(fraction),
            "-" if ratio is None else f"{ratio:.2f}",
            *(_fraction(early.get(str(at))) for at in KEEP_UP_AT),
        )
    return reach


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _family_table(
    families: Mapping[str, Mapping[str, Mapping[str, float]]],
    problems: Mapping[str, Mapping[str, int]],
) -> Table:
    table = Table(title="Mean rank over each family's problems")
    table.add_column("family")
    table.add_column("method")
    table.add_column("problems", justify="right")
    for at in SUMMARY_AT:
        table.add_column(f"@{at}", justify="right")
    for family, ranks in families.items():
        for method in sorted({m for by in ranks.values() for m in by}):
            count = str(problems[family].get(method, 0))
            table.add_row(family, method, count, *_rank_cells(ranks, method))
    return table


def _rank_table(
    ranks: Mapping[str, Mapping[str, float]], title: str, problems: Mapping[str, int] | None = None
) -> Table:
    table = Table(title=title)
    table.add_column("method")
    if problems is not None:
        table.add_column("problems", justify="right")
    for at in SUMMARY_AT:
        table.add_column(f"@{at}", justify="right")
    for method in sorted({m for by in ranks.values() for m in by}):
        count = [] if problems is None else [str(problems.get(method, 0))]
        table.add_row(method, *count, *_rank_cells(ranks, method))
    return table


def _rank_cells(ranks: Mapping[str, Mapping[str, float]], method: str) -> list[str]:
    """``method``'s mean rank at each of ``SUMMARY_AT`` ("-" where it has none)."""
    cells = [ranks[str(at)].get(method) for at in SUMMARY_AT]
    return ["-" if c is None else f"{c:.2f}" for c in cells]


def print_report(
    summaries: Mapping[str, Mapping[str, Any]], suite: Mapping[str, Any], markdown: bool
) -> None:
    """Every table, problems first."""
    for name, summary in summaries.items():
        if summary["methods"]:
            show(problem_table(name, summary), markdown)
    for table in summary_tables(suite):
        show(table, markdown)


def plot(summaries: Mapping[str, Mapping[str, Any]], path: Path) -> Path | None:
    """Small multiples of the mean normalized curves (module doc); None when nothing to draw."""
    panels = {n: s for n, s in summaries.items() if s.get("normalized")}
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(5, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.5 * rows), squeeze=False)
    methods = sorted({m for s in panels.values() for m in s["normalized"]})
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    for ax, (name, summary) in zip(axes.flat, panels.items(), strict=False):
        for method, curve in summary["normalized"].items():
            ax.plot(range(1, len(curve) + 1), curve, color=colors[method], label=method)
        ax.set_title(name, fontsize=7)
        ax.set_ylim(-0.02, 1.02)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    spare = list(axes.flat)[len(panels) :]
    for ax in spare:
        ax.axis("off")
    handles = [plt.Line2D([], [], color=colors[m], label=m) for m in methods]
    holder = spare[0] if spare else fig  # the legend in an empty panel, else below them all
    holder.legend(handles=handles, loc="center" if spare else "lower center", fontsize=7)
    fig.supxlabel("evaluations", fontsize=8)
    fig.supylabel("(value - best) / (worst - best), mean over seeds", fontsize=8)
    fig.tight_layout(rect=(0, 0.0 if spare else 0.5 / (2.5 * rows), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ratio(result: Mapping[str, Any] | None) -> str:
    if result is None:
        return "-"
    sign = ">=" if result["reached"] < result["seeds"] else ""
    return f"{sign}{result['mean_ratio']:.2f} ({result['reached']}/{result['seeds']})"


def _seeds(seeds: list[int]) -> str:
    """``0-4`` for a run of consecutive seeds, else the list."""
    if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 1:
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _num(value: float) -> str:
    return f"{value:.4g}"
