"""Issue 59's daemon measurement: does a drift round that learns from the first round reach
the first round's gain sooner than one that starts afresh?

``python -m bench.daemon_transfer [--seeds 5] [--trials 10] [--rates 40,120]
[--seconds 2] [--windows 3] [--confirm 5] [--out DIR]``

Each run is a real ``tuner daemon examples/daemon_cpu.toml`` (CPU inference, the encoder in
open loop at the rate in a load file; the lowest p99 over the largest batch and torch's
threads; each trial ``--windows`` windows) in a folder of its own, with ``max_rounds = 2``:
round 1 tunes at the first rate for ``--trials`` trials and applies its best; after the
watch baseline the load file gets the second rate, the served rate drifts, and round 2 tunes
at it, with ``[daemon] transfer`` on (``transfer``) or off (``none``). The two arms run one
after the other for each seed, in alternating order (the designer's seed is the run's seed,
the same for both arms).

Scores, from the runs' databases: round 1's gain ``G1`` is its **confirmed** gain: after the
daemon exits, the load file back at the first rate, round 1's default and the configuration
it applied are measured in ``--confirm`` interleaved rounds (``runner.confirm``, the
session's confirmation; ``G1`` = 1 when it applied the default), and ``G1`` is the paired
ratio, oriented so that above 1 is better (``--confirm 0``: its best trial's single
measurement, as in the first run). For round 2, after each of its trials, the gain so far
(round 2's default p99 over its best p99 so far), and the trials it took to reach ``G1``
(``trials + 1``: not reached). The table gives, per arm, the mean trials to reach ``G1``
with a 95 % bootstrap interval over seeds, the paired difference, and round 2's final gain.
Written to ``<out>/runs.jsonl`` as each run ends (a logged seed and arm is not run again)
and ``<out>/table.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, append_record, read_records
from runner.config import load_config
from runner.confirm import confirm
from tuner.trial import StepKind, Trial, TrialStatus

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "daemon_cpu.toml"
OUT = RESULTS_DIR / "daemon-transfer"
ARMS = ("transfer", "none")
BOOTSTRAP = 2000


def config_text(
    folder: Path, seed: int, arm: str, trials: int, seconds: float, windows: int = 1
) -> str:
    """``examples/daemon_cpu.toml`` for one run: its files in ``folder``, its seed and arm,
    ``windows`` windows a trial."""
    text = EXAMPLE.read_text(encoding="utf-8")
    replacements = {
        '"python3"': json.dumps(sys.executable),
        '"runs/cpu-load.txt"': json.dumps(str(folder / "load.txt")),
        '"--seconds", "2"': f'"--seconds", "{seconds}"',
        "seed = 0": f"seed = {seed}",
        "trials = 10 ": f"trials = {trials} ",
        'db = "runs/tuner.db"': f"db = {json.dumps(str(folder / 'tuner.db'))}",
        '"runs/daemon-cpu.daemon.json"': json.dumps(str(folder / "state.json")),
        '"runs/daemon-cpu.log"': json.dumps(str(folder / "events.log")),
        "interval_s = 1.0": "interval_s = 0",
        "windows_per_trial = 1": f"windows_per_trial = {windows}",
    }
    for old, new in replacements.items():
        if old not in text:
            raise ValueError(f"{EXAMPLE.name} changed: {old!r} not found")
        text = text.replace(old, new)
    return text + f"max_rounds = 2\ntransfer = {'true' if arm == 'transfer' else 'false'}\n"


def run_daemon(seed: int, arm: str, trials: int, rates: tuple[float, float], seconds: float,
               windows: int = 1, confirm_rounds: int = 0,
               timeout_s: float = 3600.0) -> dict[str, Any]:  # fmt: skip
    """One daemon run (module doc); its scores and the p99 of every trial of both rounds."""
    with tempfile.TemporaryDirectory(prefix="daemon-transfer-") as name:
        folder = Path(name)
        config = folder / "daemon.toml"
        text = config_text(folder, seed, arm, trials, seconds, windows)
        config.write_text(text, encoding="utf-8")
        (folder / "load.txt").write_text(f"{rates[0]}\n")
        start = time.monotonic()
        errors = (folder / "stderr.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "daemon", str(config)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=errors, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        changed = False
        while proc.poll() is None:
            if time.monotonic() - start > timeout_s:
                proc.kill()
                raise RuntimeError(f"seed {seed} {arm}: the daemon ran past {timeout_s:.0f} s")
            if not changed and "baseline" in _events(folder):
                (folder / "load.txt").write_text(f"{rates[1]}\n")  # the load changes
                changed = True
            time.sleep(0.2)
        errors.close()
        if proc.returncode != 0:
            err = (folder / "stderr.log").read_text()[-2000:]
            raise RuntimeError(f"seed {seed} {arm}: daemon exited {proc.returncode}: {err}")
        exported = [_export(folder, study) for study in ("daemon-cpu.r1", "daemon-cpu.r2")]
        rounds = [_steps(trials) for trials in exported]
        confirmed = None
        if confirm_rounds:
            (folder / "load.txt").write_text(f"{rates[0]}\n")
            confirmed = confirm_round1(config, exported[0], _applied(folder, 1), confirm_rounds)
    score = scores(rounds[0], rounds[1], trials, None if confirmed is None else confirmed[0])
    took = round(time.monotonic() - start, 1)
    return {"seed": seed, "arm": arm, "rates": list(rates), "windows": windows,
            "seconds": took, "round1": rounds[0], "round2": rounds[1],
            "g1_confirmed": confirmed, **score}  # fmt: skip


def confirm_round1(config: Path, trials: Sequence[dict[str, Any]], applied: dict[str, Any],
                   rounds: int) -> tuple[float, float, float]:  # fmt: skip
    """Round 1's applied configuration against its default in ``rounds`` interleaved rounds
    (``runner.confirm``): the paired ratio and its 95 % interval, above 1 better; (1, 1, 1)
    when round 1 applied the default. A confirmation whose rounds failed is an error, not
    a gain of 1."""
    session = load_config(config)
    spec = session.spec
    as_trials = [
        Trial(t["id"], t["config"], TrialStatus.COMPLETED, dict(t["metrics"]),
              step=StepKind.DEFAULT if t["source"] == "default" else StepKind.GLOBAL)
        for t in trials if t["status"] == "COMPLETED"
    ]  # fmt: skip
    default = next(t for t in as_trials if t.step is StepKind.DEFAULT)
    if dict(default.config) == applied:
        return (1.0, 1.0, 1.0)
    best = next(t for t in as_trials if dict(t.config) == applied)
    found = confirm(session.target, spec, [default, best], [best], rounds, top=1)
    interval = found.intervals.get(best.id)
    if interval is None:
        reasons = sorted({r for m in found.measured for r in m.reasons})
        raise RuntimeError(f"round 1's confirmation gave no confirmed ratio: {reasons}")
    return (interval.ratio, interval.low, interval.high)


def scores(round1: Sequence[tuple[str, float | None]], round2: Sequence[tuple[str, float | None]],
           trials: int, g1: float | None = None) -> dict[str, Any]:  # fmt: skip
    """``G1`` (given: confirmed; else round 1's best single measurement), round 2's gain
    after each trial, the trials to reach ``G1`` (module doc)."""
    g1 = _gain(round1) if g1 is None else g1
    curve = [_gain(round2[: k + 1]) for k in range(len(round2))]
    reach = next((k + 1 for k, g in enumerate(curve) if g >= g1), trials + 1)
    return {"g1": g1, "gains2": curve, "reach": reach, "final2": curve[-1] if curve else 1.0}


def _gain(trials: Sequence[tuple[str, float | None]]) -> float:
    """The default's p99 over the best p99 so far (1 before anything beats the default)."""
    default = next((v for step, v in trials if step == "default" and v), None)
    measured = [v for _, v in trials if v]
    if default is None or not measured:
        return 1.0
    return default / min(measured)


def _export(folder: Path, study: str) -> list[dict[str, Any]]:
    """The study's trials, read as a user would (``tuner export --format json``)."""
    exported = subprocess.run(
        [sys.executable, "-m", "cli.main", "export", study, "--format", "json",
         "--db", str(folder / "tuner.db")],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return list(json.loads(exported.stdout)["trials"])


def _steps(trials: Sequence[dict[str, Any]]) -> list[tuple[str, float | None]]:
    """``(step, p99_ms)`` of each trial (a designer's trial's ``source`` is its step)."""
    return [(t["source"], t["metrics"].get("p99_ms")) for t in trials]


def _applied(folder: Path, round_: int) -> dict[str, Any]:
    """The configuration the daemon applied after round ``round_`` (its ``applied`` event)."""
    for line in (folder / "events.log").read_text().splitlines():
        event = json.loads(line) if line.strip() else {}
        if event.get("event") == "applied" and event.get("round") == round_:
            return dict(event["config"])
    raise RuntimeError(f"round {round_} applied nothing")


def _events(folder: Path) -> list[str]:
    log = folder / "events.log"
    if not log.exists():
        return []
    return [json.loads(line)["event"] for line in log.read_text().splitlines() if line.strip()]


def table(runs: list[dict[str, Any]]) -> str:
    """Per arm: trials to reach G1 (mean, 95 % bootstrap), round 2's final gain; the paired
    difference over the seeds both arms ran."""
    by = {arm: {r["seed"]: r for r in runs if r["arm"] == arm} for arm in ARMS}
    lines = ["| arm | seeds | round 1 gain G1 | trials to reach G1 (95 %) | round 2 final gain |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for arm in ARMS:
        got = list(by[arm].values())
        if not got:
            continue
        reach = [r["reach"] for r in got]
        low, high = _bootstrap(reach)
        lines.append(
            f"| {arm} | {len(got)} | {statistics.mean(r['g1'] for r in got):.2f} | "
            f"{statistics.mean(reach):.1f} ({low:.1f}-{high:.1f}) | "
            f"{statistics.mean(r['final2'] for r in got):.2f} |"
        )
    both = sorted(set(by["transfer"]) & set(by["none"]))
    if both:
        diff = [by["none"][s]["reach"] - by["transfer"][s]["reach"] for s in both]
        low, high = _bootstrap(diff)
        lines += ["", f"none - transfer, trials to reach G1, paired over {len(both)} seeds: "
                  f"{statistics.mean(diff):.1f} (95 % {low:.1f}-{high:.1f})"]  # fmt: skip
    return "\n".join(lines)


def _bootstrap(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(statistics.mean(rng.choice(values) for _ in values) for _ in range(BOOTSTRAP))
    return means[int(0.025 * BOOTSTRAP)], means[int(0.975 * BOOTSTRAP) - 1]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--rates", default="40,120")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--windows", type=int, default=3, help="windows a trial")
    parser.add_argument("--confirm", type=int, default=5, help="rounds confirming G1 (0: none)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    first, second = (float(r) for r in args.rates.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "runs.jsonl"
    runs = read_records(log)
    done = {(r["seed"], r["arm"]) for r in runs}
    for seed in range(args.seeds):
        for arm in ARMS if seed % 2 == 0 else ARMS[::-1]:
            if (seed, arm) in done:
                continue
            run = run_daemon(seed, arm, args.trials, (first, second), args.seconds,
                             args.windows, args.confirm)  # fmt: skip
            runs.append(run)
            append_record(log, run)
            print(f"seed {seed} {arm}: G1 {run['g1']:.2f}, reached at {run['reach']}, "
                  f"round 2 gain {run['final2']:.2f} ({run['seconds']} s)", flush=True)  # fmt: skip
    text = table(runs)
    (args.out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
