"""Convergence plots: what a study found, trial by trial, as a PNG.

Each measured trial is a dot (feasible) or a cross (it violated an outcome constraint);
configurations that broke the system (INFEASIBLE, TIMED_OUT) are marked on the bottom edge,
and a trial stopped early is a hollow grey circle at what the part it ran measured.
The line is the best feasible value so far, and the dashed line the default configuration.
A trial measured several times shows its mean with a bar of plus or minus one standard
deviation of its repeats; the default's controls (re-measured between trials) are grey
diamonds, so a machine that drifted is visible; the study's best (``cli.verdict``: the
one ``tuner best`` names) is ringed and named in the legend, and with a confirmation its
confirmed value is drawn at the right: the default's confirmed mean times the ratio, with
its 95 % interval. ``tuner tune`` and ``tuner plot`` draw it with this one function from
the stored trials and measurements, so they draw the same plot.

A study with several objectives gets a trade-off plot instead: every measured trial at its
first two objectives, coloured by trial id, with the Pareto front as a staircase and the
default configuration marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from cli.render import confirmed, constraints_text
from tuner.confirmation import Best
from tuner.study import Goal, StudySpec
from tuner.trial import (
    Measurement,
    MeasurementKind,
    StepKind,
    Trial,
    TrialStatus,
    best_so_far,
    is_feasible,
    pareto_front,
    with_resolved_constraints,
)


def plot_convergence(
    spec: StudySpec,
    trials: list[Trial],
    path: str | Path,
    measurements: Sequence[Measurement] = (),
    best: Best | None = None,
) -> Path:
    """Write the study's convergence plot to ``path`` (PNG) and return the path.

    Args:
        measurements: The study's stored measurements (the controls are drawn).
        best: The study's best (``cli.verdict.reported_best``), ringed; its confirmation,
            when it has one, drawn with its interval.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    spec = with_resolved_constraints(spec, trials)
    if spec.multi_objective:
        return plot_front(spec, trials, path)
    name = spec.objective.name
    trials = sorted(trials, key=lambda t: t.id)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    try:
        _draw_points(ax, spec, trials, name)
        so_far = best_so_far(spec, trials)
        xs = [t.id for t, b in zip(trials, so_far, strict=True) if b is not None]
        ys = [b for b in so_far if b is not None]
        if xs:
            ax.step(xs, ys, where="post", color="tab:green", lw=2, label="best feasible so far")
        default = next(
            (t for t in trials if t.step is StepKind.DEFAULT and name in t.metrics), None
        )
        if default is not None:
            ax.axhline(default.metrics[name], color="grey", ls="--", lw=1, label="default config")
        _draw_controls(ax, trials, measurements, name)
        if best is not None:
            _draw_best(ax, spec, trials, best, name)
        constraints = constraints_text(spec, none="none")
        ax.set_title(
            f"{spec.name}: {spec.objective.goal.value} {name} (constraints: {constraints})"
        )
        ax.set_xlabel("trial")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path


def plot_front(spec: StudySpec, trials: list[Trial], path: Path) -> Path:
    """The trade-off plot of a multi-objective study (first two objectives) at ``path``."""
    first, second = spec.objectives[0], spec.objectives[1]
    measured = [
        t for t in sorted(trials, key=lambda t: t.id)
        if t.status is TrialStatus.COMPLETED and first.name in t.metrics
        and second.name in t.metrics
    ]  # fmt: skip
    fig, ax = plt.subplots(figsize=(7, 5.5), dpi=110)
    try:
        ok = [t for t in measured if is_feasible(spec, t)]
        bad = [t for t in measured if not is_feasible(spec, t)]
        if ok:
            dots = ax.scatter(
                [t.metrics[first.name] for t in ok],
                [t.metrics[second.name] for t in ok],
                c=[t.id for t in ok],
                cmap="viridis",
                s=20,
                zorder=3,
                label="feasible trial",
            )
            fig.colorbar(dots, ax=ax, label="trial")
        if bad:
            ax.scatter(
                [t.metrics[first.name] for t in bad],
                [t.metrics[second.name] for t in bad],
                marker="x",
                color="tab:orange",
                s=22,
                label="violates a constraint",
            )
        front = sorted(
            (t.metrics[first.name], t.metrics[second.name]) for t in pareto_front(spec, trials)
        )
        if front:
            xs, ys = [x for x, _ in front], [y for _, y in front]
            # between two front points the attainable value of the second objective is the
            # left point's when the first is minimized, the right point's when maximized
            where: Literal["pre", "post"] = "pre" if first.goal is Goal.MAXIMIZE else "post"
            ax.step(xs, ys, where=where, color="tab:red", lw=1.5, label="Pareto front")
            ax.scatter(xs, ys, s=60, facecolors="none", edgecolors="tab:red", zorder=4)
        default = next((t for t in measured if t.step is StepKind.DEFAULT), None)
        if default is not None:
            ax.scatter(
                [default.metrics[first.name]],
                [default.metrics[second.name]],
                marker="*",
                s=160,
                color="black",
                zorder=5,
                label="default config",
            )
        more = f"; {len(spec.objectives) - 2} more objectives not shown" if len(
            spec.objectives) > 2 else ""  # fmt: skip
        ax.set_title(f"{spec.name}: {first.goal.value} {first.name}, "
                     f"{second.goal.value} {second.name}{more}", fontsize=10)  # fmt: skip
        ax.set_xlabel(first.name)
        ax.set_ylabel(second.name)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path


