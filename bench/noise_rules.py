"""Which confirmation settles a real gain? ``bench.noise``'s real sessions, each study
confirmed by today's fixed 3 and 5 rounds and by the sequential rule, on the same search.

``python -m bench.noise_rules [--system sqlite|postgres] [--workload develop|report]
[--seeds 5] [--levels quiet,moderate] [--trials N] [--measure-s S] [--pg-scale 50]
[--redeploy 10] [--out DIR] [--markdown]``

``python -m bench.noise_rules --decide DIR [DIR ...]`` reads the cells of finished runs
and applies the rule written in ``bench/NOTES.md`` before the first run (``decide``): on
develop's SQLite and PostgreSQL cells it chose the defaults; on the report cells it says
whether that choice holds on data nobody chose it on.

For every load level (``bench.noise``'s ``quiet`` and ``moderate``) and seed, under the load:

1. **search**: ``tuner tune --confirm 0`` (a subprocess, as a user runs it) on the system's
   example study with the shipped protocol but no closing confirmation. ``--workload``
   picks the workload, chosen before the first run (``bench/NOTES.md``, issue 61):
   ``develop`` is the example's (SQLite: 30 % writes; PostgreSQL: pgbench TPC-B-like),
   ``report`` a read-mostly one (SQLite: 5 % writes; PostgreSQL: pgbench ``-S``).
2. **confirmations**: the finished study is confirmed by ``runner.confirm.confirm_session``
   (what ``tuner tune``, ``tuner confirm`` and the daemon call) once per rule, on one
   target, in an order that rotates from seed to seed, nothing stored, so each rule sees
   the same study and the same candidates:

   - ``fixed5``: today's protocol, 2 selection rounds among the 3 best and 5 fresh rounds
     of the chosen one against the default, a t interval;
   - ``fixed3``: the same with 3 rounds: the first 3 of ``fixed5``'s estimate rounds,
     judged alone (a fixed-3 confirmation measures exactly those, in the same ABBA order);
   - ``sequential``: ``[study.stopping] confirm = "sequential"``: the same 5 rounds, then
     one at a time until its confidence sequence excludes 1, is narrower than
     ``confirm_width``, or ``confirm_share`` of the search's time is spent;
   - ``noise``: ``sequential`` with ``[session] confirm_window = "noise"`` (each round's
     window chosen from the noise the search measured).

   Each says whether it claims a gain beyond noise (its interval wholly above 1), the
   ratio and interval, its rounds, why it stopped, and its seconds.
3. **redeploy**: a fresh target (built from another seed) measures the default, each
   rule's chosen candidate (the one its rounds estimated, claimed or not) and the user's
   recipe (``bench.noise``) in ``--redeploy`` interleaved rounds: each one's paired gain
   over the default with its 95 % interval.

Per level and rule the summary gives: **found**, among sessions whose chosen candidate
redeploys at 1.1x or more (a real gain to find), the share the rule claimed (goal >= 80 %);
**held**, among claims, the share whose interval holds the redeployed gain (goal >= 90 %);
**false**, among claims, the share whose candidate redeploys at 1.0x or less (goal <= 5 %);
and the rounds and seconds the confirmation took. Cells are appended to ``DIR/cells.json``
as they finish (a long run resumes where it stopped); ``DIR/rules.png`` plots each claim's
interval against its redeployed gain.
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
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import console, show
from bench.noise import (
    LEVELS,
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
from runner.config import load_config
from runner.confirm import RoundWindow, confirm_session
from runner.measurement import MeasurementProtocol
from runner.session import summarize
from targets.registry import build_target
from tuner.confirmation import Confirmation, judge, machine_noise, with_selection
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind

#: The rules in the table's order; ``fixed3`` is read from ``fixed5``'s rounds.
RULES = ("fixed3", "fixed5", "sequential", "noise")
#: The confirmations that run (``fixed3`` is ``fixed5``'s first rounds).
RUN = ("fixed5", "sequential", "noise")
FIXED_SHORT = 3
#: The runs of the search (a trial's windows in progress are parts of one run).
SEARCH = (MeasurementKind.REPEAT, MeasurementKind.CONTROL)
REAL_GAIN = 1.1  # a chosen candidate redeployed at this or more: a gain worth finding
#: The target options of each workload that differ from the system's example.
WORKLOADS: dict[str, dict[str, dict[str, Any]]] = {
    "develop": {"sqlite": {}, "postgres": {}},
    "report": {"sqlite": {"write_fraction": 0.05}, "postgres": {"workload": "select-only"}},
}


def settings(rule: str, spec: StudySpec, protocol: MeasurementProtocol
             ) -> tuple[StudySpec, MeasurementProtocol]:  # fmt: skip
    """The study and protocol that confirm by ``rule``: the protocol's selection, 5 rounds
    and its limits, the rule's stopping and round window."""
    sequential = rule in ("sequential", "noise")
    stopping = replace(spec.stopping, confirm="sequential" if sequential else "fixed")
    spec = replace(spec, stopping=stopping)
    protocol = replace(
        protocol, confirm=5, confirm_max=0 if not sequential else protocol.confirm_max,
        confirm_window="noise" if rule == "noise" else "trials",
    )  # fmt: skip
    return spec, protocol


