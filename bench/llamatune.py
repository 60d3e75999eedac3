"""LlamaTune benchmark: ours with the LlamaTune embedding against mlos-core and other peers.

Run as ``python -m bench.llamatune [--quick] [--seeds N] [--problems ...] [--methods ...]``.

Problems (read from ``../shared/benchdata`` at run time; ``--data`` overrides):

* ``sysbench-20`` / ``job-5``: MySQL knob tuning on random-forest surrogates of KnobsTuningEA's
  measurements (``bench/dbsurrogate.py``): 20 knobs, maximize tps; 5 knobs, minimize latency;
  100 trials (LlamaTune's budget).
* ``branin-d100`` (50 evaluations), ``hartmann6-d100`` and ``hartmann6-d1000`` (200): ALEBO's
  embedded problems exactly as defined in its benchmarks (``bench/hdbo.py``), so that our
  numbers sit next to the published ALEBO, HeSBO, REMBO, TuRBO, SMAC, CMA-ES and Sobol curves.
* ``hartmann6-d20`` (100): a guard of ours, Hartmann6 on 6 of 20 knobs, SYSBENCH's size with
  an interior optimum (``bench/hdbo.py``).

Methods, every one evaluating the same ``KnobProblem.evaluate`` in this process, seeds
``0 .. N-1``:

* ``ours``: our designer on a study with ``"embedding": {"kind": "llamatune", "dims": d,
  "special_bias": 0.2, "buckets": 10000}`` (``d`` = 16, or 4 on the 5-knob problem), built by
  ``make_designer(spec, FitCache())`` as the server does (the LlamaTune designer around
  ``BODesigner``) and driven as ``bench/methods.py`` drives ours: one ``suggest(1, completed,
  [])`` per trial, each trial storing its low-dimensional point.
* ``ours-full``: the same designer without the embedding (by default only on problems of at
  most 20 knobs).
* ``ours-priors``: ours-full with ``"designer": {..., "expert_priors": true}``: the Sobol
  initial design and as many BO trials again inside the knobs' recommended region, then the
  whole space (``tuner/designer/sampling/priors.py``; GPTuner's coarse-to-fine idea). Only on
  problems of at most 20 knobs that have recommended knobs: the MySQL surrogates, whose priors and
  their sources are listed in ``bench/dbsurrogate.py`` (``PRIORS``).
* ``mlos``: mlos-core 0.6.2 ``LlamaTuneAdapter`` (same ``d``, 20 % special-value bias,
  10,000 buckets) + SMAC with ``n_random_init=10``, seed ``seed + 1`` (its wrapper turns 0
  into a random seed), in ``bench/.venv-mlos`` behind ``bench/mlos_peer.py``; its
  special-value bug is monkeypatched in the child (``--mlos-special off`` drops the special
  values instead). Skipped with a message when the environment is missing.
* ``skopt``: ``gp_minimize`` (defaults, ``n_initial_points=10``, ``random_state=seed``); by
  default not on the 200-evaluation problems, where one run takes hours (``--all-methods``).
* ``optuna``: ``TPESampler(seed=seed, n_startup_trials=10)``, ask/tell.
* ``random``: uniform over each knob's values (numpy ``default_rng(seed)``).

**Expert priors: only ``ours-priors`` uses them.** ``ours``, ``ours-full``, ``mlos``,
``skopt``, ``optuna`` and ``random`` never see a recommendation (ours and ours-full get the
knobs without their ``recommended`` keys); they are the "without priors" side. Tables and the
plot mark the methods with priors ``(with priors)`` and list the priors used.

Reported: mean best (std) at 25, 50, 100 trials and at the budget; **trials to reach the
best value mlos-core reaches in 100 trials** (the mean over its seeds of its best at
``min(100, budget)``), divided by that number of trials, per method: the mean over seeds
(a seed that never reaches it counts as the whole budget, shown ``>=``) and how many seeds
reached it; ALEBO's published mean best at the same evaluations; seconds per run; goals
with PASS/FAIL. Results: ``bench/results/llamatune.json`` and ``llamatune.png`` (tables and plot:
``bench/llamatune_report.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from bench import dbsurrogate, hdbo, mlos_peer
from bench.common import (
    RESULTS_DIR,
    console,
    limit_threads,
    load_note,
    machine_info,
    write_json,
)
from bench.hdbo import KnobProblem, PublishedCurve
from bench.llamatune_report import plot, print_report
from bench.methods import RunResult, drive
from tuner.space import Scalar
from tuner.study import StudySpec

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "benchdata"
METHODS = ("ours", "ours-full", "ours-priors", "mlos", "skopt", "optuna", "random")
PRIOR_METHODS = frozenset({"ours-priors"})  # the only methods that see the knobs' priors
OURS = {"ours": (True, False), "ours-full": (False, False), "ours-priors": (False, True)}
RUNS_LOG = "llamatune-runs.jsonl"
PROBLEMS = (
    "sysbench-20",
    "job-5",
    "branin-d100",
    "hartmann6-d100",
    "hartmann6-d1000",
    "hartmann6-d20",
)
FULL_SEEDS, QUICK_SEEDS = 10, 2
REF_TRIALS = 100
CHECKPOINTS = (25, 50, 100)
N_INITIAL = 10  # random/initial points of skopt and optuna, as mlos's n_random_init
FULL_SPACE_MAX_DIM = 20  # ours-full/-priors only where a full-space GP is the sensible baseline
# skopt refits an ARD GP on every step: measured here 27 s per step at 100 points on
# sysbench-20, 65-208 s at 199 points on the Hartmann6 problems (hours per 200-trial run).
SKOPT_MAX_BUDGET = 100
GOAL_RATIO = 0.5
ALEBO_BRANIN_AT_50 = 0.749  # published mean best; replaced by the CSV's value when it is read
EMBEDDING = {"kind": "llamatune", "special_bias": 0.2, "buckets": 10_000}
_PRIOR_KEYS = ("recommended", "recommended_source")

OnEval = Callable[[], None]


@dataclass(frozen=True)
class Settings:
    """How the methods run (the same for every problem and seed).

    Attributes:
        dims: Override of every problem's embedding dimension (ours and mlos).
        mlos_python: The peer environment's interpreter.
        mlos_special: ``patch`` (monkeypatched special values) or ``off`` (none).
        threads: Threads for torch/BLAS here and for the peer's libraries.
    """

    dims: int | None = None
    mlos_python: Path = mlos_peer.DEFAULT_PYTHON
    mlos_special: str = "patch"
    threads: int | None = None

    def embed_dims(self, problem: KnobProblem) -> int:
        return min(self.dims or problem.embed_dims, problem.dim - 1)


def build_problems(names: list[str], data_dir: Path) -> tuple[list[KnobProblem], dict[str, str]]:
    """The named problems, and ``name -> reason`` for those that cannot be built here."""
    alebo = hdbo.alebo_problems()
    guard = hdbo.hartmann6_guard_problem()
    problems, skipped = [], {}
    for name in names:
        if name in alebo:
            problems.append(alebo[name])
        elif name == guard.name:
            problems.append(guard)
        elif name in dbsurrogate.SAMPLE_SETS:
            if not (data_dir / dbsurrogate.FOLDER).is_dir():
                skipped[name] = f"{data_dir / dbsurrogate.FOLDER} not found (use --data)"
                continue
            problems.append(dbsurrogate.surrogate_problem(data_dir, name))
        else:
            raise ValueError(f"unknown problem {name!r}; expected one of {PROBLEMS}")
    return problems, skipped


def cannot_run(method: str, problem: KnobProblem) -> str | None:
    """Why ``method`` never runs on ``problem`` (not even with ``--all-methods``)."""
    if method in PRIOR_METHODS and not prior_knobs(problem):
        return f"{method} needs knobs with a recommended region; {problem.name} has none"
    return None


def not_run(method: str, problem: KnobProblem, budget: int) -> str | None:
    """Why ``method`` is left out on ``problem`` by default (``--all-methods`` runs it)."""
    if method in ("ours-full", "ours-priors") and problem.dim > FULL_SPACE_MAX_DIM:
        return f"{method} runs on problems of at most {FULL_SPACE_MAX_DIM} knobs"
    if method == "skopt" and budget > SKOPT_MAX_BUDGET:
        return f"skopt runs on budgets of at most {SKOPT_MAX_BUDGET} (hours per run beyond)"
    return None


def run_method(
    method: str,
    problem: KnobProblem,
    seed: int,
    budget: int,
    settings: Settings,
    on_eval: OnEval | None = None,
) -> RunResult:
    """One run of ``method``: ``budget`` evaluations, best value after each."""
    start = time.perf_counter()
    notes: dict[str, int] = {}
    if method in OURS:
        embed, priors = OURS[method]
        dims = settings.embed_dims(problem) if embed else None
        values, notes = _run_ours(problem, seed, budget, dims, on_eval, priors)
    elif method == "mlos":
        peer = (settings.mlos_python, settings.mlos_special, settings.threads)
        values = mlos_peer.run(problem, seed, budget, settings.embed_dims(problem), *peer, on_eval)
    elif method == "skopt":
        values = _run_skopt(problem, seed, budget, on_eval)
    elif method == "optuna":
        values = _run_optuna(problem, seed, budget, on_eval)
    elif method == "random":
        values = _run_random(problem, seed, budget, on_eval)
    else:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    seconds = time.perf_counter() - start
    best: list[float | None] = list(best_so_far(problem, values))
    return RunResult(method, problem.name, seed, best, seconds, notes)


def study_spec(
    problem: KnobProblem, seed: int, dims: int | None, priors: bool = False
) -> StudySpec:
    """The problem as our study; ``dims`` adds the LlamaTune ``embedding`` key.

    ``priors`` keeps the knobs' ``recommended`` regions and turns ``expert_priors`` on;
    without it the knobs lose their recommendations, so nothing can leak into the designer.
    """
    designer: dict[str, Any] = {"algorithm": "bo", "seed": seed}
    if priors:
        designer["expert_priors"] = True
    keep = () if priors else _PRIOR_KEYS
    data: dict[str, Any] = {
        "name": problem.name,
        "knobs": [{k: v for k, v in knob.items() if k not in keep} for knob in problem.knobs],
        "objectives": [{"name": problem.metric, "goal": problem.goal}],
        "designer": designer,
    }
    if dims is not None:
        data["embedding"] = {**EMBEDDING, "dims": dims}
    return StudySpec.from_dict(data)


def prior_knobs(problem: KnobProblem) -> dict[str, dict[str, Any]]:
    """``knob -> {"recommended", "source"}`` for the problem's knobs that carry a prior."""
    return {
        k["name"]: {"recommended": list(k["recommended"]), "source": k["recommended_source"]}
        for k in problem.knobs
        if k.get("recommended")
    }


