"""Issue 59's benchmark: a study that learns from earlier studies of related workloads.

``python -m bench.transfer --half develop|report [--seeds N] [--first-seed S]
[--arms none,transfer,import,unrelated] [--variants 100,20] [--budget B] [--jobs K]
[--out DIR] [--data DIR] [--report-only]``

Leave-one-workload-out on the MySQL 100-knob family of KnobsTuningEA (``bench/dbres.py``:
TPC-C, YCSB, SEATS, TATP, Voter on the same 100 knobs, bar one): each *target* workload is
tuned by ours with the other four workloads' studies as sources. Develop targets: TPC-C and
YCSB; report targets: SEATS, TATP, Voter (fixed before the first run). Variants: the target's
100 knobs (``<w>-100``), and its 20-knob restriction (``<w>-20``: its 20 most important
knobs free, the rest at the defaults), with the same 100-knob sources (the sources' other
knobs are unmatched and ignored).

* **Sources**: per workload and seed, ours with ``SOURCE_BUDGET`` (100) trials on
  ``db:<w>-100`` (seed ``s``), run once and logged in ``<out>/sources.jsonl`` (kept out of
  git: megabytes); a target of seed ``s`` uses the sources of seed ``s``.
* **Arms** per target, variant and seed (the same run generator for every arm):
  ``none``: ours alone; ``transfer``: ``transfer_from`` the four other workloads;
  ``import``: the four sources' measured trials imported into the study first, their
  throughput taken as this workload's (what users do today; the configurations are completed
  with the middle of each knob's range where a source lacks the knob, and the embedding's
  model does not see them, as ``ImportTrials`` documents; the reported best may be one of
  them); ``unrelated``: ``transfer_from`` the four other workloads with each source's values
  shuffled across its trials (the knobs match, the evidence says nothing);
  ``transfer-short``: ``transfer`` with an initial design of ``SHORT_DESIGN`` trials (the
  variant of ``bench/NOTES.md``, run only when asked for).
* **Scores**: each run's curve of the true (noise-free) throughput of its reported best
  (``bench/suite_score.py``), ``budget`` (50) new trials. The table gives, per target and
  variant, each arm's mean best at 10, 25 and 50 and the trials the arm's mean curve takes to
  reach ``none``'s mean best at 50; the goals (issue 59): the median over targets of the
  latter at most 15 for ``transfer``; ``unrelated``'s mean best at 50 within 3 % of
  ``none``'s.

Each finished run is appended to ``<out>/transfer-runs.jsonl`` at once (``--resume`` is
implicit: a logged run is not run again); ``--report-only`` writes the tables from the log.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from bench.common import BENCHDATA, RESULTS_DIR, append_record, limit_threads, read_records
from bench.contract import SuiteProblem
from bench.peers import ours
from bench.suite_problems import db_problem
from bench.suite_score import score_run
from runner.memory import MemoryAPI
from tuner.encoding import UnitBoxEncoder
from tuner.study import StudySpec, TransferSource
from tuner.trial import Trial, TrialStatus

WORKLOADS = ("tpcc", "ycsb", "seats", "tatp", "voter")
TARGETS = {"develop": ("tpcc", "ycsb"), "report": ("seats", "tatp", "voter")}
VARIANTS = ("100", "20")
ARMS = ("none", "transfer", "import", "unrelated", "transfer-short")
#: ``transfer-short``'s initial design: the four sources' seeds and ``MIN_RANKED`` (3) Sobol
#: points (``bench/NOTES.md``, issue 59: the one variant considered on develop).
SHORT_DESIGN = 4 + 3
SOURCE_BUDGET = 100
BUDGET = 50
MARKS = (10, 25, 50)
OUT = RESULTS_DIR / "transfer"


@lru_cache(maxsize=16)
def problem(name: str, data: str) -> SuiteProblem:
    """``db:<name>``, built once per process."""
    return db_problem(name, SOURCE_BUDGET, Path(data))


def run_source(workload: str, seed: int, data: str) -> dict[str, Any]:
    """Ours on ``<workload>-100`` for ``SOURCE_BUDGET`` trials: the logged source."""
    task = problem(f"{workload}-100", data)
    spec = ours.study_spec(task, seed)
    _, trials = ours.run_study(task, spec, seed, SOURCE_BUDGET)
    return {"workload": workload, "seed": seed, "trials": [_trial_json(t) for t in trials]}


def run_target(
    target: str, variant: str, arm: str, seed: int, budget: int, data: str,
    sources: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:  # fmt: skip
    """One arm's run on one target (module doc); ``sources``: workload -> logged trials."""
    task = problem(f"{target}-{variant}", data)
    api = MemoryAPI()
    names = []
    for workload, logged in sources.items():
        source_spec = ours.study_spec(problem(f"{workload}-100", data), seed).with_name(
            f"src-{workload}"
        )
        trials = [_trial_from_json(t) for t in logged]
        if arm == "unrelated":
            trials = _shuffled(trials, source_spec.objective.name, f"{target}:{seed}:{workload}")
        api.create_study(source_spec)
        api.import_trials(source_spec.name, trials)
        names.append(source_spec.name)
    designer = {"initial_trials": SHORT_DESIGN} if arm == "transfer-short" else None
    spec = ours.study_spec(task, seed, designer).with_name("target")
    if arm in ("transfer", "unrelated", "transfer-short"):
        spec = replace(spec, transfer_from=tuple(TransferSource(n) for n in names))
    api.create_study(spec)
    if arm == "import":
        api.import_trials(spec.name, _imported(spec, api, names))
    run, trials = ours.run_study(task, spec, seed, budget, name=arm, api=api)
    scored = score_run(task, run, {})
    new = trials[len(trials) - budget :]
    return {
        "target": target,
        "variant": variant,
        "arm": arm,
        "seed": seed,
        "curve": scored.curve,
        "seconds": round(run.seconds, 2),
        "steps": run.generators,
        "weights": [dict(t.transfer) for t in new],
    }


