"""Tables and the plot of ``bench/llamatune.py``, from its results (``llamatune.json``).

Every table is built from the JSON summary alone, so ``python -m bench.llamatune --report
FILE`` prints a finished run again. Methods that use expert priors (``ours-priors``; their
summaries carry ``"expert_priors": true``) are marked ``(with priors)`` in every column header
and legend, and the priors themselves (knob, recommended region, source) are listed in their own
table; every other method ignores the knobs' recommended regions.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import console, show

PRIORS_MARK = "(with priors)"


def method_label(method: str, summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """The method's name, marked when it searches the knobs' recommended regions first."""
    uses = any(s["methods"].get(method, {}).get("expert_priors") for s in summaries.values())
    return f"{method} {PRIORS_MARK}" if uses else method


def quality_table(summaries: Mapping[str, Mapping[str, Any]], seeds: int) -> Table:
    """Mean best (std) per checkpoint and method."""
    table = Table(title=f"Best value: mean (std) over {seeds} seeds{_note(summaries)}")
    for name in ("problem", "evals"):
        table.add_column(name, justify="left" if name == "problem" else "right")
    methods = _present(summaries)
    for method in methods:
        table.add_column(method_label(method, summaries), justify="right")
    for problem, summary in summaries.items():
        arrow = "max" if summary["goal"] == "maximize" else "min"
        for i, c in enumerate(summary["checkpoints"]):
            label = f"{problem} ({summary['metric']}, {arrow})" if i == 0 else ""
            cells = [
                summary["methods"].get(m, {}).get("checkpoints", {}).get(str(c)) for m in methods
            ]
            table.add_row(label, str(c), *(_cell(s) for s in cells))
    return table


def ratio_table(summaries: Mapping[str, Mapping[str, Any]]) -> Table:
    """Trials to reach mlos-core's mean best at 100 trials, as a fraction of 100."""
    table = Table(
        title="Trials to reach mlos LlamaTune+SMAC's mean best at min(100, budget), "
        f"/ that many trials (mean over seeds; seeds that reached it){_note(summaries)}"
    )
    table.add_column("problem")
    table.add_column("target", justify="right")
    methods = _present(summaries)
    for method in methods:
        table.add_column(method_label(method, summaries), justify="right")
    for problem, summary in summaries.items():
        target = summary["target"]
        if target["value"] is None:
            continue
        cells = []
        for method in methods:
            ratio = summary["time_to_target"].get(method)
            cells.append("-" if ratio is None else _ratio_cell(ratio))
        table.add_row(f"{problem} (@{target['ref_trials']})", f"{target['value']:.4g}", *cells)
    return table


def published_table(summaries: Mapping[str, Mapping[str, Any]]) -> Table:
    """Our methods' mean best next to ALEBO's published curves at the same evaluations."""
    table = Table(title="ALEBO problems: mean best here vs published (ALEBO repository)")
    shown = {name: s for name, s in summaries.items() if s["published"]}
    evals = sorted({c for s in shown.values() for c in s["checkpoints"]})
    for name in ("problem", "method", "source", *(f"@{c}" for c in evals)):
        table.add_column(name, justify="right" if name.startswith("@") else "left")
    for problem, summary in shown.items():
        first = True
        for method, data in summary["methods"].items():
            values = {c: s["mean"] for c, s in data["checkpoints"].items()}
            source = f"here, {data['runs']} seeds"
            name = method_label(method, summaries)
            table.add_row(problem if first else "", name, source, *_at(values, evals))
            first = False
        for method, data in summary["published"].items():
            source = f"published, {data['reps']} reps"
            table.add_row("", method, source, *_at(data["at"], evals))
    return table


def time_table(summaries: Mapping[str, Mapping[str, Any]]) -> Table:
    """Mean wall time of one run per method (optimizer plus evaluations)."""
    table = Table(title="Seconds per run (one seed)")
    table.add_column("problem")
    table.add_column("budget", justify="right")
    methods = _present(summaries)
    for method in methods:
        table.add_column(method_label(method, summaries), justify="right")
    for problem, summary in summaries.items():
        cells = [summary["methods"].get(m, {}).get("seconds_per_run") for m in methods]
        table.add_row(
            problem, str(summary["budget"]), *("-" if s is None else f"{s:.1f}" for s in cells)
        )
    return table


