"""Rendering results for people and scripts: session summaries, confirmations, Pareto fronts
and trials as rich tables or JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from cli.common import out
from tuner.space import SearchSpace, value_key
from tuner.study import Goal, StudySpec
from tuner.trial import (
    StepKind,
    Trial,
    best_trial,
    dominates,
    is_feasible,
    pareto_front,
)

if TYPE_CHECKING:  # the session's machinery is not needed to print its results
    from runner.session import SessionResult
    from tuner.confirmation import Confirmation, Remeasured
    from tuner.measurement_stats import RatioInterval


def print_confirmation(spec: StudySpec, confirmation: Confirmation) -> None:
    """The confirmation's rounds as tables: the selection's (when it ran), then the
    estimate's, and, when the default broke a constraint in some round, each one's means.
    The verdict is the session's last line (``cli.verdict.print_verdict``)."""
    default = confirmation.default
    if confirmation.selection:
        rounds = confirmation.selection[0].repeats
        measured = confirmation.measured
        chosen = measured[1].trial.id if len(measured) > 1 else None
        out.print(
            f"selection: {rounds} interleaved rounds of the default and the "
            f"{len(confirmation.selection) - 1} best by the model choose "
            + (f"trial {chosen}" if chosen is not None else "none")
            + "; fresh rounds estimate its ratio",
            highlight=False,
        )
        out.print(confirmation_table(spec, confirmation, confirmation.selection, "selection"))
    out.print(confirmation_table(spec, confirmation, confirmation.measured, "confirmed"))
    best = confirmation.best
    if best is not None and default is not None and not confirmation.default_feasible:
        under = constraints_text(spec)
        met, rounds = confirmation.default_rounds()
        out.print(
            f"[bold yellow]the default breaks {under} in {rounds - met} of {rounds} rounds[/]; "
            f"trial {best.trial.id} meets it in every round",
            highlight=False,
        )
        for label, m in (("default", default), (f"trial {best.trial.id}", best)):
            values = ", ".join(f"{k} {fmt(m.metric_mean(k))}" for k in spec.metric_names)
            out.print(f"  {label}: {values} (means of {m.repeats} rounds)", highlight=False)


def confirmation_table(
    spec: StudySpec, confirmation: Confirmation, rows: Sequence[Remeasured], label: str
) -> Table:
    name = spec.objective.name
    choosing = label == "selection"  # a few rounds: the ratio, not its (wide) interval
    table = Table(
        "trial", "source", f"session {name}", f"{label} {name}",
        "vs default" if choosing else
        "vs default (95 % sequence)" if confirmation.stopped else "vs default (95 % CI)",
        "feasible rounds",
    )  # fmt: skip
    intervals = confirmation.selection_intervals if choosing else confirmation.intervals
    for m in rows:
        found = intervals.get(m.trial.id)
        shown = "-" if found is None else f"{found.ratio:.2f}x" if choosing else str(found)
        note = " unstable" if m.trial.id in confirmation.unstable else ""
        table.add_row(
            str(m.trial.id),
            escape(m.trial.source),
            f"{fmt(m.trial.metrics.get(name))} (n={m.trial.repeats})",
            f"{fmt(m.metric_mean(name))} ± {fmt(m.std)}" if m.std else fmt(m.metric_mean(name)),
            ("1" if m.trial.step is StepKind.DEFAULT else shown) + note,
            f"{sum(m.feasible)}/{m.repeats}",
        )
    return table


