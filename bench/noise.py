"""Does the gain a session reports hold on a fresh deployment? The measurement protocol against
single samples, on real SQLite and real PostgreSQL, quiet and under interference.

``python -m bench.noise [--system sqlite|postgres] [--seeds 10] [--levels quiet,moderate]
[--trials N] [--measure-s S] [--redeploy 10] [--out DIR] [--markdown]``

For every level of background load (``quiet``: none; ``moderate``: ``targets.host.interference``
with one CPU worker at half duty, 256 MiB of memory churn and 20 MB/s of fsynced writes)
and every seed, in one run and under the same load:

1. **protocol**: ``tuner tune`` (run as a user runs it, a subprocess) on the system's
   example study (``examples/sqlite.toml``: nine PRAGMAs, maximize ops/s under
   ``p95_ms <= 5``; ``examples/postgres.toml``: 111 knobs through a LlamaTune embedding,
   maximize tps under ``p95_ms <= 20``, pgbench TPC-B-like) with its default measurement
   protocol (``runner.measurement.DEFAULT_PROTOCOL``: one measurement per trial, a control
   every 5 trials, 2 interleaved rounds that choose among the 3 best, 5 fresh rounds that
   estimate the chosen one's ratio; cells run before 2026-11-28 used racing repeats); the gain
   it reports is the confirmation's ratio for its best (1.0 when nothing beat the default
   beyond noise: it keeps the default).
2. **single**: ``tuner tune --repeats 1 --max-repeats 0 --control-every 0 --confirm 0``,
   the single-sample session every release before this one ran (each trial measured once,
   best = the largest feasible sample, ratio = best sample / default sample), with as many
   trials as the protocol arm stored measurements, so both spend the same measurement time.
   Results are read straight from each session's database file.
3. **confirm**: single samples (``--max-repeats 1 --control-every 0``) and only the closing
   confirmation; as many trials as leave the protocol arm's measurement count. It asks
   what the honest headline costs without adaptive repeats and controls.
4. **grow** (``--arms protocol,grow``): the protocol whose confirmation runs more rounds,
   one at a time up to ``--grow-to``, while the headline's interval is wider than 1.5x
   (``--confirm-max``).
5. **redeploy**: a fresh target (a new database or cluster, built again from another seed)
   measures the default, each arm's best and what a user would pick instead of tuning for
   ``--redeploy`` interleaved rounds (order alternating); each configuration's gain is its
   paired ratio to the default with a 95 % interval (``tuner.measurement_stats``). For
   SQLite that is the well-known recipe (WAL, ``synchronous=normal``, a 64 MiB cache,
   256 MiB of mmap, ``temp_store=memory``); for PostgreSQL, PGTune's recommendation for this
   machine (``knobs/pgtune.py``: its published rules for an OLTP server on SSD, from the
   machine's cgroup-aware RAM and CPU count, clamped into the catalog's ranges).

Per level and arm the summary gives the sessions that reported no gain (single samples
whose default broke a constraint), and over the others the mean reported and redeployed
gains, the mean (and median) of ``reported / redeployed - 1`` (goal: within 5 %), and the share of
sessions whose reported best loses 30 % or more on redeploy (``redeployed <= 0.7 *
reported``; goal: at most 5 %; TUNA, EuroSys'25, measured up to 63 % without its
protocol). Cells are appended to
``DIR/cells.json`` as they finish, so a long run resumes where it stopped; ``DIR/noise.png``
plots reported against redeployed gains.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import RESULTS_DIR, console, machine_info, show
from knobs import pgtune
from knobs.pgtune import within
from targets.base import Target
from targets.host.facts import ram_bytes
from targets.host.interference import Interference
from targets.registry import build_target
from tuner.constraints import OutcomeConstraint
from tuner.measurement_stats import ratio_interval
from tuner.space import Config
from tuner.trial import StepKind, Trial, TrialStatus

ROOT = Path(__file__).resolve().parents[1]
#: What a SQLite user would set instead of tuning (SQLite's documentation and the common
#: advice: WAL, synchronous=NORMAL, a larger cache, mmap, temporary tables in memory).
SQLITE_RECIPE: Config = {
    "journal_mode": "wal",
    "synchronous": "normal",
    "cache_size": 65536,
    "mmap_size": 268435456,
    "temp_store": "memory",
}


@dataclass(frozen=True)
class System:
    """A real target the benchmark tunes: its example study and what a user would pick."""

    name: str
    example: Path
    objective: str  # maximized
    constraints: tuple[str, ...]
    trials: int  # default --trials
    measure_s: float  # default --measure-s

    def options(self, args: argparse.Namespace, seed: int, work: Path) -> dict[str, Any]:
        """The target's options for ``seed``, its files under ``work``."""
        if self.name == "sqlite":
            return {"db_mb": args.db_mb, "measure_s": args.measure_s,
                    "warmup_s": args.warmup_s, "seed": seed, "workdir": str(work)}  # fmt: skip
        return {"scale": args.pg_scale, "measure_s": max(1, round(args.measure_s)),
                "warmup_s": max(0, round(args.warmup_s)), "seed": seed,
                "workdir": str(work)}  # fmt: skip

    def recipe(self, target: Target) -> tuple[Config, list[str]]:
        """What a user would set instead of tuning, and notes on how it was fitted."""
        if self.name == "sqlite":
            return SQLITE_RECIPE, []
        ram = ram_bytes() or 0
        return within(pgtune.recommend(ram, os.cpu_count() or 1), target.describe_knobs())


