"""What a session's answer costs in measured time: the shipped protocol against the same
protocol with early stopping, on real SQLite and real PostgreSQL, quiet and under load.

``python -m bench.cost [--system sqlite|postgres] [--seeds 5] [--levels quiet,moderate]
[--arms full,stop] [--trials N] [--measure-s S] [--redeploy 10] [--out DIR] [--markdown]``

For every seed and load level (``bench.noise``'s: ``quiet``, and ``moderate`` with
``targets.host.interference`` beside it), in one run and under the same load:

1. each arm is one ``tuner tune`` session, as a user runs it, on the system's example study
   (``examples/sqlite.toml``, ``examples/postgres.toml``) with the shipped measurement
   protocol (``runner.measurement.DEFAULT_PROTOCOL``: one measurement a trial, a control
   every 5 trials, 2 selection rounds among the 3 best and 5 fresh rounds of the chosen one
   against the default): ``full`` measures every trial for its whole window; ``stop`` sets
   ``[study.stopping] early_stop = true`` (``tuner.stopping``: a trial whose windows show,
   at 99 %, that it cannot beat the best trial or meet a constraint ends there). The arms
   run in alternating order from seed to seed (``full`` first on even seeds), so a drift
   of the machine touches both alike;
2. **redeploy**: a fresh target (another database or cluster, built from another seed)
   measures the default and each arm's confirmed best in ``--redeploy`` interleaved rounds;
   each one's gain is its paired ratio to the default with a 95 % interval.

Per session: the wall-clock seconds of ``tuner tune``, the **measured seconds** (what the
target ran: every run's warm-up, the windows each trial measured before it ended, and the
whole window of every control and confirmation run, from the session's database), the
trials stopped early, and the gain it confirmed (1.0 when it kept the default). Per level
the summary gives, over seeds, the mean measured seconds of each arm and the paired ratio
``full / stop`` with a 95 % interval (goal: at least 2), and the paired ratio of the
redeployed gains ``stop / full`` (goal: within 5 % of 1). Cells are appended to
``DIR/cells.json`` as they finish, so a long run resumes where it stopped; ``DIR/cost.png``
plots measured seconds against redeployed gain.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import console, show
from bench.noise import (
    System,
    keep,
    load,
    pending,
    redeploy,
    resolve_session,
    saved_cells,
    session_arguments,
    stored,
    tune,
    write_config,
)
from targets.registry import build_target
from tuner.quantiles import t_ppf
from tuner.trial import TrialStatus

#: The sessions a cell can run: the shipped protocol; the same with early stopping; and
#: with early stopping and a screen after 3 of the 10 windows that lets a third go on.
ARMS: dict[str, dict[str, Any]] = {
    "full": {},
    "stop": {"early_stop": True},
    "screen": {"early_stop": True, "screen_windows": 3},
}
#: The targets' windows per measurement (their ``windows`` option's default).
WINDOWS = 10


def window_seconds(system: str, measure_s: float) -> float:
    """How long one window of a measurement runs: SQLite splits its measured seconds into
    ``WINDOWS`` equal intervals; PostgreSQL's pgbench reports progress every whole
    ``max(1, measure_s // WINDOWS)`` seconds (the target rounds ``measure_s``)."""
    if system == "postgres":
        return float(max(1, max(1, round(measure_s)) // WINDOWS))
    return measure_s / WINDOWS


def measured_seconds(
    db: Path, study: str, warmup_s: float, measure_s: float, window_s: float
) -> float:
    """What the target ran for a session (module doc), from its database: every run's
    warm-up; for a trial that reported windows (PROGRESS measurements), ``window_s`` a
    window (at most its whole window a repeat), else its whole window a repeat; the whole
    window of each control and confirmation run (they report no windows)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        (sid,) = conn.execute("SELECT id FROM studies WHERE name = ?", [study]).fetchone()
        rows = conn.execute(
            "SELECT trial_id, kind, COUNT(*) FROM measurements WHERE study_id = ? "
            "GROUP BY trial_id, kind",
            [sid],
        ).fetchall()
    per: dict[int, dict[str, int]] = {}
    for trial_id, kind, count in rows:
        per.setdefault(trial_id, {})[kind] = count
    total = 0.0
    for counts in per.values():
        whole = counts.get("control", 0) + counts.get("confirm", 0)
        repeats = counts.get("repeat", 0)
        windows = counts.get("progress", 0)
        trial_s = min(windows * window_s, repeats * measure_s) if windows else repeats * measure_s
        total += (repeats + whole) * warmup_s + trial_s + whole * measure_s
    return total


def run_arm(arm: str, seed: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One ``tuner tune`` session of ``arm`` (module doc)."""
    config = write_config(seed, args, work, arm, ARMS[arm])
    started = time.time()
    tune(config, "--trials", str(args.trials))
    wall = time.time() - started
    found = json.loads((work / f"{arm}-confirm.json").read_text())
    trials, runs, confirming = stored(work / "tuner.db", arm)
    keeps_default = found["best_trial"] is None or not found["significant"]
    return {
        "wall_s": wall,
        "measured_s": measured_seconds(
            work / "tuner.db",
            arm,
            args.warmup_s,
            args.measure_s,
            window_seconds(args.system.name, args.measure_s),
        ),
        "runs": runs,
        "confirm_runs": confirming,
        "stopped": sum(t.status is TrialStatus.EARLY_STOPPED for t in trials),
        "stopped_by": stop_kinds(work / "tuner.db", arm),
        "trials": len(trials),
        "reported": 1.0 if keeps_default else found["ratio"],
        "interval": found["interval"],
        "best": {} if keeps_default else found["best_config"],
        "keeps_default": keeps_default,
    }


def stop_kinds(db: Path, study: str) -> dict[str, int]:
    """How many trials each rule stopped, from their reasons (``tuner.stopping``): the
    objective (``cannot beat``), a constraint (``cannot meet``) or the screen."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        reasons = [r for (r,) in conn.execute(
            "SELECT t.reason FROM trials t JOIN studies s ON s.id = t.study_id "
            "WHERE s.name = ? AND t.status = 'EARLY_STOPPED'", [study])]  # fmt: skip
    kinds = {"objective": "cannot beat", "constraint": "cannot meet", "screen": "screened out"}
    return {kind: sum(text in r for r in reasons) for kind, text in kinds.items()}


def run_cell(level: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One seed at one load level: every arm (in reversed order on odd seeds), then the
    redeploy."""
    started = time.time()
    order = list(args.arms) if seed % 2 == 0 else list(args.arms)[::-1]
    with tempfile.TemporaryDirectory(prefix="cost-") as tmp, load(level, Path(tmp)):
        base = Path(tmp)
        base.chmod(0o755)  # a PostgreSQL cluster run by another OS user (as root) enters it
        sessions: dict[str, dict[str, Any]] = {}
        for arm in order:
            (base / arm).mkdir()
            sessions[arm] = run_arm(arm, seed, args, base / arm)
        (base / "fresh").mkdir()
        system: System = args.system
        options = system.options(args, seed + 1000, base / "fresh")
        with build_target(system.name, options) as fresh:
            configs = {arm: got["best"] for arm, got in sessions.items()}
            again = redeploy(system, fresh, configs, args.redeploy)
    return {"system": system.name, "level": level, "seed": seed, "order": order,
            **sessions, "redeploy": again, "seconds": time.time() - started}  # fmt: skip


def paired_ratio(pairs: Sequence[tuple[float, float]]) -> tuple[float, float, float] | None:
    """The geometric mean of ``a / b`` over pairs with a 95 % t interval: (mean, low, high);
    None with fewer than two pairs."""
    logs = [math.log(a / b) for a, b in pairs if a > 0 and b > 0]
    if len(logs) < 2:
        return None
    centre = statistics.fmean(logs)
    half = t_ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


def trial_seconds(session: Mapping[str, Any], warmup_s: float, measure_s: float) -> float:
    """The part of a session's measured seconds its trials took: the controls and the
    confirmation's runs (whole windows, which no rule shortens) set aside. Every trial is
    taken to have stored one repeat (the shipped protocol; a trial that broke at apply has
    none, and then this overstates the controls by its share)."""
    whole = session["runs"] - session["trials"]
    return float(session["measured_s"] - whole * (warmup_s + measure_s))


def summarize(
    cells: Sequence[dict[str, Any]],
    arms: Sequence[str],
    warmup_s: float = 0.0,
    measure_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Per level and arm after the first: the means of both, and the paired ratios of the
    arm against ``arms[0]`` (module doc); with the sessions' ``warmup_s`` and ``measure_s``
    also the ratio of the trials' part of the measured time (``trial_seconds``)."""
    rows = []
    base = arms[0]
    for level in dict.fromkeys(c["level"] for c in cells):
        for other in arms[1:]:
            ran = [c for c in cells if c["level"] == level and base in c and other in c]
            if not ran:
                continue
            row: dict[str, Any] = {"level": level, "seeds": len(ran), "arm": other}
            for arm in (base, other):
                gains = [c["redeploy"][arm]["gain"] for c in ran if c["redeploy"][arm]["gain"]]
                row[arm] = {
                    "measured_s": statistics.fmean(c[arm]["measured_s"] for c in ran),
                    "wall_s": statistics.fmean(c[arm]["wall_s"] for c in ran),
                    "stopped": statistics.fmean(c[arm]["stopped"] for c in ran),
                    "reported": statistics.fmean(c[arm]["reported"] for c in ran),
                    "redeployed": statistics.fmean(gains) if gains else None,
                }
            row["time_ratio"] = paired_ratio(
                [(c[base]["measured_s"], c[other]["measured_s"]) for c in ran]
            )
            row["wall_ratio"] = paired_ratio([(c[base]["wall_s"], c[other]["wall_s"]) for c in ran])
            row["trial_ratio"] = (
                paired_ratio(
                    [
                        (
                            trial_seconds(c[base], warmup_s, measure_s),
                            trial_seconds(c[other], warmup_s, measure_s),
                        )
                        for c in ran
                    ]
                )
                if measure_s
                else None
            )
            row["gain_ratio"] = paired_ratio(
                [
                    (c["redeploy"][other]["gain"], c["redeploy"][base]["gain"])
                    for c in ran
                    if c["redeploy"][other]["gain"] and c["redeploy"][base]["gain"]
                ]
            )
            rows.append(row)
    return rows


def table(rows: Sequence[dict[str, Any]], base: str) -> Table:
    out = Table(title=f"measured time and redeployed gain against {base}")
    names = ("level", "arm", "seeds", f"{base} measured s", "arm measured s",
             f"{base}/arm time (95 %)", f"{base}/arm trials' time", f"{base}/arm wall",
             "stopped a session",
             f"{base} redeployed", "arm redeployed", f"arm/{base} redeployed (95 %)")  # fmt: skip
    for name in names:
        out.add_column(name, justify="left" if name in ("level", "arm") else "right")
    for r in rows:
        other = r["arm"]
        out.add_row(
            r["level"], other, str(r["seeds"]), f"{r[base]['measured_s']:.0f}",
            f"{r[other]['measured_s']:.0f}", _ratio(r["time_ratio"]),
            _ratio(r.get("trial_ratio")), _ratio(r["wall_ratio"]),
            f"{r[other]['stopped']:.1f}", _gain(r[base]["redeployed"]),
            _gain(r[other]["redeployed"]), _ratio(r["gain_ratio"], 3),
        )  # fmt: skip
    return out


def plot(cells: Sequence[dict[str, Any]], arms: Sequence[str], path: Path, title: str) -> None:
    """Measured seconds against redeployed gain, one point per session, by arm and level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        markers = {"quiet": "o", "moderate": "^"}
        for arm, colour in zip(arms, ("tab:blue", "tab:orange", "tab:green"), strict=False):
            for level, marker in markers.items():
                ran = [c for c in cells if c["level"] == level and arm in c]
                points = [(c[arm]["measured_s"], c["redeploy"][arm]["gain"]) for c in ran
                          if c["redeploy"][arm]["gain"]]  # fmt: skip
                if points:
                    ax.scatter(*zip(*points, strict=True), color=colour, marker=marker,
                               label=f"{arm}, {level}")  # fmt: skip
        ax.set_xlabel("measured seconds until the confirmed answer")
        ax.set_ylabel("redeployed gain over the default (x)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cost", description=__doc__.split("\n")[0]
    )
    session_arguments(parser, seeds=5)
    parser.add_argument(
        "--arms", default="full,stop,screen",
        help=f"comma-separated, the base first (of {', '.join(ARMS)})",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="default bench/results/cost/SYSTEM")
    args = parser.parse_args(argv)
    levels = resolve_session(parser, args, "cost")
    system: System = args.system
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if (
        len(args.arms) < 2
        or len(set(args.arms)) != len(args.arms)
        or not set(args.arms) <= set(ARMS)
    ):
        parser.error(f"--arms: two or more different arms of {', '.join(ARMS)} (got {args.arms})")
    path, saved = saved_cells(args)
    for seed, level in pending(saved, args, levels):
        order = args.arms if seed % 2 == 0 else args.arms[::-1]
        console.print(f"[bold]seed {seed}, {level}[/]: {' then '.join(order)}")
        cell = run_cell(level, seed, args)
        keep(path, saved, cell)
        console.print("  " + "; ".join(
            f"{arm}: {cell[arm]['measured_s']:.0f} s measured "
            f"({cell[arm]['wall_s']:.0f} s wall), "
            f"{cell[arm]['stopped']} stopped, reported {cell[arm]['reported']:.2f}x, "
            f"redeployed {_gain(cell['redeploy'][arm]['gain'])}"
            for arm in args.arms
        ), highlight=False)  # fmt: skip
    rows = summarize(saved["cells"], args.arms, args.warmup_s, args.measure_s)
    show(table(rows, args.arms[0]), args.markdown)
    plot(saved["cells"], args.arms, args.out / "cost.png",
         f"{system.name}: measured time and redeployed gain")  # fmt: skip
    console.print(f"cells: {path}; plot: {args.out / 'cost.png'}")
    return 0


def _ratio(found: tuple[float, float, float] | None, digits: int = 2) -> str:
    if found is None:
        return "-"
    return f"{found[0]:.{digits}f} ({found[1]:.{digits}f}-{found[2]:.{digits}f})"


def _gain(gain: float | None) -> str:
    return "-" if gain is None else f"{gain:.2f}x"


if __name__ == "__main__":
    raise SystemExit(main())