def confirmation_dict(confirmation: Confirmation) -> dict[str, Any]:
    interval = confirmation.interval

    def row(m: Remeasured, found: RatioInterval | None) -> dict[str, Any]:
        return {
            "trial": m.trial.id,
            "source": m.trial.source,
            "session": m.trial.metrics,
            "session_repeats": m.trial.repeats,
            "rounds": list(m.rounds),
            "feasible": list(m.feasible),
            "values": list(m.values),
            "repeats": m.repeats,
            "mean": m.mean,
            "std": m.std,
            "not_counted": list(m.reasons),
            "vs_default": interval_dict(found),
            "unstable": m.trial.id in confirmation.unstable,
        }

    best = confirmation.best
    return {
        "measured": [row(m, confirmation.intervals.get(m.trial.id)) for m in confirmation.measured],
        "selection": [
            row(m, confirmation.selection_intervals.get(m.trial.id)) for m in confirmation.selection
        ],
        "best_trial": best.trial.id if best else None,
        "best_config": best.trial.config if best else None,
        "default_feasible": confirmation.default_feasible,
        "sequential": bool(interval is not None and interval.sequential),
        "stopped": confirmation.stopped,
        "ratio": confirmation.ratio,
        "interval": interval_dict(interval),
        "significant": confirmation.significant,
    }


def confirmed(
    spec: StudySpec, confirmation: Confirmation | None
) -> tuple[float, float, float] | None:
    """The confirmation's best in metric units for the plot: the default's confirmed mean
    times the ratio and its interval (divided by them when minimizing)."""
    if confirmation is None or confirmation.interval is None or confirmation.default is None:
        return None
    base = confirmation.default.metric_mean(spec.objective.name)
    if base is None:
        return None
    found = confirmation.interval
    if spec.objective.goal is Goal.MAXIMIZE:
        return base * found.ratio, base * found.low, base * found.high
    return base / found.ratio, base / found.high, base / found.low


def confirmation_headline(confirmation: Confirmation) -> dict[str, Any]:
    """The confirmation's verdict for programs (``tuner best --json``, the dashboard): the
    chosen trial, its ratio's interval, whether it is beyond noise, and its rounds."""
    best = confirmation.best
    return {
        "best_trial": best.trial.id if best else None,
        "interval": interval_dict(confirmation.interval),
        "significant": confirmation.significant,
        "rounds": best.repeats if best else 0,
    }


def interval_dict(interval: RatioInterval | None) -> dict[str, Any] | None:
    if interval is None:
        return None
    return {
        "ratio": interval.ratio, "low": interval.low,
        "high": interval.high if math.isfinite(interval.high) else None,  # None: unbounded
        "level": interval.level, "pairs": interval.n, "sequential": interval.sequential,
    }  # fmt: skip


def standing(spec: StudySpec, trials: list[Trial]) -> str:
    """The progress bar's "best" column: the best value, or the Pareto front's size."""
    if spec.multi_objective:
        front = pareto_front(spec, trials)
        return f"front of {len(front)}" if front else "none feasible"
    best = best_trial(spec, trials)
    return f"{best.metrics[spec.objective.name]:.4g}" if best else "none feasible"


def print_front(spec: StudySpec, front: Sequence[Trial], default: Trial | None = None) -> None:
    """The Pareto front as a table, one row per trial, objectives first; ``*`` marks the
    trials that dominate the default configuration."""
    names = [o.name for o in spec.objectives]
    metrics = [m for m in spec.metric_names if m not in names]
    goals = ", ".join(f"{o.goal.value} {o.name}" for o in spec.objectives)
    table = Table(title=f"Pareto front of {spec.name} ({len(front)} trials; {goals})")
    for column in ("trial", *names, *metrics, *spec.space.names):
        table.add_column(column)
    for t in front:
        mark = "*" if default is not None and dominates(spec, t.metrics, default.metrics) else ""
        table.add_row(
            f"{t.id}{mark}",
            *[fmt(t.metrics.get(m)) for m in (*names, *metrics)],
            *[cell(t.config.get(k)) for k in spec.space.names],
        )
    out.print(table)


def default_config(spec: StudySpec, trials: Sequence[Trial]) -> dict[str, Any]:
    """What each knob is by default: the measured default trial's value, else the knob's
    declared default (knobs with neither are absent)."""
    measured = next((t.config for t in trials if t.step is StepKind.DEFAULT), None)
    if measured is not None:
        return dict(measured)
    return {k.name: k.default for k in spec.space.knobs if k.default is not None}