SYSTEMS = {
    "sqlite": System("sqlite", ROOT / "examples" / "sqlite.toml", "ops_per_s",
                     ("p95_ms <= 5",), trials=20, measure_s=1.0),
    "postgres": System("postgres", ROOT / "examples" / "postgres.toml", "tps",
                       ("p95_ms <= 20",), trials=15, measure_s=10.0),
}  # fmt: skip
LEVELS: dict[str, dict[str, Any]] = {
    "quiet": {},
    "moderate": {"cpu": 1, "duty": 0.5, "memory_mb": 256, "disk_mb_s": 20.0},
}
LOSS = 0.7  # a redeployed gain at or below 70 % of the reported one loses >= 30 %
#: The sessions a cell can run (``--arms``): the protocol, single samples, single samples +
#: confirmation, and the protocol whose confirmation grows while its interval is wide.
ARMS = ("protocol", "single", "confirm", "grow")


def write_config(
    seed: int,
    args: argparse.Namespace,
    work: Path,
    name: str,
    stopping: Mapping[str, Any] | None = None,
    target: Mapping[str, Any] | None = None,
) -> Path:
    """The system's example config for ``seed``, its files under ``work``; ``stopping``: a
    ``[study.stopping]`` table for it; ``target``: target options over the example's."""
    system: System = args.system
    data = tomllib.loads(system.example.read_text(encoding="utf-8"))
    data["study"]["name"] = name
    data["study"]["designer"]["seed"] = seed
    if stopping:
        data["study"]["stopping"] = dict(stopping)
    data["target"].update(system.options(args, seed, work), **(target or {}))
    data["session"].update(db=str(work / "tuner.db"), plot=str(work / f"{name}.png"))
    path = work / f"{name}.toml"
    path.write_text(to_toml(data), encoding="utf-8")
    return path


def to_toml(data: Mapping[str, Any]) -> str:
    """TOML for a config's nested tables of scalars, lists and inline tables."""

    def value(v: Any) -> str:
        if isinstance(v, Mapping):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)  # strings, numbers and booleans are valid TOML this way

    lines: list[str] = []

    def table(prefix: str, items: Mapping[str, Any]) -> None:
        lines.append(f"[{prefix}]")
        nested = {k: v for k, v in items.items() if isinstance(v, Mapping)}
        lines.extend(f"{k} = {value(v)}" for k, v in items.items() if k not in nested)
        for key, sub in nested.items():
            table(f"{prefix}.{key}", sub)

    for name, items in data.items():
        table(name, items)
    return "\n".join(lines) + "\n"


def tune(config: Path, *flags: str) -> None:
    """``tuner tune CONFIG FLAGS`` as a user runs it (its output goes to a log beside it)."""
    log = config.with_suffix(".log")
    with open(log, "w", encoding="utf-8") as out:
        done = subprocess.run(
            [sys.executable, "-m", "cli.main", "tune", str(config), *flags],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"tuner tune {config} failed: {log.read_text()[-2000:]}")