def _imported(spec: StudySpec, api: MemoryAPI, names: Sequence[str]) -> list[Trial]:
    """The sources' measured trials as trials of ``spec`` (module doc: ``import``)."""
    encoder = UnitBoxEncoder(spec.space)
    middle = encoder.decode([0.5] * encoder.d)
    out = []
    for name in names:
        for trial in api.list_trials(name, [TrialStatus.COMPLETED]):
            config = {k: trial.config.get(k, middle[k]) for k in spec.space.names}
            out.append(Trial(0, config, TrialStatus.COMPLETED, dict(trial.metrics), source=name))
    return out


def _shuffled(trials: list[Trial], objective: str, salt: str) -> list[Trial]:
    """The completed trials with their objective values permuted among them."""
    done = [t for t in trials if t.status is TrialStatus.COMPLETED and objective in t.metrics]
    values = [t.metrics[objective] for t in done]
    random.Random(salt).shuffle(values)
    swapped = {id(t): v for t, v in zip(done, values, strict=True)}
    return [
        replace(t, metrics={**t.metrics, objective: swapped[id(t)]}) if id(t) in swapped else t
        for t in trials
    ]


def _trial_json(trial: Trial) -> dict[str, Any]:
    return {"config": trial.config, "status": trial.status.value, "metrics": trial.metrics,
            "step": trial.step.value}  # fmt: skip


def _trial_from_json(data: dict[str, Any]) -> Trial:
    return Trial(0, data["config"], TrialStatus(data["status"]), dict(data["metrics"]))