def _draw_best(ax: plt.Axes, spec: StudySpec, trials: list[Trial], best: Best, name: str) -> None:
    """The study's best ringed at its trial, and its confirmed value and interval at the
    right of the trials, when the confirmation has one."""
    trial = best.trial
    if trial is not None and name in trial.metrics:
        how = "confirmed" if not best.unconfirmed else f"by {best.basis.value}, unconfirmed"
        ax.scatter([trial.id], [trial.metrics[name]], s=140, facecolors="none",
                   edgecolors="tab:green", linewidths=2, zorder=4,
                   label=f"best: trial {trial.id} ({how})")  # fmt: skip
    in_units = confirmed(spec, best.confirmation)
    if in_units is not None and trial is not None:
        value, low, high = in_units
        x = max(t.id for t in trials) + 2
        ax.errorbar([x], [value], yerr=[[value - low], [high - value]], fmt="D",
                    color="tab:green", capsize=4,
                    label=f"trial {trial.id} confirmed (95 % CI)")  # fmt: skip


def _draw_controls(
    ax: plt.Axes, trials: list[Trial], measurements: Sequence[Measurement], name: str
) -> None:
    """The default's controls, each after the last trial finished before it."""
    controls = [m for m in measurements if m.kind is MeasurementKind.CONTROL and name in m.metrics]
    if not controls:
        return
    xs = [
        max((t.id for t in trials if t.updated_at and t.updated_at <= m.at), default=0) + 0.5
        for m in controls
    ]
    ax.scatter(xs, [m.metrics[name] for m in controls], marker="d", s=24, color="grey",
               label="default re-measured (control)", zorder=2)  # fmt: skip


def _draw_points(ax: plt.Axes, spec: StudySpec, trials: list[Trial], name: str) -> None:
    measured = [t for t in trials if t.status is TrialStatus.COMPLETED and name in t.metrics]
    ok = [t for t in measured if is_feasible(spec, t)]
    bad = [t for t in measured if not is_feasible(spec, t)]
    if ok:
        ax.scatter(
            [t.id for t in ok],
            [t.metrics[name] for t in ok],
            s=18,
            color="tab:blue",
            label="feasible trial",
            zorder=3,
        )
    spread = [t for t in measured if t.repeats > 1 and name in t.spread]
    if spread:
        ax.errorbar(
            [t.id for t in spread],
            [t.metrics[name] for t in spread],
            yerr=[t.spread[name] for t in spread],
            fmt="none",
            ecolor="tab:blue",
            alpha=0.5,
            capsize=2,
            label="± std of a trial's repeats",
        )
    if bad:
        ax.scatter(
            [t.id for t in bad],
            [t.metrics[name] for t in bad],
            s=22,
            color="tab:orange",
            marker="x",
            label="violates a constraint",
            zorder=3,
        )
    stopped = [t for t in trials if t.status is TrialStatus.EARLY_STOPPED and name in t.metrics]
    if stopped:
        ax.scatter(
            [t.id for t in stopped],
            [t.metrics[name] for t in stopped],
            s=22,
            facecolors="none",
            edgecolors="grey",
            label="stopped early (what it measured)",
            zorder=3,
        )
    broken = [t for t in trials if t.status in (TrialStatus.INFEASIBLE, TrialStatus.TIMED_OUT)]
    if broken:
        ax.scatter(
            [t.id for t in broken],
            [0.0] * len(broken),
            transform=ax.get_xaxis_transform(),
            marker="v",
            color="tab:red",
            s=30,
            clip_on=False,
            label="config broke the system",
        )