def plot(summaries: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """Mean best so far against evaluations per problem (regret, log scale, where known)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(summaries)
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4), squeeze=False)
    for ax, (problem, summary) in zip(axes[0], summaries.items(), strict=True):
        optimum = summary["optimum"]

        def shown(curve: list[float], optimum: float | None = optimum) -> list[float]:
            return curve if optimum is None else [max(v - optimum, 1e-6) for v in curve]

        for method, data in summary["methods"].items():
            curve = shown(data["mean_curve"])
            name = method_label(method, summaries)
            ax.plot(range(1, len(curve) + 1), curve, label=f"{name} ({data['runs']})")
        for method, data in summary["published"].items():
            curve = shown(data["mean_curve"][: summary["budget"]])
            ax.plot(
                range(1, len(curve) + 1), curve, "--", lw=1, alpha=0.7, label=f"{method} (pub.)"
            )
        if optimum is not None:
            ax.set_yscale("log")
        ax.set_title(problem)
        ax.set_xlabel("evaluations")
        what = f"mean best {summary['metric']}"
        ax.set_ylabel(what if optimum is None else f"{what} − optimum")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def priors_table(priors: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Table:
    """The expert priors the methods marked ``(with priors)`` used: knob, values, source."""
    table = Table(
        title=f"Expert priors: used only by the methods marked {PRIORS_MARK}; "
        "the other methods ignore them"
    )
    for name in ("problem", "knob", "recommended", "source"):
        table.add_column(name)
    for problem, knobs in priors.items():
        for i, (knob, prior) in enumerate(knobs.items()):
            table.add_row(problem if i == 0 else "", knob, _region(prior), prior["source"])
    return table


def print_report(data: Mapping[str, Any], markdown: bool) -> None:
    """Print a results file's tables, goals, skipped and failed runs, and the load note."""
    summaries = data["summary"]
    tables = [
        quality_table(summaries, data["meta"]["seeds"]),
        ratio_table(summaries),
        published_table(summaries),
        time_table(summaries),
        priors_table(data["meta"].get("expert_priors", {})),
    ]
    wide = Console(width=None if console.is_terminal else 160)  # rich: 80 columns in a pipe
    for table in tables:
        if not table.row_count:
            continue
        if markdown:
            show(table, markdown=True)
        else:
            wide.print(table)
    for goal in data["goals"]:
        verdict = "[green]PASS[/]" if goal["passed"] else "[red]FAIL[/]"
        text = f"{'PASS' if goal['passed'] else 'FAIL'}" if markdown else verdict
        console.print(f"{text}  {goal['goal']}: {goal['value']:.4g}", markup=not markdown)
    for name, reason in data["meta"].get("skipped", {}).items():
        console.print(f"skipped {name}: {reason}", markup=False)
    for name, reason in data["meta"].get("failed", {}).items():
        console.print(f"FAILED {name}: {reason.splitlines()[0]}", markup=False)
    console.print(data["meta"]["load_note"], markup=False)


# -- private helpers -------------------------------------------------------------------------


def _present(summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The methods run anywhere, in the order the summaries list them (the run's order)."""
    out: list[str] = []
    for summary in summaries.values():
        out += [m for m in summary["methods"] if m not in out]
    return out


def _note(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    if all(method_label(m, summaries) == m for m in _present(summaries)):
        return ""
    return (
        f"; {PRIORS_MARK}: searches the knobs' recommended regions first (expert priors), "
        "the other methods ignore them"
    )


def _region(prior: Mapping[str, Any]) -> str:
    """``low..high`` of a range knob (numbers in JSON), else the recommended choices."""
    values = prior["recommended"]
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if numeric and len(values) == 2:
        return f"{values[0]}..{values[1]}"
    return ", ".join(str(v) for v in values)


def _cell(stats: Mapping[str, float] | None) -> str:
    return "-" if stats is None else f"{stats['mean']:.4g} ({stats['std']:.2g})"


def _ratio_cell(ratio: Mapping[str, Any]) -> str:
    prefix = "" if ratio["reached"] == ratio["seeds"] else ">="
    return f"{prefix}{ratio['mean_ratio']:.2f} ({ratio['reached']}/{ratio['seeds']})"


def _at(values: Mapping[str, float | None], evals: list[int]) -> list[str]:
    cells = []
    for c in evals:
        value = values.get(str(c))
        cells.append("-" if value is None else f"{value:.4g}")
    return cells