def best_so_far(problem: KnobProblem, values: list[float]) -> list[float]:
    """Best value after each evaluation, in the problem's direction."""
    out: list[float] = []
    for value in values:
        out.append(value if not out or problem.better(value, out[-1]) else out[-1])
    return out


def trials_to_reach(problem: KnobProblem, best: list[float], target: float) -> int | None:
    """First evaluation (1-based) whose best is at least as good as ``target``, or None."""
    for i, value in enumerate(best):
        if not problem.better(target, value):
            return i + 1
    return None


def time_to_target(
    problem: KnobProblem, curves: list[list[float]], target: float, ref: int
) -> dict[str, Any]:
    """Trials to reach ``target`` over ``ref`` per seed; unreached seeds count the budget."""
    trials = [trials_to_reach(problem, curve, target) for curve in curves]
    ratios = [(len(c) if t is None else t) / ref for t, c in zip(trials, curves, strict=True)]
    return {
        "trials": trials,
        "mean_ratio": statistics.fmean(ratios),
        "reached": sum(t is not None for t in trials),
        "seeds": len(trials),
    }


def summarize(
    problem: KnobProblem,
    runs: list[RunResult],
    budget: int,
    published: Mapping[str, PublishedCurve] | None = None,
) -> dict[str, Any]:
    """Checkpoint statistics, mean curves, time-to-target and published values of a problem."""
    checkpoints = [c for c in sorted({*CHECKPOINTS, budget}) if c <= budget]
    curves = {m: [_floats(r.best) for r in runs if r.method == m] for m in METHODS}
    curves = {m: c for m, c in curves.items() if c}
    methods = {}
    for method, group in curves.items():
        seconds = [r.seconds for r in runs if r.method == method]
        methods[method] = {
            "runs": len(group),
            "mean_curve": [statistics.fmean(col) for col in zip(*group, strict=True)],
            "checkpoints": {str(c): _stats([g[c - 1] for g in group]) for c in checkpoints},
            "seconds_per_run": statistics.fmean(seconds),
            "expert_priors": method in PRIOR_METHODS,
        }
    ref = min(REF_TRIALS, budget)
    target = None
    ratios: dict[str, Any] = {}
    if "mlos" in curves:
        target = statistics.fmean(c[ref - 1] for c in curves["mlos"])
        ratios = {m: time_to_target(problem, g, target, ref) for m, g in curves.items()}
    return {
        "metric": problem.metric,
        "goal": problem.goal,
        "dim": problem.dim,
        "optimum": problem.optimum,
        "budget": budget,
        "checkpoints": checkpoints,
        "methods": methods,
        "target": {"ref_trials": ref, "value": target},
        "time_to_target": ratios,
        "published": hdbo.published_summary(published, checkpoints),
        "source": problem.source,
    }


