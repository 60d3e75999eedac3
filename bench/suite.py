"""Issue 26's benchmark suite: ours and the peers on the problems of ``bench/suite.toml``.

``python -m bench.suite --half develop|report [--seeds N] [--first-seed S] [--methods a,b]
[--problems db,hdbo:branin-d100,...] [--budget B] [--resume] [--redo METHOD] [--jobs K]
[--out DIR] [--markdown] [--logged-only] [--missing] [--also DIR,...]``

* **Problems** (``bench/suite_problems.py``): the half's problems, read from
  ``../shared/benchdata`` at run time (``--data``); ``--problems`` keeps the names equal to,
  or starting with, the given names or family prefixes (``=NAME``: that name only, not its
  noisy twins). Choose constants on the develop half; run the report half only for the final
  tables.
* **Methods**: the runners of ``bench/peers/`` (``bench.peers.RUNNERS`` when the package
  defines it, else one module per method, ``_`` read as ``-``), each ``run(problem, seed,
  budget, on_eval=None) -> MethodRun``; a runner whose ``available()`` gives a reason is
  skipped with it. Default: every runner found.
* **Runs** are keyed ``(problem, seed, method)``, seeds ``first .. first + N - 1``. Each
  finished run is appended at once to two logs: ``<out>/suite-runs.jsonl``, every measured
  and reported configuration (tens of MB: kept out of git), and ``<out>/suite-curves.jsonl``,
  the run scored (``ScoredRun``: its curve of true values, seconds, notes), which is all the
  tables need and is committed. ``--resume`` takes the scored runs already there (of the
  current budget; runs of the first log not yet scored are scored first) instead of running
  them again, and also puts
  every other method's logged runs of the selected problems and seeds in the tables. Peer
  results do not change when our designer does, so ``--methods ours --resume`` reruns only
  ours, after ``--redo ours`` dropped its logged runs of the selected problems.
  ``--logged-only``: the tables of the logged runs, running nothing. ``--also DIR,...``
  takes the scored runs of other results folders as well (runs made beside this one by
  other processes, e.g. one per family; a run logged in ``--out`` wins) and runs none of
  them again. ``--jobs K`` runs in K
  worker processes (each builds the problems it needs; torch/BLAS get one thread each
  unless ``--threads``).
* **Scoring** (``bench/suite_score.py``) on the true value of each run's reported best, and
  the tables and plot (``bench/suite_report.py``): ``<out>/suite.json``, ``<out>/suite.png``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from multiprocessing import get_context
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from rich.markup import escape
from rich.table import Table

from bench import suite_problems, yahpo_bridge
from bench.common import (
    RESULTS_DIR,
    console,
    limit_threads,
    load_note,
    machine_info,
    show,
    write_json,
)
from bench.contract import HALVES, Measurement, MethodRun, SuiteProblem
from bench.suite_report import plot, print_report
from bench.suite_score import ScoredRun, score_run, summarize_problem, summarize_suite

RUNS_LOG = "suite-runs.jsonl"  # every configuration of every run: large, kept out of git
CURVES_LOG = "suite-curves.jsonl"  # the scored runs the tables need: committed

Key = tuple[str, int, str]
Run = TypeVar("Run", MethodRun, ScoredRun)
Task = tuple[str, int, str, int]  # problem, seed, method, budget


def runners() -> dict[str, ModuleType]:
    """Method name -> runner module, from ``bench/peers/`` (module doc)."""
    import bench.peers as peers

    registry = getattr(peers, "RUNNERS", None)
    if registry is not None:
        return dict(registry.items())
    found = pkgutil.iter_modules(peers.__path__)
    return {
        m.name.replace("_", "-"): importlib.import_module(f"bench.peers.{m.name}")
        for m in found
        if not m.name.startswith("_")
    }


def run_to_json(run: MethodRun) -> str:
    """One line of the runs log."""
    return json.dumps(asdict(run))


def run_from_json(line: str) -> MethodRun:
    """A run from one line of the runs log."""
    data = json.loads(line)
    data["measurements"] = [Measurement(**m) for m in data["measurements"]]
    return MethodRun(**data)


def scored_to_json(run: ScoredRun) -> str:
    """One line of the curves log."""
    return json.dumps(asdict(run))


def logged_curves(log: Path, budgets: Mapping[str, int] | None) -> dict[Key, ScoredRun]:
    """``(problem, seed, method) -> scored run`` of the curves log, for the current
    ``budgets`` (None: any budget); the last one logged wins."""
    return _logged(log, lambda line: ScoredRun(**json.loads(line)), budgets)


def backfill_curves(out: Path, problems: Mapping[str, SuiteProblem]) -> int:
    """Score the runs of ``problems`` in the runs log that the curves log lacks, append them
    to it, and say how many (logs written before the curves log existed)."""
    have = logged_curves(out / CURVES_LOG, None)
    runs = logged_runs(out / RUNS_LOG, None)
    missing = [r for k, r in runs.items() if k not in have and r.problem in problems]
    caches: dict[str, dict[str, float | None]] = {}
    with (out / CURVES_LOG).open("a", encoding="utf-8") as handle:
        for run in missing:
            cache = caches.setdefault(run.problem, {})
            handle.write(scored_to_json(score_run(problems[run.problem], run, cache)) + "\n")
    return len(missing)


def logged_runs(log: Path, budgets: Mapping[str, int] | None) -> dict[Key, MethodRun]:
    """``(problem, seed, method) -> run`` for the logged runs of the current ``budgets``
    (None: any budget); the last one logged wins."""
    return _logged(log, run_from_json, budgets)


def _logged(
    log: Path, parse: Callable[[str], Run], budgets: Mapping[str, int] | None
) -> dict[Key, Run]:
    """The runs of a log (``parse`` reads a line) whose length is the problem's budget."""
    if not log.exists():
        return {}
    out = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        if line.strip():
            run = parse(line)
            if budgets is None or budgets.get(run.problem) == _length(run):
                out[(run.problem, run.seed, run.method)] = run
    return out


