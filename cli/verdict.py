"""The one answer: a study's best, how it was chosen, and what it changes from the default.

Every command that names a best names the one ``tuner.confirmation.best_of`` decides:
``tuner tune`` at its end, ``tuner best``, ``tuner studies`` (the service's ``GetStudy``),
the dashboard and the plot. ``reported_best`` gets it from whatever the command talks to;
``headline`` says it in one line (the session's last lines, ``tuner best``, the
dashboard's card); ``print_verdict`` prints the headline and the configuration's
differences from the default, which are the last lines of a session.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from cli.common import out
from cli.render import cell, changes, constraints_text, default_config, fmt, unsafe_settings
from tuner.confirmation import Basis, Best, best_of, improvement
from tuner.errors import NotFoundError
from tuner.study import StudySpec
from tuner.trial import Measurement, StepKind, Trial, is_feasible, with_resolved_constraints

#: Rich styles of the headline by its tone.
STYLES = {"good": "bold green", "doubt": "bold yellow", "bad": "bold red", "plain": "bold"}


def reported_best(
    api: Any,
    study: str,
    spec: StudySpec,
    trials: Sequence[Trial],
    measurements: Sequence[Measurement],
) -> Best:
    """The study's best as the service decides it: a local ``TuningService`` answers with
    its ``best`` (the model's ranking stored with the study, ``server.best``); a server
    answers ``GetBestTrial``, whose ranking it made with its model, and the verdict around
    it is rebuilt here from the same stored rounds (``best_of``)."""
    if hasattr(api, "best"):
        return api.best(study)  # type: ignore[no-any-return]
    try:
        served: Trial | None = api.get_best_trial(study)
    except NotFoundError:
        served = None

    def theirs(_: StudySpec, __: Sequence[Trial], among: Sequence[Trial]) -> list[Trial]:
        if served is None:
            return []
        if all(t.id != served.id for t in among):  # stored after these were read
            return [served]
        return sorted(among, key=lambda t: t.id != served.id)  # the server's choice first

    return best_of(spec, trials, measurements, theirs)


def headline(spec: StudySpec, best: Best, trials: Sequence[Trial]) -> tuple[str, str]:
    """The verdict in one line, and its tone (a key of ``STYLES``)."""
    resolved = with_resolved_constraints(spec, trials)
    trial, found = best.trial, best.confirmation
    if trial is None:
        return f"no feasible configuration found under {constraints_text(resolved)}", "bad"
    if best.basis is Basis.CONFIRMATION and found is not None:
        return _confirmed(resolved, best, trials)
    default = next((t for t in trials if t.step is StepKind.DEFAULT), None)
    is_default = default is not None and trial.id == default.id
    others = [t for t in trials if t.id != trial.id and is_feasible(resolved, t)]
    if is_default and not others:
        return f"keep the default: no other trial met {constraints_text(resolved)}", "doubt"
    under = constraints_text(resolved, none="")
    under = f" under {under}" if under else ""  # the bounds the best was judged by
    if is_default:
        return (
            f"keep the default: trial {trial.id}, the default configuration, is the best "
            f"{_basis_words(best.basis)}{under} ({_unconfirmed(best)})",
            "doubt",
        )
    name = spec.objective.name
    ratio = improvement(resolved, default, trial)
    against = "" if ratio is None else f", {ratio:.2f}x the default ({_samples(trial, default)})"
    return (
        f"best {_basis_words(best.basis)}{under}: trial {trial.id}, {name} "
        f"{_value(trial, name)}{against}; {_unconfirmed(best)}",
        "plain" if best.basis is Basis.MEASURED else "doubt",
    )


def print_verdict(spec: StudySpec, best: Best, trials: Sequence[Trial]) -> None:
    """The headline, then what the chosen configuration changes from the default."""
    text, tone = headline(spec, best, trials)
    out.print(f"[{STYLES[tone]}]{escape(text)}[/]", highlight=False)
    if best.trial is not None:
        print_changes(spec, best.trial, trials)


def print_changes(spec: StudySpec, trial: Trial, trials: Sequence[Trial]) -> None:
    """The knobs ``trial`` sets differently from the default (default, its value, unit),
    how many it keeps, and the unsafe values it uses."""
    reference = default_config(spec, trials)
    changed = changes(trial.config, reference, spec.space)
    unused = sorted(spec.space.inactive(trial.config))
    if changed:
        units = {k.name: k.unit for k in spec.space.knobs}
        table = Table("knob", "default", f"trial {trial.id}", "unit",
                      title=f"what trial {trial.id} changes from the default")  # fmt: skip
        for name, value in changed.items():
            table.add_row(escape(name), cell(reference.get(name)), cell(value), units.get(name, ""))
        out.print(table)
    kept = len(trial.config) - len(changed) - len(unused)
    same = f"{kept} other knob{'' if kept == 1 else 's'} as in the default"
    out.print(
        ("the default configuration" if not changed else same)
        + ("" if reference else " (the study has no measured default or knob defaults)")
        + (f"; unused in this configuration: {', '.join(unused)}" if unused else ""),
        highlight=False,
    )
    unsafe = unsafe_settings(spec, trial.config)
    if unsafe:
        out.print(
            f"[yellow]trial {trial.id} uses unsafe values: {', '.join(unsafe)}[/] "
            "(study.allow_unsafe = true; see the knob catalog for what each risks)",
            highlight=False,
        )


# -- private --------------------------------------------------------------------------------
def _confirmed(spec: StudySpec, best: Best, trials: Sequence[Trial]) -> tuple[str, str]:
    """The headline of a confirmed study (``best.confirmation`` is set)."""
    found, trial = best.confirmation, best.trial
    assert found is not None and trial is not None
    chosen, default, interval = found.best, found.default, found.interval
    candidates = {m.trial.id for m in (*found.measured, *found.selection)} - {trial.id}
    if chosen is None and default is not None and trial.id == default.trial.id and not candidates:
        return f"keep the default: no other trial met {constraints_text(spec)}", "doubt"
    if chosen is None:
        kept = "keep the default" if default is not None and trial.id == default.trial.id else (
            f"kept trial {trial.id}, feasible in the most rounds"
        )  # fmt: skip
        return f"not confirmed: no candidate was feasible and stable in every round; {kept}", "bad"
    rounds = f"{chosen.repeats} interleaved repeats each"
    if found.stopped:  # a sequential confirmation: how many rounds it took, and why
        rounds += f" (sequential: stopped as {found.stopped})"
    if default is not None and not found.default_feasible:
        met, total = found.default_rounds()
        ratio = "" if interval is None else f"; {spec.objective.name} {interval} the default's"
        return (
            f"confirmed: trial {trial.id} meets {constraints_text(spec)} in every round, the "
            f"default in {met} of {total}{ratio}",
            "good",
        )
    if interval is None:
        mean = chosen.mean
        return (
            f"best by confirmed mean: trial {trial.id}, {spec.objective.name} "
            f"{fmt(mean)} over {chosen.repeats} rounds (the confirmation ran no default to "
            "compare with: the study does not start with it)",
            "plain",
        )
    if trial.id != chosen.trial.id:  # measured worse than the default beyond noise
        return (
            f"not confirmed: the best candidate, trial {chosen.trial.id}, is {interval} the "
            f"default, {rounds}: worse beyond noise; keep the default",
            "bad",
        )
    if found.significant:
        return f"confirmed: trial {trial.id} is {interval} the default, {rounds}", "good"
    return (
        f"not beyond noise: trial {trial.id} is {interval} the default, {rounds}; the best "
        "candidate, but not measurably better than the default",
        "doubt",
    )


def _basis_words(basis: Basis) -> str:
    return {
        Basis.MEASURED: "measured value",
        Basis.SCREENED: "by measured value, the model's outliers set aside",
        Basis.TRIAL_MEANS: "by trial means",
        Basis.CONFIRMATION: "confirmed",
    }[basis]


def _unconfirmed(best: Best) -> str:
    if best.basis is Basis.MEASURED:
        return "the study's repeated measurements agree exactly: it has no noise to confirm against"
    if best.basis is Basis.TRIAL_MEANS:
        return (
            "unconfirmed: the study has no confirmation rounds, and no model ranked its latest "
            "results (a session or a server sets the model's outliers aside when "
            "it stores them)"
        )
    return "unconfirmed: the study has no confirmation rounds"


def _samples(trial: Trial, default: Trial | None) -> str:
    """What a ratio of two trials' metrics stands on."""
    counts = {trial.repeats, default.repeats if default is not None else 1}
    return "single samples" if counts == {1} else "trial means"


def _value(trial: Trial, name: str) -> str:
    value = fmt(trial.metrics.get(name))
    return (
        f"{value} (single sample)" if trial.repeats == 1 else f"{value} (mean of {trial.repeats})"
    )