def goals(summaries: Mapping[str, Mapping[str, Any]], alebo_at_50: float) -> list[dict[str, Any]]:
    """The issue's goals: ratio <= 0.5 per problem; Branin D=100 mean best at 50 below ALEBO."""
    out = []
    for name, summary in summaries.items():
        ratio = summary["time_to_target"].get("ours")
        ref = summary["target"]["ref_trials"]
        if ratio is not None:
            out.append(
                {
                    "goal": f"{name}: ours trials to reach mlos's best / {ref} <= {GOAL_RATIO}",
                    "value": ratio["mean_ratio"],
                    "passed": ratio["mean_ratio"] <= GOAL_RATIO,
                }
            )
    branin = summaries.get("branin-d100", {}).get("methods", {}).get("ours")
    if branin is not None and "50" in branin["checkpoints"]:
        value = branin["checkpoints"]["50"]["mean"]
        out.append(
            {
                "goal": f"branin-d100: ours mean best at 50 < ALEBO's {alebo_at_50:.4g}",
                "value": value,
                "passed": value < alebo_at_50,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.report is not None:
        print_report(json.loads(args.report.read_text()), args.markdown)
        return 0
    seeds = args.seeds or (QUICK_SEEDS if args.quick else FULL_SEEDS)
    limit_threads(args.threads)
    problems, skipped = build_problems(args.problems.split(","), args.data)
    methods, skipped_methods = _available_methods(args)
    settings = _settings(args, methods)
    skipped = {**skipped, **skipped_methods, **_left_out(problems, methods, args)}
    for name, reason in skipped.items():
        console.print(f"[yellow]skipping {name}: {escape(reason)}[/yellow]")
    meta = machine_info()
    meta.update(
        seeds=seeds,
        first_seed=args.first_seed,
        quick=args.quick,
        budget_override=args.budget,
        threads=args.threads,
    )
    meta.update(skipped=skipped, data=str(args.data), all_methods=args.all_methods)
    meta["settings"] = {**asdict(settings), "mlos_python": str(settings.mlos_python)}
    meta["embedding"] = {p.name: {**EMBEDDING, "dims": settings.embed_dims(p)} for p in problems}
    meta["expert_priors"] = {
        p.name: prior_knobs(p)
        for p in problems
        if any(m in PRIOR_METHODS for m in methods) and prior_knobs(p)
    }
    if "mlos" in methods:
        meta["mlos"] = _mlos_info(problems, settings)
    meta["failed"] = {}
    runs = _run_all(problems, methods, seeds, args, settings, meta["failed"])
    meta["load_note"] = load_note(meta["load_average"])
    published, alebo_at_50 = _published(args.data)
    summaries = {
        p.name: summarize(
            p,
            [r for r in runs if r.problem == p.name],
            _budget(p, args),
            published.get(p.published or ""),
        )
        for p in problems
    }
    data = {
        "benchmark": "llamatune",
        "meta": meta,
        "summary": summaries,
        "goals": goals(summaries, alebo_at_50),
        "runs": [asdict(r) for r in runs],
    }
    print_report(data, args.markdown)
    out = args.out or RESULTS_DIR
    console.print(f"wrote {write_json('llamatune', data, out)}")
    if not args.no_plot and summaries:
        console.print(f"wrote {plot(summaries, out / 'llamatune.png')}")
    return 0


# -- method runners ------------------------------------------------------------------------


def _run_ours(
    problem: KnobProblem,
    seed: int,
    budget: int,
    dims: int | None,
    on_eval: OnEval | None,
    priors: bool = False,
) -> tuple[list[float], dict[str, int]]:
    trials, sources = drive(
        study_spec(problem, seed, dims, priors),
        budget,
        lambda config: {problem.metric: problem.evaluate(config)},
        on_eval,
    )
    return [t.metrics[problem.metric] for t in trials], sources


def _run_skopt(problem: KnobProblem, seed: int, budget: int, on_eval: OnEval | None) -> list[float]:
    from skopt import gp_minimize
    from skopt.space import Categorical, Integer, Real

    dimensions: list[Any] = []
    for knob in problem.knobs:
        if knob["kind"] == "float":
            dimensions.append(Real(knob["low"], knob["high"], name=knob["name"]))
        elif knob["kind"] == "int":
            dimensions.append(Integer(knob["low"], knob["high"], name=knob["name"]))
        else:
            dimensions.append(Categorical(knob["choices"], name=knob["name"]))
    names = [k["name"] for k in problem.knobs]
    values: list[float] = []

    def objective(x: list[Any]) -> float:
        value = problem.evaluate({n: _scalar(v) for n, v in zip(names, x, strict=True)})
        values.append(value)
        _tick(on_eval)
        return problem.sign * value

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # repeated points, GP convergence notes
        gp_minimize(
            objective,
            dimensions,
            n_calls=budget,
            n_initial_points=min(N_INITIAL, budget),
            random_state=seed,
        )
    return values


def _run_optuna(
    problem: KnobProblem, seed: int, budget: int, on_eval: OnEval | None
) -> list[float]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=N_INITIAL)
    direction: Literal["minimize", "maximize"] = (
        "minimize" if problem.goal == "minimize" else "maximize"
    )
    study = optuna.create_study(direction=direction, sampler=sampler)
    values = []
    for _ in range(budget):
        trial = study.ask()
        config: dict[str, Scalar] = {}
        for knob in problem.knobs:
            name = knob["name"]
            if knob["kind"] == "float":
                config[name] = trial.suggest_float(name, knob["low"], knob["high"])
            elif knob["kind"] == "int":
                config[name] = trial.suggest_int(name, knob["low"], knob["high"])
            else:
                config[name] = trial.suggest_categorical(name, knob["choices"])
        value = problem.evaluate(config)
        study.tell(trial, value)
        values.append(value)
        _tick(on_eval)
    return values


def _run_random(
    problem: KnobProblem, seed: int, budget: int, on_eval: OnEval | None
) -> list[float]:
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(budget):
        config: dict[str, Scalar] = {}
        for knob in problem.knobs:
            if knob["kind"] == "float":
                config[knob["name"]] = float(rng.uniform(knob["low"], knob["high"]))
            elif knob["kind"] == "int":
                config[knob["name"]] = int(rng.integers(knob["low"], knob["high"], endpoint=True))
            else:
                config[knob["name"]] = knob["choices"][int(rng.integers(len(knob["choices"])))]
        values.append(problem.evaluate(config))
        _tick(on_eval)
    return values


# -- private helpers -------------------------------------------------------------------------


def _run_all(
    problems: list[KnobProblem],
    methods: tuple[str, ...],
    seeds: int,
    args: argparse.Namespace,
    settings: Settings,
    failed: dict[str, str],
) -> list[RunResult]:
    """Every (problem, seed, method) run; a failing mlos run is recorded in ``failed``.

    Each finished run is appended to ``<out>/llamatune-runs.jsonl`` at once, so hours of
    results survive an interruption; with ``--resume`` the runs already in that file (same
    budget) are taken from it instead of being run again. This is how the full benchmark is
    split over several sessions or processes (one ``--out`` folder each, or one after another).
    """
    first = args.first_seed
    plan = [(p, s, m) for p in problems for s in range(first, first + seeds) for m in methods]
    plan = [(p, s, m) for p, s, m in plan if cannot_run(m, p) is None]
    if not args.all_methods:
        plan = [(p, s, m) for p, s, m in plan if not_run(m, p, _budget(p, args)) is None]
    log = (args.out or RESULTS_DIR) / RUNS_LOG
    resume = args.resume or args.logged_only
    done = _logged_runs(log, {p.name: _budget(p, args) for p in problems}) if resume else {}
    runs: list[RunResult] = [done[(p.name, s, m)] for p, s, m in plan if (p.name, s, m) in done]
    plan = [(p, s, m) for p, s, m in plan if (p.name, s, m) not in done]
    if runs:
        console.print(f"resuming: {len(runs)} runs taken from {log}")
    if args.logged_only:
        missing = ", ".join(f"{p.name} seed {s} {m}" for p, s, m in plan)
        console.print(f"[yellow]--logged-only: not running {missing or 'nothing'}[/yellow]")
        plan = []
    log.parent.mkdir(parents=True, exist_ok=True)
    columns = [*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("llamatune", total=sum(_budget(p, args) for p, _, _ in plan))
        for problem, seed, method in plan:
            progress.update(task, description=f"{problem.name} seed {seed} {method}")
            budget = _budget(problem, args)
            try:
                run = run_method(
                    method, problem, seed, budget, settings, lambda: progress.advance(task)
                )
                runs.append(run)
                with log.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(asdict(run)) + "\n")
            except mlos_peer.PeerError as err:  # keep the other methods' hours of results
                failed[f"mlos on {problem.name} seed {seed}"] = str(err)[-2000:]
                why = escape(str(err))
                console.print(f"[red]mlos peer failed on {problem.name} seed {seed}: {why}[/]")
    return runs


def _logged_runs(log: Path, budgets: Mapping[str, int]) -> dict[tuple[str, int, str], RunResult]:
    """``(problem, seed, method) -> run`` from a runs log, for runs of the current budgets."""
    if not log.exists():
        return {}
    out = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        run = RunResult(**json.loads(line))
        if budgets.get(run.problem) == len(run.best):
            out[(run.problem, run.seed, run.method)] = run
    return out


def _left_out(
    problems: list[KnobProblem], methods: tuple[str, ...], args: argparse.Namespace
) -> dict[str, str]:
    """``"method on problem" -> reason`` for the pairs not run (by default, or at all)."""
    out = {}
    for problem in problems:
        for method in methods:
            reason = cannot_run(method, problem)
            if reason is None and not args.all_methods:
                reason = not_run(method, problem, _budget(problem, args))
            if reason is not None:
                out[f"{method} on {problem.name}"] = reason
    return out


def _budget(problem: KnobProblem, args: argparse.Namespace) -> int:
    return int(args.budget or (problem.quick_budget if args.quick else problem.budget))


def _available_methods(args: argparse.Namespace) -> tuple[tuple[str, ...], dict[str, str]]:
    methods = tuple(args.methods.split(","))
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method {unknown[0]!r}; expected one of {METHODS}")
    skipped = {}
    if "mlos" in methods:
        try:
            mlos_peer.probe(args.mlos_python)
        except mlos_peer.PeerUnavailable as err:
            skipped["mlos"] = str(err)
    if "optuna" in methods:
        try:
            import optuna  # noqa: F401
        except ImportError:
            skipped["optuna"] = "optuna is not installed (pip install -e '.[dev]')"
    return tuple(m for m in methods if m not in skipped), skipped


def _settings(args: argparse.Namespace, methods: tuple[str, ...]) -> Settings:
    return Settings(
        dims=args.dims,
        mlos_python=args.mlos_python,
        mlos_special=args.mlos_special,
        threads=args.threads,
    )


def _mlos_info(problems: list[KnobProblem], settings: Settings) -> dict[str, Any]:
    pairs = [(p, settings.embed_dims(p)) for p in problems]
    info = mlos_peer.describe(pairs, settings.mlos_python, settings.mlos_special)
    handling = "; ".join(f"{p} {d['handling']}" for p, d in info["special_values"].items())
    note = (
        "mlos-core 0.6.2 biasing bug monkeypatched in the child, llamatune_db.md §3.4b"
        if settings.mlos_special == "patch"
        else "special values not passed to mlos"
    )
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    console.print(f"mlos peer: {versions}; special values: {handling} ({note})", markup=False)
    return info


def _published(data_dir: Path) -> tuple[dict[str, dict[str, PublishedCurve]], float]:
    if not (data_dir / hdbo.CURVES_CSV).is_file():
        console.print(f"[yellow]no published curves: {data_dir / hdbo.CURVES_CSV} not found[/]")
        return {}, ALEBO_BRANIN_AT_50
    published = hdbo.read_published(data_dir)
    alebo = published.get("Branin, D=100", {}).get("ALEBO")
    at_50 = alebo.at(50) if alebo is not None else None
    return published, ALEBO_BRANIN_AT_50 if at_50 is None else at_50


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "median": statistics.median(values),
    }