def _length(run: MethodRun | ScoredRun) -> int:
    return len(run.curve) if isinstance(run, ScoredRun) else len(run.configs)


def drop_logged(log: Path, methods: Iterable[str], problems: Iterable[str]) -> int:
    """Remove the runs of ``methods`` on ``problems`` from the log; how many were removed."""
    if not log.exists():
        return 0
    methods, problems = set(methods), set(problems)
    kept, dropped = [], 0
    for line in log.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        head = json.loads(line)
        if head["method"] in methods and head["problem"] in problems:
            dropped += 1
        else:
            kept.append(line)
    partial = log.with_suffix(".tmp")
    partial.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    partial.replace(log)
    return dropped


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    suite = suite_problems.read_suite()
    names = suite_problems.suite_names(args.half, suite)
    if args.problems:
        names = suite_problems.select(names, args.problems.split(","))
        if not names:
            raise SystemExit(f"--problems {args.problems!r} matches no {args.half} problem")
    methods, skipped = _methods(args.methods)
    problems, skipped_problems = suite_problems.build(
        names, args.half, suite, args.data, args.yahpo_python
    )
    skipped.update(skipped_problems)
    for name, reason in skipped.items():
        console.print(f"[yellow]skipping {name}: {escape(reason)}[/yellow]", markup=True)
    out = args.out or RESULTS_DIR / "suite" / args.half
    out.mkdir(parents=True, exist_ok=True)
    log = out / CURVES_LOG
    by_name = {p.name: p for p in problems}
    if args.redo:
        drop_logged(out / RUNS_LOG, args.redo.split(","), list(by_name))
        dropped = drop_logged(log, args.redo.split(","), list(by_name))
        console.print(f"--redo: dropped {dropped} logged runs of {args.redo} from {log}")
    seeds = range(args.first_seed, args.first_seed + (args.seeds or suite["suite"]["seeds"]))
    budgets = {p.name: args.budget or p.budget for p in problems}
    done: dict[Key, ScoredRun] = {}
    if args.resume or args.logged_only:
        added = backfill_curves(out, by_name)
        if added:
            console.print(f"scored {added} runs of {out / RUNS_LOG} into {log}")
    if args.resume or args.logged_only or args.missing:  # --missing only reads
        done = logged_curves(log, budgets)
    for folder in args.also.split(",") if args.also else ():
        beside = Path(folder) / CURVES_LOG
        if not beside.is_file():
            raise SystemExit(f"--also {folder}: no {CURVES_LOG} there")
        taken = {k: r for k, r in logged_curves(beside, budgets).items() if k not in done}
        done.update(taken)
        console.print(f"--also: {len(taken)} runs taken from {beside}")
    done = {k: r for k, r in done.items() if k[0] in budgets and k[1] in seeds}
    plan = [(p.name, s, m, budgets[p.name]) for p in problems for s in seeds for m in methods]
    plan = [t for t in plan if t[:3] not in done]
    if done:
        console.print(f"resuming: {len(done)} runs taken from {log}")
    if args.missing:
        print_missing(plan, args.markdown)
        return 0
    if args.logged_only:
        console.print(f"--logged-only: not running {len(plan)} missing runs")
        plan = []
    meta = machine_info()
    meta.update(
        half=args.half,
        seeds=list(seeds),
        budget_override=args.budget,
        jobs=args.jobs,
        methods=list(methods),
        skipped=skipped,
        data=str(args.data),
    )
    limit_threads(args.threads)
    new, meta["failed"] = _run_plan(plan, by_name, args, out)
    runs = [*done.values(), *new]
    marks = suite["suite"]["checkpoints"]
    summaries = {
        p.name: summarize_problem(p, [r for r in runs if r.problem == p.name], marks)
        for p in problems
        if any(r.problem == p.name for r in runs)
    }
    overall = summarize_suite(summaries)
    print_report(summaries, overall, args.markdown)
    meta["load_note"] = load_note(meta["load_average"])
    console.print(f"[dim]{meta['load_note']}[/dim]")
    data = {"benchmark": "suite", "meta": meta, "summary": summaries, "suite": overall}
    console.print(f"wrote {write_json('suite', data, out)}")
    picture = plot(summaries, out / "suite.png")
    if picture is not None:
        console.print(f"wrote {picture}")
    return 1 if meta["failed"] else 0