def stored(db: Path, study: str) -> tuple[list[Trial], int, int]:
    """The study's trials, its number of stored measurements and how many of them the
    confirmation took, read straight from the database file, as a user's script would."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        (sid,) = conn.execute("SELECT id FROM studies WHERE name = ?", [study]).fetchone()
        rows = conn.execute(
            "SELECT trial_id, status, step FROM trials WHERE study_id = ? ORDER BY trial_id",
            [sid],
        ).fetchall()
        configs: dict[int, dict[str, Any]] = {}
        for tid, name, text in conn.execute(
            "SELECT trial_id, name, value_json FROM parameters WHERE study_id = ?", [sid]
        ):
            configs.setdefault(tid, {})[name] = json.loads(text)
        metrics: dict[int, dict[str, float]] = {}
        for tid, name, number in conn.execute(
            "SELECT trial_id, name, value FROM metrics WHERE study_id = ?", [sid]
        ):
            metrics.setdefault(tid, {})[name] = float(number)
        (runs,) = conn.execute(  # windows of a run in progress are parts of one run
            "SELECT COUNT(*) FROM measurements WHERE study_id = ? AND kind != 'progress'", [sid]
        ).fetchone()
        (confirming,) = conn.execute(
            "SELECT COUNT(*) FROM measurements WHERE study_id = ? AND kind = 'confirm'", [sid]
        ).fetchone()
    trials = [
        Trial(tid, configs.get(tid, {}), TrialStatus(status), metrics.get(tid, {}),
              step=StepKind(step))
        for tid, status, step in rows
    ]  # fmt: skip
    return trials, int(runs), int(confirming)


def feasible(system: System, trial: Trial) -> bool:
    """COMPLETED, with the objective, inside the system's constraints."""
    constraints = [OutcomeConstraint.parse(c) for c in system.constraints]
    return (
        trial.status is TrialStatus.COMPLETED
        and system.objective in trial.metrics
        and all(c.metric in trial.metrics and c.satisfied(trial.metrics[c.metric])
                for c in constraints)
    )  # fmt: skip


def confirmed_arm(
    seed: int, args: argparse.Namespace, work: Path, name: str, *flags: str
) -> dict[str, Any]:
    """``tuner tune`` with ``flags``; the gain it reports is the confirmation's ratio, or
    1.0 when it keeps the default (nothing confirmed)."""
    config = write_config(seed, args, work, name)
    tune(config, *flags)
    found = json.loads((work / f"{name}-confirm.json").read_text())
    _, runs, confirming = stored(work / "tuner.db", name)
    keeps_default = found["best_trial"] is None or not found["significant"]
    return {
        "runs": runs,
        "confirm_runs": confirming,
        "reported": 1.0 if keeps_default else found["ratio"],
        "confirmed_ratio": found["ratio"],
        "interval": found["interval"],
        "best": {} if keeps_default else found["best_config"],
        "keeps_default": keeps_default,
    }


def single_arm(seed: int, args: argparse.Namespace, work: Path, runs: int) -> dict[str, Any]:
    """The single-sample session with ``runs`` trials: best = the largest feasible sample,
    gain = best sample / default sample (as every session reported before the protocol);
    no gain (None) when the default's one sample broke a constraint, as those sessions
    printed none."""
    config = write_config(seed, args, work, "single")
    tune(config, "--trials", str(runs), "--repeats", "1", "--max-repeats", "0",
         "--control-every", "0", "--confirm", "0")  # fmt: skip
    trials, measured, _ = stored(work / "tuner.db", "single")
    system: System = args.system
    name = system.objective
    default = next(t for t in trials if t.step is StepKind.DEFAULT)
    ok = [t for t in trials if feasible(system, t)]
    best = max(ok, key=lambda t: t.metrics[name], default=None)
    ratio = None
    if best is not None and feasible(system, default):
        ratio = best.metrics[name] / default.metrics[name]
    return {
        "runs": measured,
        "reported": ratio,
        "best": {} if best is None else best.config,
        "default_feasible": feasible(system, default),
    }