def _floats(best: list[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in best]


def _scalar(value: Any) -> Scalar:
    """numpy scalars from skopt as Python scalars."""
    out: Scalar = value.item() if hasattr(value, "item") else value
    return out


def _tick(on_eval: OnEval | None) -> None:
    if on_eval is not None:
        on_eval()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.llamatune",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--quick", action="store_true", help=f"{QUICK_SEEDS} seeds, short budgets")
    add("--seeds", type=int, help=f"runs per method and problem (default {FULL_SEEDS})")
    add(
        "--first-seed",
        type=int,
        default=0,
        help="run seeds FIRST .. FIRST+N-1 (to split a run over processes or machines)",
    )
    add("--problems", default=",".join(PROBLEMS), help="comma-separated")
    add("--methods", default=",".join(METHODS), help="comma-separated")
    add("--budget", type=int, help="override every problem's budget")
    add(
        "--all-methods",
        action="store_true",
        help="also ours-full/-priors above 20 knobs and skopt above 100 trials (hours per run)",
    )
    add("--dims", type=int, help="override the embedding dimension (ours and mlos)")
    add("--threads", type=int, help="torch/BLAS threads here and in the mlos peer")
    add("--data", type=Path, default=DEFAULT_DATA, help="the shared/benchdata folder")
    add(
        "--mlos-python",
        type=Path,
        default=mlos_peer.DEFAULT_PYTHON,
        help="interpreter of the mlos-core environment (bench/setup_mlos.sh)",
    )
    add(
        "--mlos-special",
        choices=mlos_peer.SPECIAL_MODES,
        default="patch",
        help="mlos special values: monkeypatched bias (default) or none",
    )
    add("--out", type=Path, help="results folder (default bench/results)")
    add("--no-plot", action="store_true", help="skip the PNG")
    add("--markdown", action="store_true", help="print tables as Markdown")
    add("--report", type=Path, help="only print the tables of a results file")
    add(
        "--logged-only",
        action="store_true",
        help="with --resume: tables from the logged runs only, running none of the missing",
    )
    add(
        "--resume",
        action="store_true",
        help=f"take runs already in <out>/{RUNS_LOG} instead of running them again",
    )
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