def print_missing(plan: Sequence[Task], markdown: bool = False) -> None:
    """The runs a plan still lacks, per method and problem (seeds), with no score shown: where
    the runs stand, readable before the report half's tables may be."""
    table = Table(title=f"{len(plan)} runs missing")
    for column in ("method", "problem", "seeds"):
        table.add_column(column)
    seeds: dict[tuple[str, str], list[int]] = {}
    for problem, seed, method, _ in plan:
        seeds.setdefault((method, problem), []).append(seed)
    for (method, problem), missing in sorted(seeds.items()):
        table.add_row(method, problem, ",".join(map(str, missing)))
    show(table, markdown)


# -- running ---------------------------------------------------------------------------------


def _run_plan(
    plan: list[Task], problems: Mapping[str, SuiteProblem], args: argparse.Namespace, out: Path
) -> tuple[list[ScoredRun], dict[str, str]]:
    """Every planned run, each logged (runs log) and scored (curves log) as soon as it
    ends; failures by ``problem seed method``."""
    runs: list[ScoredRun] = []
    failed: dict[str, str] = {}
    caches: dict[str, dict[str, float | None]] = {}
    start = time.perf_counter()

    def record(task: Task, result: MethodRun | str) -> None:
        label = f"{task[0]} seed {task[1]} {task[2]}"
        if isinstance(result, str):
            failed[label] = result
            console.print(f"[red]{label} failed:[/red] {result}", markup=True)
            return
        with (out / RUNS_LOG).open("a", encoding="utf-8") as handle:
            handle.write(run_to_json(result) + "\n")
        scored = score_run(problems[task[0]], result, caches.setdefault(task[0], {}))
        runs.append(scored)
        with (out / CURVES_LOG).open("a", encoding="utf-8") as handle:
            handle.write(scored_to_json(scored) + "\n")
        elapsed = time.perf_counter() - start
        console.print(
            f"[{len(runs) + len(failed)}/{len(plan)}, {elapsed:.0f} s] {label}: "
            f"{result.seconds:.1f} s",
            markup=False,
        )

    if args.jobs <= 1:
        for task in plan:
            record(task, _run_one(task, problems[task[0]]))
        return runs, failed
    settings = (args.half, args.data, args.yahpo_python, args.threads or 1)
    with ProcessPoolExecutor(
        args.jobs, mp_context=get_context("spawn"), initializer=_init_worker, initargs=settings
    ) as pool:
        futures = {pool.submit(_work, task): task for task in plan}
        for future in as_completed(futures):
            record(futures[future], future.result())
    return runs, failed