def redeploy(
    system: System, target: Target, configs: dict[str, Config], rounds: int
) -> dict[str, Any]:
    """Interleaved rounds of the default and ``configs`` (each over the knobs' defaults) on
    a fresh target: each one's paired gain over the default with its 95 % interval, and the
    share of its rounds that met the constraints."""
    names = ["default", *configs]
    defaults: Config = {k.name: k.default for k in target.describe_knobs() if k.default is not None}
    values: dict[str, list[float | None]] = {n: [] for n in names}
    met: dict[str, list[bool]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            config = {**defaults, **configs.get(name, {})}
            outcome = target.run_trial(config)
            trial = Trial(0, config, outcome.status, dict(outcome.metrics))
            done = outcome.status is TrialStatus.COMPLETED  # its gain, feasible or not
            values[name].append(trial.metrics.get(system.objective) if done else None)
            met[name].append(feasible(system, trial))
    out: dict[str, Any] = {"default_feasible_share": sum(met["default"]) / rounds}
    for name in configs:
        pairs = [
            (d, c) for d, c in zip(values["default"], values[name], strict=True)
            if d is not None and c is not None and d > 0 and c > 0
        ]  # fmt: skip
        found = ratio_interval([d for d, _ in pairs], [c for _, c in pairs], maximize=True)
        out[name] = {
            "gain": None if found is None else found.ratio,
            "interval": None if found is None else [found.low, found.high],
            "feasible_share": sum(met[name]) / rounds,
        }
    return out


def run_cell(level: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One seed at one load level: every arm, then the redeploy, all under the load."""
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="noise-") as tmp, load(level, Path(tmp)):
        base = Path(tmp)
        base.chmod(0o755)  # a PostgreSQL cluster run by another OS user (as root) enters it
        for sub in (*ARMS, "fresh"):
            (base / sub).mkdir()
        first = time.time()
        protocol = confirmed_arm(
            seed, args, base / "protocol", "protocol", "--trials", str(args.trials)
        )
        protocol["seconds"] = time.time() - first
        sessions = {"protocol": protocol}
        # as many single-sample trials as the protocol's measurements leave beside the
        # confirmation (its cost as the protocol arm paid it)
        trials = max(protocol["runs"] - protocol["confirm_runs"], args.trials)
        runs: dict[str, Callable[[], dict[str, Any]]] = {
            "single": lambda: single_arm(seed, args, base / "single", protocol["runs"]),
            "confirm": lambda: confirmed_arm(
                seed, args, base / "confirm", "confirm", "--trials", str(trials),
                "--repeats", "1", "--max-repeats", "1", "--control-every", "0",
            ),
            "grow": lambda: confirmed_arm(
                seed, args, base / "grow", "grow", "--trials", str(args.trials),
                "--confirm-max", str(args.grow_to),
            ),
        }  # fmt: skip
        for arm in args.arms[1:]:
            first = time.time()
            sessions[arm] = runs[arm]()
            sessions[arm]["seconds"] = time.time() - first
        # a new database (cluster) built from another seed: a fresh deployment
        system: System = args.system
        options = system.options(args, seed + 1000, base / "fresh")
        with build_target(system.name, options) as fresh:
            recipe, notes = system.recipe(fresh)
            configs = {arm: got["best"] for arm, got in sessions.items()}
            again = redeploy(system, fresh, {**configs, "recipe": recipe}, args.redeploy)
            again["recipe"]["notes"] = notes
    return {
        "system": args.system.name,
        "level": level,
        "seed": seed,
        **sessions,
        "redeploy": again,
        "seconds": time.time() - started,
    }


@contextlib.contextmanager
def load(level: str, workdir: Path) -> Iterator[None]:
    settings = LEVELS[level]
    if not settings:
        yield
        return
    with Interference(**settings, workdir=workdir):
        yield


def summarize(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level and arm: reported and redeployed gains, their gap, the share of sessions
    whose reported best lost 30 % or more on redeploy, and the share of confirmed gains
    whose 95 % interval holds the redeployed one (``covered``)."""
    rows = []
    for level in LEVELS:
        mine = [c for c in cells if c["level"] == level]
        if not mine:
            continue
        for arm in ARMS:
            ran = [c for c in mine if arm in c]
            pairs: list[tuple[float, float]] = [
                (gain, c["redeploy"][arm]["gain"]) for c in ran
                if (gain := reported(c, arm)) is not None and c["redeploy"][arm]["gain"] is not None
            ]  # fmt: skip
            if not pairs:
                if ran:  # every session of the arm reported no gain
                    rows.append(_row(
                        level, arm, sessions=0, no_ratio=len(ran),
                        runs=statistics.fmean(c[arm]["runs"] for c in ran),
                    ))  # fmt: skip
                continue
            gaps = [r / g - 1 for r, g in pairs]
            rows.append({
                "level": level, "arm": arm, "sessions": len(pairs),
                "reported": statistics.fmean(r for r, _ in pairs),
                "redeployed": statistics.fmean(g for _, g in pairs),
                "gap": statistics.fmean(gaps), "median_gap": statistics.median(gaps),
                "gap_abs": statistics.fmean(abs(g) for g in gaps), "covered": covered(ran, arm),
                "lost_30": sum(g <= LOSS * r for r, g in pairs) / len(pairs),
                "runs": statistics.fmean(c[arm]["runs"] for c in ran),
                "no_ratio": sum(reported(c, arm) is None for c in ran),
            })  # fmt: skip
        recipe = [c["redeploy"]["recipe"]["gain"] for c in mine]
        recipe = [g for g in recipe if g is not None]
        if recipe:
            rows.append(_row(
                level, "recipe", sessions=len(recipe), no_ratio=0, runs=0.0,
                redeployed=statistics.fmean(recipe),
            ))  # fmt: skip
    return rows


def _row(level: str, arm: str, **known: float) -> dict[str, Any]:
    """A summary row whose figures not in ``known`` are NaN (shown as "-")."""
    unknown = ("reported", "redeployed", "gap", "median_gap", "gap_abs", "covered", "lost_30")
    return {"level": level, "arm": arm, **dict.fromkeys(unknown, math.nan), **known}


def covered(cells: Sequence[dict[str, Any]], arm: str) -> float:
    """Among ``cells`` where ``arm`` confirmed a gain with an interval (it did not keep the
    default), the share whose redeployed gain lies inside that interval; NaN for none."""
    hits = [
        got["interval"]["low"] <= again <= got["interval"]["high"]
        for c in cells
        if isinstance(got := c[arm], dict) and isinstance(got.get("interval"), dict)
        and not got.get("keeps_default", True)
        and (again := c["redeploy"][arm]["gain"]) is not None
    ]  # fmt: skip
    return sum(hits) / len(hits) if hits else math.nan


def reported(cell: dict[str, Any], arm: str) -> float | None:
    """The gain ``arm`` reported in ``cell``: None when it reported none (a single-sample
    session whose default broke a constraint; cells written before that was recorded
    stored 1.0 for it, which no single-sample session reports otherwise)."""
    got = cell[arm]
    if arm == "single" and "default_feasible" not in got and got["reported"] == 1.0:
        return None
    value = got["reported"]
    return None if value is None else float(value)


def table(rows: Sequence[dict[str, Any]]) -> Table:
    out = Table(title="reported gain vs the gain on a fresh deployment (over the default)")
    for name in ("level", "arm", "sessions", "no ratio", "measurements", "reported",
                 "redeployed", "reported/redeployed - 1", "median", "abs gap",
                 "in the interval", "lost >= 30 %"):  # fmt: skip
        out.add_column(name, justify="left" if name in ("level", "arm") else "right")

    def f(value: float, fmt: str) -> str:
        return "-" if math.isnan(value) else format(value, fmt)

    def times(value: float) -> str:
        return "-" if math.isnan(value) else f"{value:.2f}x"

    for r in rows:
        out.add_row(
            r["level"], r["arm"], str(r["sessions"]), str(r["no_ratio"]), f(r["runs"], ".0f"),
            times(r["reported"]), times(r["redeployed"]), f(r["gap"], "+.1%"),
            f(r["median_gap"], "+.1%"), f(r["gap_abs"], ".1%"), f(r["covered"], ".0%"),
            f(r["lost_30"], ".0%"),
        )  # fmt: skip
    return out


def plot(cells: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5), dpi=110)
    try:
        top = 1.0
        for arm, marker in zip(ARMS, ("o", "x", "^", "s"), strict=True):
            for level, color in zip(LEVELS, ("tab:blue", "tab:orange"), strict=True):
                pts = [
                    (reported(c, arm), c["redeploy"][arm]["gain"]) for c in cells
                    if c["level"] == level and arm in c and reported(c, arm) is not None
                    and c["redeploy"][arm]["gain"] is not None
                ]  # fmt: skip
                if pts:
                    ax.scatter(*zip(*pts, strict=True), marker=marker, color=color,
                               label=f"{arm}, {level}")  # fmt: skip
                    top = max(top, *(max(p) for p in pts))
        ax.plot([0, top * 1.05], [0, top * 1.05], color="grey", lw=1, label="redeployed = reported")
        ax.plot([0, top * 1.05], [0, LOSS * top * 1.05], color="grey", lw=1, ls=":",
                label="lost 30 %")  # fmt: skip
        ax.set_xlabel("gain the session reported")
        ax.set_ylabel("gain on a fresh deployment (10 interleaved rounds)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def session_arguments(parser: argparse.ArgumentParser, seeds: int) -> None:
    """The options of a benchmark of real sessions (``bench.noise``, ``bench.cost``): the
    system, seeds, load levels, the session's size and the redeploy."""
    parser.add_argument("--system", choices=sorted(SYSTEMS), default="sqlite")
    parser.add_argument("--seeds", type=int, default=seeds)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--levels", default="quiet,moderate", help="comma-separated levels")
    parser.add_argument("--trials", type=int, help="per session (sqlite 20, postgres 15)")
    parser.add_argument("--measure-s", type=float, help="window (sqlite 1.0, postgres 10)")
    parser.add_argument("--warmup-s", type=float, default=0.3, help="(postgres: rounded)")
    parser.add_argument("--db-mb", type=float, default=16.0, help="sqlite database size")
    parser.add_argument("--pg-scale", type=int, default=2, help="pgbench -s")
    parser.add_argument("--redeploy", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--markdown", action="store_true")


def resolve_session(
    parser: argparse.ArgumentParser, args: argparse.Namespace, results: str
) -> list[str]:
    """Fill the system's defaults into ``args`` (``args.out``: ``bench/results/RESULTS/
    SYSTEM``); the load levels, checked."""
    system = args.system = SYSTEMS[args.system]
    args.trials = args.trials or system.trials
    args.measure_s = args.measure_s or system.measure_s
    args.out = args.out or RESULTS_DIR / results / system.name
    levels = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
    for level in levels:
        if level not in LEVELS:
            parser.error(f"--levels: unknown level {level!r} (allowed: {', '.join(LEVELS)})")
    return levels


def saved_cells(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """``args.out/cells.json`` as saved so far (no cells when new), stamped with this run's
    machine and settings: a benchmark of real sessions resumes where it stopped."""
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "cells.json"
    saved = json.loads(path.read_text()) if path.exists() else {"cells": []}
    saved["machine"] = machine_info()
    saved["settings"] = {
        **{k: v for k, v in vars(args).items() if k not in ("out", "markdown", "system")},
        "system": args.system.name,
    }
    return path, saved


def pending(
    saved: Mapping[str, Any], args: argparse.Namespace, levels: Sequence[str]
) -> Iterator[tuple[int, str]]:
    """The (seed, level) cells still to run, seed-major (a cut run stays balanced)."""
    done = {(c["level"], c["seed"]) for c in saved["cells"]}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for level in levels:
            if (level, seed) not in done:
                yield seed, level


def keep(path: Path, saved: dict[str, Any], cell: dict[str, Any]) -> None:
    """Add a finished cell and write the file at once."""
    saved["cells"].append(cell)
    path.write_text(json.dumps(saved, indent=1, default=str) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.noise", description=__doc__.split("\n")[0]
    )
    session_arguments(parser, seeds=10)
    parser.add_argument(
        "--arms", default="protocol,single,confirm",
        help=f"comma-separated sessions, protocol first (of {', '.join(ARMS)})",
    )  # fmt: skip
    parser.add_argument("--grow-to", type=int, default=10, help="the grow arm's --confirm-max")
    parser.add_argument("--out", type=Path, help="default bench/results/noise/SYSTEM")
    args = parser.parse_args(argv)
    levels = resolve_session(parser, args, "noise")
    system: System = args.system
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for arm in args.arms:
        if arm not in ARMS:
            parser.error(f"--arms: unknown arm {arm!r} (allowed: {', '.join(ARMS)})")
    if args.arms[:1] != ["protocol"] or len(set(args.arms)) != len(args.arms):
        parser.error(f"--arms: protocol first, each arm once (got {','.join(args.arms)})")
    path, saved = saved_cells(args)
    for seed, level in pending(saved, args, levels):
        console.print(f"[bold]seed {seed}, {level}[/]: running every arm and the redeploy")
        cell = run_cell(level, seed, args)
        keep(path, saved, cell)
        arms = "; ".join(
            f"{arm}: reported {_shown(reported(cell, arm))}, redeployed {_gain(cell, arm)}"
            for arm in ARMS
            if arm in cell
        )
        console.print(
            f"  {arms}; recipe {_gain(cell, 'recipe')}; {cell['seconds']:.0f} s",
            highlight=False,
        )
    show(table(summarize(saved["cells"])), args.markdown)
    plot(saved["cells"], args.out / "noise.png", f"{system.name}: reported vs redeployed gains")
    console.print(f"cells: {path}; plot: {args.out / 'noise.png'}")
    return 0


def _shown(gain: float | None) -> str:
    return "no ratio" if gain is None else f"{gain:.2f}x"


def _gain(cell: dict[str, Any], arm: str) -> str:
    gain = cell["redeploy"][arm]["gain"]
    return "-" if gain is None else f"{gain:.2f}x"


if __name__ == "__main__":
    raise SystemExit(main())
