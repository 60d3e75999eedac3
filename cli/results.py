"""``tuner studies``, ``show``, ``best``, ``front``, ``measurements`` and ``plot``: reading
results back.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from cli.common import connect, out
from cli.render import (
    cell,
    changes,
    confirmation_headline,
    constraints_text,
    default_config,
    fmt,
    learned_from,
    mean_and_spread,
    print_front,
    print_metrics,
    short_reason,
    trial_dict,
)
from cli.verdict import headline, print_verdict, reported_best
from tuner.errors import NotFoundError
from tuner.study import StudySpec
from tuner.trial import (
    MeasurementKind,
    Trial,
    is_feasible,
    with_resolved_constraints,
)


def output_format(args: argparse.Namespace) -> str:
    """``--format``, with ``--json`` as its short form."""
    return "json" if getattr(args, "json", False) else str(getattr(args, "format", "table"))


def write_csv(header: Sequence[str], rows: Sequence[Sequence[Any]], sink: Any = None) -> None:
    """RFC 4180 CSV; numbers as Python prints them (round-trip exact), empty for none."""
    writer = csv.writer(sink or sys.stdout, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow(["" if v is None else v for v in row])


def cmd_studies(args: argparse.Namespace) -> int:
    with connect(args.server, args.db) as api:
        infos = api.list_studies()
    rows = [
        [i.spec.name, i.spec.objective.goal.value, i.spec.objective.name, len(i.spec.space),
         sum(i.trial_counts.values()), i.best_trial_id]
        for i in infos
    ]  # fmt: skip
    header = ["study", "goal", "objective", "knobs", "trials", "best_trial"]
    if output_format(args) == "json":
        print(json.dumps([dict(zip(header, r, strict=True)) for r in rows], indent=2))
        return 0
    if output_format(args) == "csv":
        write_csv(header, rows)
        return 0
    table = Table("study", "objective", "knobs", "trials", "best trial")
    for info in infos:
        spec = info.spec
        table.add_row(
            spec.name,
            f"{spec.objective.goal.value} {spec.objective.name}",
            str(len(spec.space)),
            str(sum(info.trial_counts.values())),
            str(info.best_trial_id or "-"),
        )
    out.print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with connect(args.server, args.db) as api:
        spec = api.get_study(args.study).spec
        trials = api.list_trials(args.study)
    kind = output_format(args)
    if kind == "json":
        print(json.dumps({"study": spec.to_dict(), "trials": [trial_dict(t) for t in trials]},
                         indent=2))  # fmt: skip
    elif kind == "csv":
        write_csv(*trial_rows(spec, trials))
    else:
        out.print(trial_table(spec, trials, every_knob=args.all))
    return 0


def trial_table(spec: StudySpec, trials: Sequence[Trial], every_knob: bool = False) -> Table:
    """A study's trials for people: id, status, the step that made it, whether it met the
    constraints, repeats, metrics; then either the knobs it changes from the default, in
    one column (fits 80 columns at any knob count), or every knob (``every_knob``).
    Cells wrap instead of being cut."""
    resolved = with_resolved_constraints(spec, trials)
    reference = default_config(spec, trials)
    metrics = list(spec.metric_names)
    caption = _show_caption(spec, reference, every_knob)
    if learned := learned_from(trials):
        caption += f"\n{learned}"
    table = Table(show_lines=False, caption=caption)
    for column in ("id", "status", "step", "ok", "n", *metrics):
        table.add_column(column, overflow="fold")
    names = list(spec.space.names) if every_knob else ["changed knobs"]
    changed = {t.id: changes(t.config, reference, spec.space) for t in trials}
    widest = max((len(f"{k}={fmt(v)},") for c in changed.values() for k, v in c.items()),
                 default=0)  # fmt: skip
    for name in names:  # one change is never folded (up to 40 characters)
        table.add_column(name, overflow="fold", min_width=None if every_knob else min(40, widest))
    reasons = every_knob and any(t.reason for t in trials)  # else under the changes
    if reasons:
        table.add_column("reason", overflow="fold")
    for t in trials:
        unused = spec.space.inactive(t.config)
        knobs = (
            [cell(t.config.get(k)) + (" (unused)" if k in unused else "")
             for k in spec.space.names]
            if every_knob
            else [(", ".join(f"{k}={cell(v)}" for k, v in changed[t.id].items())
                   or ("(the default)" if reference else "-"))
                  + (f"\n[dim]{escape(short_reason(t.reason, 60))}[/]" if t.reason else "")]
        )  # fmt: skip
        table.add_row(
            str(t.id),
            t.status.value,
            t.step.value,
            feasibility(resolved, t),
            str(t.repeats) if t.status.is_final else "-",
            *[mean_and_spread(t, m) for m in metrics],
            *knobs,
            *([escape(short_reason(t.reason, 60))] if reasons else []),
        )
    return table


def _show_caption(spec: StudySpec, reference: Mapping[str, Any], every_knob: bool) -> str:
    under = constraints_text(spec, none="")
    ok = f"ok: meets {under}" if under else "ok: completed"
    if every_knob or len(reference) == len(spec.space):
        return ok
    return f"{ok}; knobs without a default are always listed (--all: every knob)"


def feasibility(resolved: StudySpec, trial: Trial) -> str:
    """yes / no for a COMPLETED trial (its constraints as resolved), else empty."""
    if trial.status.value != "COMPLETED":
        return ""
    return "yes" if is_feasible(resolved, trial) else "no"


def trial_rows(spec: StudySpec, trials: Sequence[Trial]) -> tuple[list[str], list[list[Any]]]:
    """Every trial with every metric (mean, and its repeats' standard deviation) and knob:
    the CSV of ``show --format csv`` and ``export``."""
    resolved = with_resolved_constraints(spec, trials)
    metrics = list(spec.metric_names)
    header = ["id", "status", "step", "feasible", "repeats", *metrics,
              *[f"{m}_sd" for m in metrics], *spec.space.names, "reason", "warning"]  # fmt: skip
    rows = [
        [t.id, t.status.value, t.step.value, feasibility(resolved, t),
         t.repeats if t.status.is_final else None, *[t.metrics.get(m) for m in metrics],
         *[t.spread.get(m) for m in metrics], *[t.config.get(k) for k in spec.space.names],
         t.reason, t.warning]
        for t in trials
    ]  # fmt: skip
    return header, rows


def cmd_export(args: argparse.Namespace) -> int:
    """Every trial, for programs: CSV (``pandas.read_csv``), or JSON with the study's spec
    and its measurements."""
    with connect(args.server, args.db) as api:
        spec = api.get_study(args.study).spec
        trials = api.list_trials(args.study)
        measurements = api.list_measurements(args.study) if args.format == "json" else []
    sink = io.StringIO()
    if args.format == "csv":
        write_csv(*trial_rows(spec, trials), sink)
    else:
        document = {
            "study": spec.to_dict(),
            "trials": [trial_dict(t) for t in trials],
            "measurements": [
                {"trial": m.trial_id, "kind": m.kind.value, "round": m.round, "at": m.at,
                 "metrics": m.metrics}
                for m in measurements
            ],
        }  # fmt: skip
        sink.write(json.dumps(document, indent=2) + "\n")
    if args.out is None:
        sys.stdout.write(sink.getvalue())
    else:
        Path(args.out).write_text(sink.getvalue(), encoding="utf-8")
        out.print(f"wrote {len(trials)} trials of {args.study} to {args.out}", highlight=False)
    return 0


def cmd_front(args: argparse.Namespace) -> int:
    with connect(args.server, args.db) as api:
        spec = api.get_study(args.study).spec
        front = api.get_pareto_front(args.study)
    if output_format(args) == "json":
        print(json.dumps([trial_dict(t) for t in front], indent=2))
    elif output_format(args) == "csv":
        write_csv(*trial_rows(spec, front))
    elif not front:
        out.print(f"study {args.study} has no feasible trial yet")
    else:
        print_front(spec, front)
        if not spec.multi_objective:  # the front of one objective is its best measurement
            out.print(
                f"one objective: the front is the best measured trial; the study's best "
                f"(confirmed, or by the model): tuner best {args.study}",
                highlight=False,
            )
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    """The study's best as every command names it (``cli.verdict``): its metrics as the
    session measured them, then the verdict and what it changes from the default."""
    with connect(args.server, args.db) as api:
        spec = api.get_study(args.study).spec
        trials = api.list_trials(args.study)
        measurements = api.list_measurements(args.study)
        best = reported_best(api, args.study, spec, trials, measurements)
    if best.trial is None:
        raise NotFoundError(f"study {args.study!r} has no feasible completed trial yet")
    if output_format(args) == "csv":
        write_csv(*trial_rows(spec, [best.trial]))
        return 0
    if output_format(args) == "json":
        found = trial_dict(best.trial)
        found["basis"] = best.basis.value
        found["verdict"] = headline(spec, best, trials)[0]
        if best.confirmation is not None:
            found["confirmation"] = confirmation_headline(best.confirmation)
        print(json.dumps(found, indent=2))
        return 0
    print_metrics(spec, best.trial, trials)
    print_verdict(spec, best, trials)
    return 0


def cmd_measurements(args: argparse.Namespace) -> int:
    kinds = [MeasurementKind(k) for k in args.kind] if args.kind else None
    with connect(args.server, args.db) as api:
        found = api.list_measurements(args.study, args.trial, kinds)
    rows = [
        {"trial": m.trial_id, "kind": m.kind.value, "round": m.round, "at": m.at,
         "metrics": m.metrics}
        for m in found
    ]  # fmt: skip
    names = sorted({k for m in found for k in m.metrics})
    if output_format(args) == "json":
        print(json.dumps(rows, indent=2))
        return 0
    if output_format(args) == "csv":
        write_csv(["trial", "kind", "round", "at", *names],
                  [[r["trial"], r["kind"], r["round"], r["at"],
                    *[r["metrics"].get(n) for n in names]] for r in rows])  # fmt: skip
        return 0
    table = Table("trial", "kind", "round", "at", *names)
    for m in found:
        at = datetime.fromtimestamp(m.at, UTC).strftime("%H:%M:%S")
        table.add_row(str(m.trial_id), m.kind.value, str(m.round or ""), at,
                      *(fmt(m.metrics.get(n)) for n in names))  # fmt: skip
    out.print(table)
    return 0


def cmd_importance(args: argparse.Namespace) -> int:
    with connect(args.server, args.db) as api:
        spec = api.get_study(args.study).spec
        trials = api.list_trials(args.study)
    from tuner.designer.models.importance import importance  # torch: only for this command

    found = importance(spec, trials, args.metric, samples=args.samples)
    metric = args.metric or spec.objective.name
    rows = [[k.knob, k.total, k.total_se, k.first, k.first_se] for k in found]
    header = ["knob", "total", "total_se", "first", "first_se"]
    if output_format(args) == "csv":
        write_csv(header, rows)
        return 0
    if output_format(args) == "json":
        knobs = [dict(zip(header, r, strict=True)) for r in rows]
        print(json.dumps({"study": args.study, "metric": metric, "knobs": knobs}, indent=2))
        return 0
    table = Table(
        "knob", "total", "", "first (alone)",
        caption=f"share of the variance of the model's {metric!r} (Sobol indices of the GP's "
        "mean over the search space; ± a bootstrap standard error). total: with "
        "interactions; near 0: the knob can stay at its default",
    )  # fmt: skip
    for k in found:
        bar = "█" * round(20 * k.total)
        table.add_row(
            escape(k.knob), f"{k.total:.2f} ± {k.total_se:.2f}", bar,
            f"{k.first:.2f} ± {k.first_se:.2f}",
        )  # fmt: skip
    out.print(table)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """The plot the session wrote (``cli.plot.plot_convergence``, the one function both
    call): trials, controls, the best and its confirmed interval, from what is stored."""
    with connect(args.server, args.db) as api:
        spec = api.get_study(args.study).spec
        trials = api.list_trials(args.study)
        measurements = api.list_measurements(args.study)
        best = None if spec.multi_objective else reported_best(
            api, args.study, spec, trials, measurements
        )  # fmt: skip
    from cli.plot import plot_convergence  # matplotlib: only for this command

    path = plot_convergence(spec, trials, args.out or f"{args.study}.png", measurements, best)
    out.print(f"wrote {path}")
    return 0
