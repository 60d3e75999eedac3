"""Scoring of the suite: curves of true values, checkpoints, time to target, ranks, summary.

A run is scored on the **true** (noise-free) value of the configuration it reports as its
best after each evaluation: ``curve[i] = problem.true_value(run.reported[i])``. A report of
None (no feasible measurement yet) or of a configuration that is infeasible counts as the
problem's **worst** value: the worst true value any run of any method reported on that
problem (so the mean stays finite and no feasible point is never better than one).

Runs are scored once, when they end (``score_run``): a ``ScoredRun`` keeps the curve, the
seconds and the notes, which is all the tables need; it is what the committed curves log
holds (``bench/suite.py``), so peers' results are stored once and rescored never.

Per problem (``summarize_problem``), for every method: the mean (and std) of the curve over
seeds at the checkpoints (``[suite] checkpoints`` within the budget, plus the budget);
**target** = the best peer's mean at ``ref = min(100, budget)`` (peers: every method whose
name does not start with ``ours``); **time to target** = per seed, the first evaluation at
which the curve is at least as good as the target, divided by ``ref``; a seed that never
gets there counts as the whole budget (the table shows ``>=``); and the **mean rank** of
each method at each checkpoint (per seed over the seeds every method ran, ties sharing the
mean rank, then averaged over seeds).

Over problems (``summarize_suite``), for each ``ours*`` method: the fraction of problems
where its mean at ``ref`` reaches the target; the median over problems of its mean
time-to-target ratio; the fraction where its mean at 25 and at 50 evaluations is no worse than
the best peer's mean there (``keeps_up``: the early race, where the best peer may be another
one than at ``ref``); every method's mean rank at 25/50/100 evaluations (at the budget on
problems whose budget is smaller); and on each noisy twin whether its mean true value beats
every peer's (strictly) at 50 and 100 evaluations (or the budget). Methods that did not run
on every problem (a slow peer on part of the suite) make those averages cover different
problems, and ranks among fewer methods: the reach and the ranks are also given over the
``complete`` problems, those every method ran, where every rank is among all methods.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.contract import MethodRun, SuiteProblem
from tuner.space import Config

REF_TRIALS = 100
SUMMARY_AT = (25, 50, 100)
TWIN_AT = (50, 100)
KEEP_UP_AT = (25, 50)
TOLERANCE = 1e-9

Curve = list[float | None]
DIGITS = 12  # significant digits a stored curve keeps (TOLERANCE is 1e-9 relative)


@dataclass
class ScoredRun:
    """A run as the tables see it: the true value of its reported best after each evaluation.

    Attributes:
        curve: ``true_curve`` of the run, rounded to ``DIGITS`` significant digits.
        seconds: Wall time of the run.
        notes: The run's counters (``MethodRun.notes``).
    """

    method: str
    problem: str
    seed: int
    curve: Curve
    seconds: float
    notes: dict[str, int] = field(default_factory=dict)


def score_run(problem: SuiteProblem, run: MethodRun, cache: dict[str, float | None]) -> ScoredRun:
    """``run`` scored on ``problem`` (``cache``: true values by ``curve_key``)."""
    values = true_curve(problem, run, cache)
    curve = [None if v is None else float(f"{v:.{DIGITS}g}") for v in values]
    return ScoredRun(run.method, run.problem, run.seed, curve, run.seconds, dict(run.notes))


def is_peer(method: str) -> bool:
    """Peers are every method but ours and its variants (names starting with ``ours``)."""
    return not method.startswith("ours")


def checkpoints(budget: int, marks: Iterable[int]) -> list[int]:
    """The marks within ``budget``, plus the budget."""
    return sorted({*(m for m in marks if m <= budget), budget})


def true_curve(problem: SuiteProblem, run: MethodRun, cache: dict[str, float | None]) -> Curve:
    """``true_value`` of each reported configuration (None: none yet, or infeasible)."""
    out: Curve = []
    for config in run.reported:
        out.append(None if config is None else _true_value(problem, config, cache))
    return out


def worst_value(curves: Iterable[Curve], sign: float) -> float | None:
    """The worst value in any curve (None when every entry is None)."""
    values = [v for curve in curves for v in curve if v is not None]
    return max(values, key=lambda v: sign * v) if values else None


def filled(curve: Curve, worst: float) -> list[float]:
    """``curve`` with None replaced by ``worst``."""
    return [worst if v is None else v for v in curve]


def reaches(value: float, target: float, sign: float) -> bool:
    """``value`` is at least as good as ``target`` (within a relative ``TOLERANCE``)."""
    return sign * value <= sign * target + TOLERANCE * max(1.0, abs(target))


def trials_to_reach(curve: Curve, target: float, sign: float) -> int | None:
    """First evaluation (1-based) whose value reaches ``target``, or None."""
    for i, value in enumerate(curve):
        if value is not None and reaches(value, target, sign):
            return i + 1
    return None


def time_to_target(curves: Sequence[Curve], target: float, sign: float, ref: int) -> dict[str, Any]:
    """Per seed: trials to reach ``target``; their mean over ``ref`` (unreached: the budget)."""
    trials = [trials_to_reach(c, target, sign) for c in curves]
    ratios = [(len(c) if t is None else t) / ref for t, c in zip(trials, curves, strict=True)]
    return {
        "trials": trials,
        "mean_ratio": statistics.fmean(ratios),
        "reached": sum(t is not None for t in trials),
        "seeds": len(trials),
    }


def mean_ranks(values: Mapping[str, Mapping[int, float]], sign: float) -> dict[str, float]:
    """Mean over common seeds of each method's rank (1 = best; ties share the mean rank).

    Args:
        values: method -> seed -> value.
    """
    methods = list(values)
    seeds = set.intersection(*(set(v) for v in values.values())) if values else set()
    if not seeds:
        return {}
    totals = dict.fromkeys(methods, 0.0)
    for seed in seeds:
        scores = {m: sign * values[m][seed] for m in methods}
        for m in methods:
            better = sum(scores[o] < scores[m] for o in methods)
            ties = sum(scores[o] == scores[m] for o in methods)
            totals[m] += better + (ties + 1) / 2
    return {m: totals[m] / len(seeds) for m in methods}


def summarize_problem(
    problem: SuiteProblem, runs: Sequence[ScoredRun], marks: Iterable[int]
) -> dict[str, Any]:
    """Checkpoint means, target, time to target, ranks and normalized curves of one problem."""
    sign = problem.sign
    raw: dict[str, dict[int, Curve]] = {}
    seconds: dict[str, list[float]] = {}
    for run in sorted(runs, key=lambda r: (r.method, r.seed)):
        raw.setdefault(run.method, {})[run.seed] = list(run.curve)
        seconds.setdefault(run.method, []).append(run.seconds)
    budget = min((len(c) for by in raw.values() for c in by.values()), default=problem.budget)
    raw = {m: {s: c[:budget] for s, c in by.items()} for m, by in raw.items()}
    marks = checkpoints(budget, marks)
    worst = worst_value((c for by in raw.values() for c in by.values()), sign)
    out: dict[str, Any] = {
        "objective": problem.objective,
        "goal": problem.goal,
        "family": problem.family,
        "budget": budget,
        "checkpoints": marks,
        "optimum": problem.optimum,
        "worst": worst,
        "methods": {},
        "target": None,
        "ranks": {},
    }
    if worst is None:
        return out  # no run reported a feasible configuration: nothing to score
    curves = {m: {s: filled(c, worst) for s, c in by.items()} for m, by in raw.items()}
    for method, by in curves.items():
        out["methods"][method] = {
            "seeds": sorted(by),
            "at": {str(c): _stats([v[c - 1] for v in by.values()]) for c in marks},
            "no_feasible": {
                str(c): sum(v[c - 1] is None for v in raw[method].values()) for c in marks
            },
            "mean_curve": [statistics.fmean(col) for col in zip(*by.values(), strict=True)],
            "seconds_per_run": statistics.fmean(seconds[method]),
        }
    common = set.intersection(*(set(by) for by in curves.values()))
    out["rank_seeds"] = len(common)
    out["ranks"] = {
        str(c): mean_ranks(
            {m: {s: v[c - 1] for s, v in by.items()} for m, by in curves.items()}, sign
        )
        for c in marks
    }
    ref = min(REF_TRIALS, budget)
    peers = {m: out["methods"][m]["at"][str(ref)]["mean"] for m in curves if is_peer(m)}
    if peers:
        best = min(peers, key=lambda m: sign * peers[m])
        out["target"] = {"ref": ref, "value": peers[best], "by": best}
        out["time_to_target"] = {
            m: time_to_target(list(raw[m].values()), peers[best], sign, ref) for m in curves
        }
    out["normalized"] = _normalized(out, sign)
    return out


def summarize_suite(summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Over problems: ours' reach fraction and median ratio, mean ranks (all problems, and
    each family's: ``family_ranks``, with ``family_problems`` counting each method's), noisy
    twins; the same reach and ranks again over the problems every method ran
    (``complete``)."""
    methods = sorted({m for s in summaries.values() for m in s["methods"]})
    complete = [
        n for n, s in summaries.items() if s["methods"] and set(s["methods"]) == set(methods)
    ]
    out: dict[str, Any] = {
        "ours": _reach(summaries, methods),
        "ranks": _suite_ranks(summaries),
        "rank_problems": _ranked_problems(summaries, methods),
        "complete": complete,
        "twins": {},
    }
    families = sorted({s["family"] for s in summaries.values() if s["methods"]})
    by_family = {f: {n: s for n, s in summaries.items() if s["family"] == f} for f in families}
    out["family_ranks"] = {f: _suite_ranks(chosen) for f, chosen in by_family.items()}
    out["family_problems"] = {
        f: _ranked_problems(chosen, methods) for f, chosen in by_family.items()
    }
    chosen = {n: summaries[n] for n in complete}
    out["ours_complete"] = _reach(chosen, methods)
    out["ranks_complete"] = _suite_ranks(chosen)
    for name, summary in summaries.items():
        if "~" in name and summary["methods"]:
            out["twins"][name] = _twin(summary, [m for m in methods if not is_peer(m)])
    return out