def first_rounds(
    spec: StudySpec, found: Confirmation, rounds: int, noise: Mapping[str, tuple[float, int]]
) -> Confirmation:
    """``found`` (a fixed confirmation) judged on its estimate's first ``rounds`` rounds
    only: what a confirmation of ``rounds`` rounds would have said."""
    cut = tuple(replace(m, rounds=m.rounds[:rounds], feasible=m.feasible[:rounds])
                for m in found.measured)  # fmt: skip
    has_default = bool(cut) and cut[0].trial.step is StepKind.DEFAULT
    again = judge(spec, cut, has_default, noise)
    if not found.selection:
        return again
    chose = judge(spec, found.selection, True, noise, choosing=True)
    return with_selection(again, chose, found.selection)


def verdict(found: Confirmation, seconds: float) -> dict[str, Any]:
    """What a confirmation told the user, and the candidate its rounds estimated."""
    interval = found.interval
    chosen = found.best.trial if found.best is not None else None
    if chosen is None and len(found.measured) > 1:  # estimated, not feasible in every round
        chosen = found.measured[1].trial
    claims = found.significant
    return {
        "claims": claims,
        "ratio": None if interval is None else interval.ratio,
        "interval": None if interval is None else [interval.low, interval.high],
        "rounds": found.rounds,
        "stopped": found.stopped,
        "seconds": seconds,
        "chosen": None if chosen is None else chosen.config,
        "chosen_trial": None if chosen is None else chosen.id,
        "best": chosen.config if claims and chosen is not None else {},
    }


def read_measurements(db: Path, study: str) -> list[Measurement]:
    """The study's stored measurements, read straight from its database file."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        (sid,) = conn.execute("SELECT id FROM studies WHERE name = ?", [study]).fetchone()
        rows = conn.execute(
            "SELECT trial_id, kind, round, at, metrics_json FROM measurements "
            "WHERE study_id = ? ORDER BY id",
            [sid],
        ).fetchall()
    return [Measurement(json.loads(m), MeasurementKind(k), float(at), int(r), int(t))
            for t, k, r, at, m in rows]  # fmt: skip


def confirmations(config_path: Path, name: str, order: Sequence[str]) -> dict[str, Any]:
    """Every rule's confirmation of the finished study ``name`` (module doc, step 2)."""
    config = load_config(config_path, {})
    db = config.db
    trials, _, _ = stored(db, name)
    measurements = read_measurements(db, name)
    # the search's seconds, as the session times them for ``confirm_share``: from the first
    # run's end to the last's, and one run's mean length more for the first run
    ends = [m.at for m in measurements if m.kind in SEARCH and m.at]
    tuned_s = (max(ends) - min(ends)) * len(ends) / (len(ends) - 1) if len(ends) > 1 else 0.0
    out: dict[str, Any] = {"tuned_s": tuned_s}
    with config.target as target:
        # one ranking (the GP's) for every rule: each confirms the same candidates
        searched = summarize(config.spec, trials, measurements, target.noiseless)
        for rule in order:
            spec, protocol = settings(rule, searched.spec, config.protocol)
            result = replace(searched, spec=spec)
            stamps: list[tuple[int, float]] = []
            started = time.monotonic()

            def stamp(_: int, measurement: Measurement) -> None:
                stamps.append((measurement.round, time.monotonic() - started))  # noqa: B023

            windows: list[RoundWindow] = []
            found = confirm_session(target, result, protocol, stamp, tuned_s=tuned_s,
                                    announce=windows.append)  # fmt: skip
            out[rule] = verdict(found, time.monotonic() - started)
            out[rule]["window"] = windows[0].factor if windows else 1.0
            if rule == "fixed5":
                select = protocol.confirm_select if found.selection else 0
                default = None if result.default is None else result.default.id
                noise = machine_noise(result.spec, measurements, default)
                short = first_rounds(result.spec, found, FIXED_SHORT, noise or {})
                until = max((s for r, s in stamps if r <= select + FIXED_SHORT), default=0.0)
                out["fixed3"] = {**verdict(short, until), "window": out[rule]["window"]}
    return out