# -- tables ---------------------------------------------------------------------------------
def tables(runs: list[dict[str, Any]], none_mark: int = 50) -> str:
    """The markdown tables of the module doc, from logged runs."""
    groups: dict[tuple[str, str, str], list[list[float | None]]] = {}
    for run in runs:
        groups.setdefault((run["target"], run["variant"], run["arm"]), []).append(run["curve"])
    lines = [
        "| target | arm | seeds | best@10 | best@25 | best@50 | trials to none's best@50 |",
        "|---|---|---|---|---|---|---|",
    ]
    reach: dict[str, list[float]] = {}
    within: dict[str, list[float]] = {}
    for target, variant in sorted({(t, v) for t, v, _ in groups}):
        base = _mean_curve(groups.get((target, variant, "none"), []))
        goal = base[none_mark - 1] if base and len(base) >= none_mark else None
        for arm in ARMS:
            curves = groups.get((target, variant, arm))
            if not curves:
                continue
            mean = _mean_curve(curves)
            marks = [f"{mean[m - 1]:,.0f}" if len(mean) >= m else "" for m in MARKS]
            hit = next((i + 1 for i, v in enumerate(mean) if goal is not None and v >= goal), None)
            reach.setdefault(arm, []).append(hit if hit is not None else float("inf"))
            if goal and len(mean) >= none_mark:
                within.setdefault(arm, []).append(mean[none_mark - 1] / goal)
            hit_text = "never" if hit is None else str(hit)
            lines.append(
                f"| {target}-{variant} | {arm} | {len(curves)} | " + " | ".join(marks)
                + f" | {hit_text} |"
            )  # fmt: skip
    lines += [
        "",
        "| arm | median trials to none's best@50 | mean best@50 / none's |",
        "|---|---|---|",
    ]
    for arm in ARMS:
        if arm in reach:
            ratio = statistics.mean(within[arm]) if within.get(arm) else float("nan")
            lines.append(f"| {arm} | {statistics.median(reach[arm])} | {ratio:.3f} |")
    return "\n".join(lines)


def _mean_curve(curves: list[list[float | None]]) -> list[float]:
    """The mean over runs of each step's best (a step without a feasible best counts 0)."""
    if not curves:
        return []
    n = min(len(c) for c in curves)
    return [statistics.mean(c[i] or 0.0 for c in curves) for i in range(n)]


# -- driver ---------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--half", choices=sorted(TARGETS), default="develop")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--arms", default=",".join(ARMS[:4]))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--budget", type=int, default=BUDGET)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--data", type=Path, default=BENCHDATA)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    limit_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    runs_log, sources_log = args.out / "transfer-runs.jsonl", args.out / "sources.jsonl"
    if not args.report_only:
        if not (args.data / "dbtune_knobsTuningEA").exists():
            raise SystemExit(f"{args.data / 'dbtune_knobsTuningEA'} not found (use --data)")
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        arms = [a for a in args.arms.split(",") if a]
        unknown = [a for a in arms if a not in ARMS]
        if unknown:
            raise SystemExit(f"--arms: unknown {unknown[0]!r}; allowed: {', '.join(ARMS)}")
        sources = _logged_sources(sources_log)
        data = str(args.data)
        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
            wanted = [(w, s) for s in seeds for w in WORKLOADS if (w, s) not in sources]
            futures = [pool.submit(run_source, w, s, data) for w, s in wanted]
            for future in as_completed(futures):
                logged = future.result()
                sources[(logged["workload"], logged["seed"])] = logged["trials"]
                append_record(sources_log, logged)
                print(f"source {logged['workload']} seed {logged['seed']}: logged", flush=True)
            done = {
                (r["target"], r["variant"], r["arm"], r["seed"]) for r in read_records(runs_log)
            }
            jobs = [
                (t, v, a, s) for s in seeds for t in TARGETS[args.half]
                for v in args.variants.split(",") for a in arms if (t, v, a, s) not in done
            ]  # fmt: skip
            start = time.perf_counter()
            futures = [
                pool.submit(run_target, t, v, a, s, args.budget, data,
                            {w: sources[(w, s)] for w in WORKLOADS if w != t})
                for t, v, a, s in jobs
            ]  # fmt: skip
            for i, future in enumerate(as_completed(futures), 1):
                run = future.result()
                append_record(runs_log, run)
                best = run["curve"][-1]
                print(f"[{i}/{len(jobs)}, {time.perf_counter() - start:.0f} s] {run['target']}-"
                      f"{run['variant']} {run['arm']} seed {run['seed']}: best {best} "
                      f"({run['seconds']} s)", flush=True)  # fmt: skip
    runs = [r for r in read_records(runs_log) if r["target"] in TARGETS[args.half]]
    text = tables(runs)
    (args.out / f"tables-{args.half}.md").write_text(text + "\n")
    print(text)


def _logged_sources(path: Path) -> dict[tuple[str, int], list[dict[str, Any]]]:
    return {(r["workload"], r["seed"]): r["trials"] for r in read_records(path)}


if __name__ == "__main__":
    main()