def default_trial(trials: Sequence[Trial], reference: Mapping[str, Any]) -> Trial | None:
    """The trial that measured the default: the DEFAULT step's, else the first completed
    one whose configuration is the knobs' declared defaults (an imported one, say)."""
    found = next((t for t in trials if t.step is StepKind.DEFAULT), None)
    if found is None and reference:
        found = next(
            (t for t in trials if t.status.value == "COMPLETED"
             and len(reference) == len(t.config) and not changes(t.config, reference)),
            None,
        )  # fmt: skip
    return found


def changes(
    config: Mapping[str, Any], reference: Mapping[str, Any], space: SearchSpace | None = None
) -> dict[str, Any]:
    """The values of ``config`` that differ from ``reference`` (or have none there); with
    ``space``, not those of knobs ``config`` leaves unused (their ``active_when``)."""
    unused = space.inactive(config) if space is not None else frozenset()
    return {
        k: v
        for k, v in config.items()
        if k not in unused and (k not in reference or value_key(reference[k]) != value_key(v))
    }


def print_metrics(spec: StudySpec, trial: Trial, trials: Sequence[Trial]) -> None:
    """``trial``'s metrics beside the default's, as the session measured them (labelled
    single samples when each was measured once: the confirmation, when there is one, is
    what to believe)."""
    default = default_trial(trials, default_config(spec, trials))
    counts = {trial.repeats, default.repeats if default is not None else 1}
    kind = "single samples" if counts == {1} else "trial means"
    column = "default" if default is None else f"default (trial {default.id})"
    table = Table("metric", column, f"trial {trial.id}", f"trial {trial.id} / default",
                  title=f"the session's measurements ({kind})")  # fmt: skip
    for name in spec.metric_names:
        mine = trial.metrics.get(name)
        theirs = default.metrics.get(name) if default is not None else None
        ratio = f"{mine / theirs:.3g}x" if mine is not None and theirs else ""
        table.add_row(name, "-" if default is None else mean_and_spread(default, name),
                      mean_and_spread(trial, name), ratio)  # fmt: skip
    out.print(table)
    if trial.reason:
        out.print(f"reason: {trial.reason}", highlight=False, markup=False)


def print_importance(
    spec: StudySpec, trials: Sequence[Trial], where: str = "", top: int = 5
) -> None:
    """One line: the knobs that move the first objective most in the study's model
    (``tuner.designer.models.importance``), and the command that lists all (``where``: its
    ``--db``/``--server`` option); nothing when there are too few trials for it."""
    from tuner.designer.models.importance import importance
    from tuner.errors import StateError

    try:
        found = importance(spec, trials, samples=512)
    except StateError:
        return
    shown = [k for k in found[:top] if k.total >= 0.01]
    listed = ", ".join(f"{k.knob} {k.total:.2f}" for k in shown) or "none above 0.01"
    out.print(
        f"knobs that move {spec.objective.name} most (share of the model's variance): "
        f"{listed}; all of them: tuner importance {spec.name}{where}",
        highlight=False,
    )