def run_cell(level: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One seed at one load level: the search, every rule's confirmation, the redeploy."""
    started = time.time()
    shift = seed % len(RUN)
    order = list(RUN[shift:] + RUN[:shift])
    system: System = args.system
    with tempfile.TemporaryDirectory(prefix="rules-") as tmp, load(level, Path(tmp)):
        base = Path(tmp)
        base.chmod(0o755)  # a PostgreSQL cluster run by another OS user (as root) enters it
        (base / "search").mkdir()
        (base / "fresh").mkdir()
        config = write_config(seed, args, base / "search", "study", target=args.workload_options)
        first = time.time()
        tune(config, "--trials", str(args.trials), "--confirm", "0")
        search_s = time.time() - first
        rules = confirmations(config, "study", order)
        options = {**system.options(args, seed + 1000, base / "fresh"), **args.workload_options}
        configs: dict[str, Any] = {}
        for rule in RULES:  # each distinct chosen candidate once
            chosen = rules[rule]["chosen"]
            if chosen is not None and chosen not in configs.values():
                configs[rule] = chosen
        with build_target(system.name, options) as fresh:
            recipe, notes = system.recipe(fresh)
            again = redeploy(system, fresh, {**configs, "recipe": recipe}, args.redeploy)
        again["recipe"]["notes"] = notes
    for rule in RULES:  # the redeploy of the rule whose candidate was measured
        same = next((r for r, c in configs.items() if c == rules[rule]["chosen"]), None)
        rules[rule]["redeployed"] = None if same is None else again[same]
    return {
        "system": system.name, "workload": args.workload, "level": level, "seed": seed,
        "order": order, "search_s": search_s, **rules,
        "redeploy": {"default_feasible_share": again["default_feasible_share"],
                     "recipe": again["recipe"]},
        "seconds": time.time() - started,
    }  # fmt: skip


def redeployed(got: Mapping[str, Any]) -> float | None:
    """The redeployed gain of a rule's chosen candidate (None: none, or no ratio)."""
    again = got.get("redeployed")
    return None if not again else again.get("gain")


def summarize_rules(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level and rule: found, held, false (module doc), rounds and seconds."""
    rows = []
    for level in LEVELS:
        mine = [c for c in cells if c["level"] == level]
        for rule in RULES:
            got = [c[rule] for c in mine if rule in c]
            if got:
                rows.append({"level": level, "rule": rule, **tally(got)})
    return rows


def tally(got: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One rule's confirmations: sessions, claims, real gains (chosen candidates redeployed
    at ``REAL_GAIN`` or more), found, held and false as (share, hits, of), and the rounds
    and seconds (means; ``median_s`` the median)."""
    real = [g for g in got if (r := redeployed(g)) is not None and r >= REAL_GAIN]
    claims = [g for g in got if g["claims"] and redeployed(g) is not None]
    held = [g["interval"][0] <= redeployed(g) <= g["interval"][1] for g in claims]  # type: ignore[operator]
    return {
        "sessions": len(got), "claims": sum(g["claims"] for g in got), "real": len(real),
        "found": _share([g["claims"] for g in real]),
        "held": _share(held),
        "false": _share([redeployed(g) <= 1.0 for g in claims]),  # type: ignore[operator]
        "rounds": statistics.fmean(g["rounds"] for g in got),
        "seconds": statistics.fmean(g["seconds"] for g in got),
        "median_s": statistics.median(g["seconds"] for g in got),
    }  # fmt: skip


def _share(flags: Sequence[bool]) -> tuple[float, int, int]:
    """(share, hits, of); NaN share for none."""
    hits = sum(flags)
    return (hits / len(flags) if flags else math.nan, hits, len(flags))


def table(rows: Sequence[dict[str, Any]]) -> Table:
    out = Table(title="confirmation rules on the same studies: claims against the redeployed gain")
    for name in ("level", "rule", "sessions", "claims", "found (>= 80 %)", "held (>= 90 %)",
                 "false (<= 5 %)", "rounds", "seconds"):  # fmt: skip
        out.add_column(name, justify="left" if name in ("level", "rule") else "right")

    for r in rows:
        out.add_row(r["level"], r["rule"], str(r["sessions"]), str(r["claims"]),
                    _shown(r["found"]), _shown(r["held"]), _shown(r["false"]),
                    f"{r['rounds']:.1f}", f"{r['seconds']:.0f}")  # fmt: skip
    return out


#: The decision's limits (NOTES, issue 61): false claims at most, held intervals at least,
#: and the noise window's time at most this multiple of the sequential rule's (the median
#: over sessions of the two rules' times on the same session).
FALSE_MOST, HELD_LEAST, NOISE_TIME_MOST = 0.05, 0.90, 1.5


def decide(cells: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The rule written before the first run, over every cell given (both systems, both
    levels): ``confirm = "sequential"`` becomes the default if it finds at least as many real
    gains as ``fixed5`` with false <= 5 % and held >= 90 %; ``confirm_window = "noise"``
    with it if, within the same limits, it finds at least as many as ``sequential`` and its
    time over ``sequential``'s on the same session is at most 1.5 at the median. Per rule
    the totals, and the verdicts said with their numbers. No claims at all: no false claim
    and no interval missed.

    The time is compared per session, not as a median of each rule's pooled times: cells of
    two systems whose confirmations take 25 s and 300 s have a pooled median that lands
    between the systems, on whichever cells sit at the boundary (NOTES, session 77)."""
    totals = [{"rule": rule, **tally(got),
               "vs_sequential": paired_slowdown(cells, rule, "sequential")}
              for rule in RULES if (got := [c[rule] for c in cells if rule in c])]  # fmt: skip
    by = {t["rule"]: t for t in totals}
    if not {"fixed5", "sequential", "noise"} <= by.keys():
        return totals, ["no decision: the cells lack fixed5, sequential or noise"]

    def limits(t: Mapping[str, Any]) -> list[str]:
        wrong = []
        if not math.isnan(t["false"][0]) and t["false"][0] > FALSE_MOST:
            wrong.append(f"false {t['false'][0]:.0%} > {FALSE_MOST:.0%}")
        if not math.isnan(t["held"][0]) and t["held"][0] < HELD_LEAST:
            wrong.append(f"held {t['held'][0]:.0%} < {HELD_LEAST:.0%}")
        return wrong

    def answer(wrong: Sequence[str]) -> str:
        return "no (" + "; ".join(wrong) + ")" if wrong else "yes"

    seq, noise = by["sequential"], by["noise"]
    found = {rule: t["found"][1] for rule, t in by.items()}  # real gains claimed
    fewer = found["sequential"] < found["fixed5"]
    wrong = [f"found {found['sequential']} < fixed5's {found['fixed5']}"] if fewer else []
    wrong += limits(seq)
    said = [
        f'confirm = "sequential" default: {answer(wrong)}'
        f" (found {found['sequential']} vs fixed5 {found['fixed5']}, of {seq['real']} real gains)"
    ]
    if wrong:
        return totals, [
            *said,
            'confirm_window = "noise": not considered (sequential is not default)',
        ]
    slow = noise["vs_sequential"]
    fewer = found["noise"] < found["sequential"]
    wrong = [f"found {found['noise']} < sequential's {found['sequential']}"] if fewer else []
    wrong += limits(noise)
    if slow > NOISE_TIME_MOST:
        wrong.append(f"median time {slow:.2f}x sequential's > {NOISE_TIME_MOST}x")
    said.append(
        f'confirm_window = "noise" default: {answer(wrong)}'
        f" (found {found['noise']}, median time {slow:.2f}x sequential's)"
    )
    return totals, said


def paired_slowdown(cells: Sequence[Mapping[str, Any]], rule: str, base: str) -> float:
    """The median over the cells that ran both of ``rule``'s confirmation time over
    ``base``'s on the same session (inf where ``base`` took no time)."""
    ratios = [c[rule]["seconds"] / c[base]["seconds"] if c[base]["seconds"] > 0 else math.inf
              for c in cells if rule in c and base in c]  # fmt: skip
    return statistics.median(ratios) if ratios else math.nan


def decision_table(totals: Sequence[dict[str, Any]]) -> Table:
    """The decision's totals. "median s" pools every session's time (systems far apart land
    wherever they meet: descriptive only); "time / sequential" is what the time test reads,
    the median over sessions of the rule's time over the sequential rule's on that session."""
    out = Table(title="over every cell given: the decision rule's totals")
    for name in ("rule", "sessions", "claims", "real gains", "found", "held (>= 90 %)",
                 "false (<= 5 %)", "median s", "time / sequential"):  # fmt: skip
        out.add_column(name, justify="left" if name == "rule" else "right")
    for t in totals:
        ratio = t.get("vs_sequential", math.nan)
        shown = "-" if math.isnan(ratio) else f"{ratio:.2f}x"
        out.add_row(t["rule"], str(t["sessions"]), str(t["claims"]), str(t["real"]),
                    str(t["found"][1]), _shown(t["held"]), _shown(t["false"]),
                    f"{t['median_s']:.0f}", shown)  # fmt: skip
    return out


def _shown(found: tuple[float, int, int]) -> str:
    value, hits, of = found
    return "-" if math.isnan(value) else f"{value:.0%} ({hits}/{of})"


def plot(cells: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """One panel a rule: each session's interval (claims solid, others faint) against the
    gain its candidate redeployed at."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(RULES), figsize=(3.2 * len(RULES), 3.6), dpi=110,
                             sharex=True, sharey=True)  # fmt: skip
    shown = [(cell, rule, cell[rule]) for rule in RULES for cell in cells
             if redeployed(cell.get(rule) or {}) is not None
             and cell[rule].get("interval") is not None]  # fmt: skip
    # The frame fits the data (SQLite's 3x gains and PostgreSQL's 1.1x ones both readable)
    # and always shows 1; a sequence with no upper bound yet runs to the frame's top.
    values = [1.0]
    for _, _, got in shown:
        values += [v for v in (redeployed(got), got["ratio"], *got["interval"]) if math.isfinite(v)]
    low_frame, high_frame = min(values) / 1.1, max(values) * 1.1
    try:
        for ax, rule in zip(axes, RULES, strict=True):
            for cell, _, got in (one for one in shown if one[1] == rule):
                again = redeployed(got)
                low, high = got["interval"]
                if not math.isfinite(high):
                    high = high_frame
                color = "tab:blue" if cell["level"] == "quiet" else "tab:orange"
                alpha = 1.0 if got["claims"] else 0.3
                ax.plot([again, again], [low, high], color=color, alpha=alpha, lw=2)
                ax.plot([again], [got["ratio"]], "o", color=color, alpha=alpha, ms=3)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.axvline(1.0, color="grey", lw=0.8)
            ax.plot([low_frame, high_frame], [low_frame, high_frame], color="grey", lw=0.8,
                    ls=":")  # fmt: skip
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(low_frame, high_frame)
            ax.set_ylim(low_frame, high_frame)
            ax.set_title(rule)
            ax.set_xlabel("redeployed gain")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("confirmed ratio and interval")
        fig.suptitle(f"{title} (blue quiet, orange loaded; faint: no claim)")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.noise_rules", description=__doc__.split("\n")[0]
    )
    session_arguments(parser, seeds=5)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="develop")
    parser.add_argument(
        "--out", type=Path, help="default bench/results/noise-rules/SYSTEM-WORKLOAD"
    )
    parser.add_argument(
        "--decide",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="apply the defaults' rule to these runs' cells; runs nothing",
    )
    args = parser.parse_args(argv)
    if args.decide:
        cells = [
            c for d in args.decide for c in json.loads((d / "cells.json").read_text())["cells"]
        ]
        totals, said = decide(cells)
        show(decision_table(totals), args.markdown)
        for line in said:
            console.print(line, highlight=False)
        return 0
    out = args.out
    levels = resolve_session(parser, args, "noise-rules")
    system: System = args.system
    if out is None:
        args.out = args.out.with_name(f"{system.name}-{args.workload}")
    args.workload_options = WORKLOADS[args.workload][system.name]
    path, saved = saved_cells(args)
    for seed, level in pending(saved, args, levels):
        console.print(f"[bold]seed {seed}, {level}[/]: search, confirmations, redeploy")
        cell = run_cell(level, seed, args)
        keep(path, saved, cell)
        console.print("  " + "; ".join(_line(cell, rule) for rule in RULES)
                      + f"; {cell['seconds']:.0f} s", highlight=False)  # fmt: skip
    show(table(summarize_rules(saved["cells"])), args.markdown)
    plot(saved["cells"], args.out / "rules.png", f"{system.name} ({args.workload})")
    console.print(f"cells: {path}; plot: {args.out / 'rules.png'}")
    return 0


def _line(cell: Mapping[str, Any], rule: str) -> str:
    got = cell[rule]
    ratio = "-" if got["ratio"] is None else f"{got['ratio']:.2f}x"
    again = redeployed(got)
    shown = "-" if again is None else f"{again:.2f}x"
    claim = "claims" if got["claims"] else "no claim"
    return f"{rule}: {claim} {ratio} in {got['rounds']} rounds, redeployed {shown}"


if __name__ == "__main__":
    raise SystemExit(main())