def _reach(summaries: Mapping[str, Mapping[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """For each ``ours*`` method: problems with a target it ran, the fraction where its mean
    at ``ref`` reaches the target, the median of its mean time-to-target ratios, and
    ``keeps_up``: at each of ``KEEP_UP_AT`` (the budget where it is smaller), the fraction of
    those problems where its mean is no worse than the best peer's mean there."""
    out: dict[str, Any] = {}
    for method in (m for m in methods if not is_peer(m)):
        reached, ratios = [], []
        kept: dict[str, list[bool]] = {str(at): [] for at in KEEP_UP_AT}
        for summary in summaries.values():
            target = summary.get("target")
            if target is None or method not in summary["methods"]:
                continue
            mean = summary["methods"][method]["at"][str(target["ref"])]["mean"]
            reached.append(reaches(mean, target["value"], _sign(summary)))
            ratios.append(summary["time_to_target"][method]["mean_ratio"])
            for at in KEEP_UP_AT:
                mark = min(at, summary["budget"])
                if str(mark) in summary["methods"][method]["at"]:  # a checkpoint of the suite
                    kept[str(at)].append(_keeps_up(summary, method, mark))
        out[method] = {
            "problems": len(reached),
            "reach_fraction": statistics.fmean(reached) if reached else None,
            "median_ratio": statistics.median(ratios) if ratios else None,
            "keeps_up": {at: statistics.fmean(v) if v else None for at, v in kept.items()},
        }
    return out


def _keeps_up(summary: Mapping[str, Any], method: str, at: int) -> bool:
    """Whether ``method``'s mean at ``at`` is at least the best peer's mean there."""
    by = summary["methods"]
    sign = _sign(summary)
    peers = [by[m]["at"][str(at)]["mean"] for m in by if is_peer(m)]
    best = min(peers, key=lambda v: sign * v)
    return reaches(by[method]["at"][str(at)]["mean"], best, sign)


def _ranked_problems(
    summaries: Mapping[str, Mapping[str, Any]], methods: Sequence[str]
) -> dict[str, int]:
    """For each method, the number of ``summaries`` that rank it at their budget."""
    return {
        m: sum(m in s["ranks"].get(str(s["budget"]), {}) for s in summaries.values())
        for m in methods
    }


def _suite_ranks(summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Each method's mean over problems of its rank at 25/50/100 (or the budget)."""
    out: dict[str, dict[str, float]] = {}
    for at in SUMMARY_AT:
        ranks: dict[str, list[float]] = {}
        for summary in summaries.values():
            mark = str(min(at, summary["budget"]))
            for method, rank in summary["ranks"].get(mark, {}).items():
                ranks.setdefault(method, []).append(rank)
        out[str(at)] = {m: statistics.fmean(r) for m, r in ranks.items()}
    return out


def curve_key(config: Config) -> str:
    """A hashable key of a configuration."""
    return json.dumps(config, sort_keys=True, default=str)


# -- private helpers -------------------------------------------------------------------------


def _true_value(
    problem: SuiteProblem, config: Config, cache: dict[str, float | None]
) -> float | None:
    key = curve_key(config)
    if key not in cache:
        cache[key] = problem.true_value(config)
    return cache[key]


def _twin(summary: Mapping[str, Any], ours: Sequence[str]) -> dict[str, dict[str, bool | None]]:
    """Per ours method and mark: its mean beats every peer's (None without peers)."""
    sign, out = _sign(summary), {}
    for method in ours:
        if method not in summary["methods"]:
            continue
        cells: dict[str, bool | None] = {}
        for at in TWIN_AT:
            mark = str(min(at, summary["budget"]))
            mine = summary["methods"][method]["at"][mark]["mean"]
            others = [s["at"][mark]["mean"] for m, s in summary["methods"].items() if is_peer(m)]
            cells[str(at)] = all(sign * mine < sign * o for o in others) if others else None
        out[method] = cells
    return out


def _normalized(summary: Mapping[str, Any], sign: float) -> dict[str, list[float]]:
    """Mean curves as (value - best) / (worst - best); best = the known optimum if any."""
    worst = summary["worst"]
    curves = {m: s["mean_curve"] for m, s in summary["methods"].items()}
    best = summary["optimum"]
    if best is None:
        best = min((v for c in curves.values() for v in c), key=lambda v: sign * v)
    span = sign * (worst - best)
    if span <= 0:
        return {m: [0.0] * len(c) for m, c in curves.items()}
    return {m: [sign * (v - best) / span for v in c] for m, c in curves.items()}


def _sign(summary: Mapping[str, Any]) -> float:
    return 1.0 if summary["goal"] == "minimize" else -1.0


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "median": statistics.median(values),
    }