def print_result(result: SessionResult, confirming: bool = False) -> None:
    """What the session measured: the default, what the measurements say about the
    machine, and, when a confirmation follows (``confirming``), the best the session's own
    measurements point to, labelled as such. The study's answer comes last, from
    ``cli.verdict.print_verdict``."""
    spec = result.spec
    if result.default is not None:
        measured = ", ".join(
            f"{k}={mean_and_spread(result.default, k)}" for k in spec.metric_names
            if k in result.default.metrics
        )  # fmt: skip
        out.print(
            f"default configuration: trial {result.default.id} ({result.default.status.value})"
            + (f": {measured}" if measured else ""),
            highlight=False,
        )
    if spec.multi_objective:
        print_multi_result(result)
        return
    print_noise(result)
    under = constraints_text(spec)  # as resolved: a bound relative to the default in numbers
    default_ok = result.default is not None and is_feasible(spec, result.default)
    if result.best is None:
        if default_ok:
            out.print(f"[yellow]only the default is feasible[/] under {under}: no other trial "
                      "met it", highlight=False)  # fmt: skip
        return
    if result.default is not None and not default_ok:
        out.print(
            f"[yellow]the default configuration is not feasible under {under}[/]; "
            "the best is the best feasible configuration found",
            highlight=False,
        )
    if confirming:
        print_session_best(result)
    then = result.relative.get(result.best.id)
    if then and result.drift is not None and result.drift.changed():
        then = then if spec.objective.goal.value == "maximize" else 1 / then
        out.print(
            f"trial {result.best.id} against the default as the machine was then "
            f"(interpolated between the nearest controls): {then:.2f}x",
            highlight=False,
        )


def print_session_best(result: SessionResult) -> None:
    """One line: the session's best other trial by the model, and its ratio to the default
    on the session's own measurements (single samples or trial means, said so), before the
    confirmation measures the candidates again."""
    spec, best, default = result.spec, result.best, result.default
    assert best is not None
    name = spec.objective.name
    samples = "single samples" if {best.repeats, default.repeats if default else 1} == {1} else (
        "trial means"
    )  # fmt: skip
    ratio = result.ratio
    if ratio is not None and ratio < 1 and default is not None and is_feasible(spec, default):
        out.print(
            f"[yellow]no trial beat the default[/] ({name} by {samples}); the best of the "
            f"others, trial {best.id}, is {ratio:.2f}x the default; the confirmation below "
            "measures the best candidates again",
            highlight=False,
        )
        return
    against = "" if ratio is None else f", {ratio:.2f}x the default's"
    if ratio is None:
        samples = "a single sample" if best.repeats == 1 else f"the mean of {best.repeats}"
    out.print(
        f"the session's best by the model: trial {best.id}, {name} "
        f"{mean_and_spread(best, name)}{against} ({samples}, unconfirmed: the confirmation "
        "below measures the best candidates again)",
        highlight=False,
    )


def print_noise(result: SessionResult) -> None:
    """What the repeats and controls say: the machine's drift and unstable trials."""
    drift = result.drift
    if drift is not None and len(drift.values) > 1:
        factors = drift.factors
        low, high = min(factors), max(factors)
        goal = result.spec.objective.goal.value == "maximize"
        at, worst = drift.worst(goal)
        after = max((t.id for t in result.trials if t.updated_at <= at), default=0)
        text = (
            f"the default measured {low:.2f}x to {high:.2f}x of its first measurements over "
            f"{len(factors)} measurements (repeats and controls); most off: {worst:.2f}x "
            f"after trial {after}"
        )
        if drift.changed():
            out.print(f"[bold yellow]the machine drifted:[/] {text}", highlight=False)
        else:
            out.print(f"machine steady: {text}", highlight=False)
    if result.unstable:
        out.print(
            f"[yellow]unstable (repeats disagree beyond the measured noise; never the best): "
            f"trials {', '.join(map(str, result.unstable))}[/]",
            highlight=False,
        )


def unsafe_settings(spec: StudySpec, config: Mapping[str, Any]) -> list[str]:
    """``name = value`` for each value of ``config`` its knob lists as unsafe (a study with
    ``allow_unsafe = true`` can choose them: durability or availability risks)."""
    found = []
    for knob in spec.space.knobs:
        if knob.name in config and any(
            value_key(config[knob.name]) == value_key(v) for v in knob.unsafe_values
        ):
            found.append(f"{knob.name} = {config[knob.name]}")
    return found


