"""``tuner studies``, ``show``, ``best``, ``front``, ``measurements`` and ``plot``: reading
results back.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

from rich.table import Table

from cli.common import connect, out
from cli.render import fmt, interval_dict, mean_and_spread, print_front, print_trial, trial_dict
from tuner.confirmation import stored_confirmation
from tuner.trial import (
    MeasurementKind,
    StepKind,
)


def cmd_studies(args: argparse.Namespace) -> int:
    with connect(args.server, args.db) as api:
        infos = api.list_studies()
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
    if args.json:
        print(
            json.dumps(
                {"study": spec.to_dict(), "trials": [trial_dict(t) for t in trials]}, indent=2
            )
        )
        return 0
    metrics = list(spec.metric_names)
    table = Table("id", "status", "source", "n", *metrics, *spec.space.names, "reason")
    for t in trials:
        table.add_row(
            str(t.id),
            t.status.value,
            t.source,
            str(t.repeats) if t.status.is_final else "-",
            *[mean_and_spread(t, m) for m in metrics],
            *[fmt(t.config[k]) for k in spec.space.names],
            t.reason[:60],
        )
    out.print(table)
    return 0


def cmd_front(args: argparse.Namespace) -> int:
    with connect(args.server, args.db) as api:
        spec = api.get_study(args.study).spec
        front = api.get_pareto_front(args.study)
    if args.json:
        print(json.dumps([trial_dict(t) for t in front], indent=2))
    elif not front:
        out.print(f"study {args.study} has no feasible trial yet")
    else:
        print_front(spec, front)
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    with connect(args.server, args.db) as api:
        trial = api.get_best_trial(args.study)
        measurements = api.list_measurements(args.study)
        confirmation = None
        if any(m.kind is MeasurementKind.CONFIRM for m in measurements):
            spec = api.get_study(args.study).spec
            trials = api.list_trials(args.study)
            confirmation = stored_confirmation(spec, trials, measurements)
    if args.json:
        found = trial_dict(trial)
        if confirmation is not None:
            found["confirmation"] = {
                "best_trial": confirmation.best.trial.id if confirmation.best else None,
                "interval": interval_dict(confirmation.interval),
                "significant": confirmation.significant,
                "rounds": confirmation.best.repeats if confirmation.best else 0,
            }
        print(json.dumps(found, indent=2))
        return 0
    print_trial(f"best trial of {args.study}", trial)
    if confirmation is None:
        out.print("(not confirmed: the study has no confirmation rounds)")
    elif confirmation.best is None:
        kept = "the default" if trial.step is StepKind.DEFAULT else "the one feasible most often"
        out.print(
            f"not confirmed: no candidate was feasible and stable in every round; kept {kept}"
        )
    elif confirmation.interval is not None:
        verdict = "confirmed" if confirmation.significant else "not beyond noise"
        out.print(
            f"{verdict}: trial {confirmation.best.trial.id} is {confirmation.interval} the "
            f"default, {confirmation.best.repeats} interleaved repeats each",
            highlight=False,
        )
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
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    names = sorted({k for m in found for k in m.metrics})
    table = Table("trial", "kind", "round", "at", *names)
    for m in found:
        at = datetime.fromtimestamp(m.at, UTC).strftime("%H:%M:%S")
        table.add_row(str(m.trial_id), m.kind.value, str(m.round or ""), at,
                      *(fmt(m.metrics.get(n)) for n in names))  # fmt: skip
    out.print(table)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    with connect(args.server, args.db) as api:
        spec = api.get_study(args.study).spec
        trials = api.list_trials(args.study)
    from cli.plot import plot_convergence  # matplotlib: only for this command

    path = plot_convergence(spec, trials, args.out or f"{args.study}.png")
    out.print(f"wrote {path}")
    return 0