def _run_one(task: Task, problem: SuiteProblem) -> MethodRun | str:
    """One run; a runner's exception becomes its text (the other runs go on)."""
    _, seed, method, budget = task
    try:
        run = runners()[method].run(problem, seed, budget)
    except Exception:  # keep the other runs' results; the failure is reported and recorded
        return traceback.format_exc(limit=-4)[-2000:]
    return replace(run, method=method)


_WORKER: dict[str, Any] = {}


def _init_worker(half: str, data: Path, yahpo_python: Path, threads: int) -> None:
    limit_threads(threads)
    _WORKER.update(half=half, data=data, yahpo_python=yahpo_python, problems={})


def _work(task: Task) -> MethodRun | str:
    problems = _WORKER["problems"]
    if task[0] not in problems:
        suite = suite_problems.read_suite()
        built, _ = suite_problems.build(
            [task[0]], _WORKER["half"], suite, _WORKER["data"], _WORKER["yahpo_python"]
        )
        problems[task[0]] = built[0]
    return _run_one(task, problems[task[0]])


def _methods(text: str | None) -> tuple[tuple[str, ...], dict[str, str]]:
    """The methods asked for that can run, and ``method -> reason`` for those that cannot."""
    known = runners()
    names = tuple(text.split(",")) if text else tuple(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown method {unknown[0]!r}; bench/peers/ has {', '.join(known)}")
    skipped = {}
    for name in names:
        check = getattr(known[name], "available", None)
        reason = check() if check is not None else None
        if reason is not None:
            skipped[name] = reason
    return tuple(n for n in names if n not in skipped), skipped


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--half", choices=HALVES, required=True, help="develop (tuning) or report (final tables)")
    add("--seeds", type=int, help="runs per method and problem (default: suite.toml's)")
    add("--first-seed", type=int, default=0, help="seeds FIRST .. FIRST+N-1")
    add("--methods", help="comma-separated runners of bench/peers/ (default: all)")
    add(
        "--problems",
        help="comma-separated names or prefixes (db, cloud:spark_lr, ...); =NAME: that name only",
    )
    add("--budget", type=int, help="override every problem's budget (for smoke tests)")
    add("--resume", action="store_true", help=f"take runs already in <out>/{CURVES_LOG}")
    add("--redo", help="drop these methods' logged runs of the selected problems first")
    add("--logged-only", action="store_true", help="tables from the logged runs, running none")
    add("--missing", action="store_true", help="list the runs not logged yet (no scores), run none")
    add(
        "--also",
        help="comma-separated results folders whose scored runs count too (runs written "
        "beside this one by other processes); a run logged in --out wins",
    )
    add("--jobs", type=int, default=1, help="worker processes")
    add("--threads", type=int, help="torch/BLAS threads per process (default: 1 with --jobs)")
    add("--data", type=Path, default=suite_problems.DATA, help="the shared/benchdata folder")
    add(
        "--yahpo-python",
        type=Path,
        default=yahpo_bridge.DEFAULT_PYTHON,
        help="interpreter of bench/.venv-yahpo (bench/setup_yahpo.sh)",
    )
    add("--out", type=Path, help="results folder (default bench/results/suite/<half>)")
    add("--markdown", action="store_true", help="print tables as Markdown")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