def print_multi_result(result: SessionResult) -> None:
    spec, default = result.spec, result.default
    if not result.front:
        out.print("[bold red]no feasible configuration found[/]")
        return
    feasible_default = default if default is not None and is_feasible(spec, default) else None
    print_front(spec, result.front, feasible_default)
    if feasible_default is not None:
        better = sum(dominates(spec, t.metrics, feasible_default.metrics) for t in result.front)
        out.print(
            f"{better} of {len(result.front)} front trials (*) are better than the default in "
            "every objective",
            highlight=False,
        )
    elif default is not None:
        out.print(
            f"[yellow]the default configuration is not feasible under {constraints_text(spec)}[/]"
        )


def short_reason(reason: str, width: int) -> str:
    """A failure reason in at most ``width`` characters. A reason that ends with a program's
    stderr (``exit status 1: Traceback ...``) keeps its first clause and its last line, the
    exception, which says more than the traceback's first line does."""
    lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
    if len(lines) > 1:
        reason = f"{lines[0].split(':', 1)[0]}: ... {lines[-1]}"
    return reason if len(reason) <= width else reason[: width - 3] + "..."


def report_trial(spec: StudySpec, trial: Trial, finished: int, total: int, best: str) -> None:
    """One line per finished trial when the output is not a terminal (a log file, a pipe),
    where the progress bar shows nothing until the session ends."""
    if out.is_terminal:
        return
    values = " ".join(f"{m}={fmt(trial.metrics[m])}" for m in spec.metric_names
                      if m in trial.metrics)  # fmt: skip
    why = f" ({short_reason(trial.reason, 100)})" if trial.reason else ""
    step = trial.step.value
    out.print(
        f"trial {trial.id} [{finished}/{total}] {trial.status.value} {step}: "
        f"{values or '-'}{why}; best {best}",
        highlight=False, soft_wrap=True, markup=False,
    )  # fmt: skip


def mean_and_spread(trial: Trial, name: str) -> str:
    """A metric of a trial: its mean, and ± the repeats' standard deviation when measured
    more than once."""
    spread = trial.spread.get(name)
    text = fmt(trial.metrics.get(name))
    return f"{text} ± {fmt(spread)}" if spread is not None and trial.repeats > 1 else text


def trial_dict(trial: Trial) -> dict[str, Any]:
    return {
        "id": trial.id,
        "status": trial.status.value,
        "config": trial.config,
        "metrics": trial.metrics,
        "repeats": trial.repeats,
        "spread": trial.spread,
        "reason": trial.reason,
        "source": trial.source,
        "client_id": trial.client_id,
        "warning": trial.warning,
        **({"embedded": list(trial.embedded)} if trial.embedded else {}),
        **({"transfer": dict(trial.transfer)} if trial.transfer else {}),
    }


def learned_from(trials: Sequence[Trial]) -> str:
    """What the latest suggestion learned from its transfer sources, for people ("learned
    from: tpcc 0.62, ycsb 0.05; its own trials 0.33"), or "" for a study without them."""
    latest = max((t for t in trials if t.transfer), key=lambda t: t.id, default=None)
    if latest is None:
        return ""
    weights = dict(latest.transfer)
    own = weights.pop("", 0.0)
    sources = ", ".join(
        f"{name} {w:.2f}" for name, w in sorted(weights.items(), key=lambda kv: -kv[1])
    )
    return f"learned from: {sources}; its own trials {own:.2f} (trial {latest.id})"


def constraints_text(spec: StudySpec, none: str = "no constraints") -> str:
    """The study's outcome constraints for people: bounds to 6 significant digits (one
    resolved against the default would print every digit of the default's mean)."""
    return ", ".join(c.text(digits=6) for c in spec.outcome_constraints) or none


def cell(value: object) -> str:
    """``fmt`` for rich (a table cell, a printed line): brackets in a value (a categorical
    choice ``[a]``, a path in a failure reason ``[/tmp]``) are text, not markup."""
    return escape(fmt(value))


def fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
