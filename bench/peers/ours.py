"""Our designer on a suite problem (TEMPORARY: the lead engineer's runner replaces this file).

Written so that ``bench.suite`` runs end to end before the real runner lands; it follows
``bench/methods.py``'s ``drive``: the problem becomes a ``StudySpec`` (knobs, objective,
outcome constraints, candidates and their features, and for problems with ``embed_dims``
the LlamaTune embedding ``{kind = "llamatune", dims, special_bias = 0.2, buckets = 10000}``),
``make_designer(spec, FitCache())`` suggests one configuration at a time, each measurement
(``problem.measure`` with the run's generator) is stored as a ``tuner.trial.Trial``
(COMPLETED / INFEASIBLE / FAILED, with its source and embedded point), and the reported
best after each evaluation is ``tuner.trial.best_trial``'s configuration. Product defaults
otherwise (``designer = {algorithm = "bo", seed}``).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.contract import Measurement, MethodRun, SuiteProblem, run_rng
from tuner.designer import FitCache, make_designer
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus, best_trial

NAME = "ours"
EMBEDDING = {"kind": "llamatune", "special_bias": 0.2, "buckets": 10_000}
STATUS = {
    "completed": TrialStatus.COMPLETED,
    "infeasible": TrialStatus.INFEASIBLE,
    "failed": TrialStatus.FAILED,
}


def available() -> str | None:
    """Always usable."""
    return None


def study_spec(problem: SuiteProblem, seed: int) -> StudySpec:
    """The problem as our study (module doc)."""
    data: dict[str, Any] = {
        "name": re.sub(r"[^A-Za-z0-9_.-]", "_", problem.name),  # no ':' or '~' in study names
        "knobs": list(problem.knobs),
        "objectives": [{"name": problem.objective, "goal": problem.goal}],
        "outcome_constraints": list(problem.constraints),
        "designer": {"algorithm": "bo", "seed": seed},
    }
    if problem.candidates:
        data["candidates"] = list(problem.candidates)
        data["candidate_features"] = list(problem.candidate_features)
    if problem.embed_dims is not None:
        data["embedding"] = {**EMBEDDING, "dims": problem.embed_dims}
    return StudySpec.from_dict(data)


def run(
    problem: SuiteProblem, seed: int, budget: int, on_eval: Callable[[], None] | None = None
) -> MethodRun:
    """``budget`` sequential suggest/measure steps of our designer."""
    spec = study_spec(problem, seed)
    designer = make_designer(spec, FitCache())
    rng = run_rng(problem.name, seed)
    trials: list[Trial] = []
    measurements: list[Measurement] = []
    reported: list[Config | None] = []
    sources: Counter[str] = Counter()
    start = time.perf_counter()
    for i in range(budget):
        suggestion = designer.suggest(1, trials, [])[0]
        sources[suggestion.source] += 1
        sources["warnings"] += bool(suggestion.warning)
        measurement = problem.measure(suggestion.config, rng)
        measurements.append(measurement)
        trials.append(
            Trial(
                id=i + 1,
                config=suggestion.config,
                status=STATUS[measurement.status],
                metrics=dict(measurement.metrics) if measurement.status == "completed" else {},
                source=suggestion.source,
                warning=suggestion.warning,
                embedded=suggestion.embedded,
            )
        )
        best = best_trial(spec, trials)
        reported.append(None if best is None else dict(best.config))
        if on_eval is not None:
            on_eval()
    return MethodRun(
        method=NAME,
        problem=problem.name,
        seed=seed,
        configs=[dict(t.config) for t in trials],
        measurements=measurements,
        reported=reported,
        seconds=time.perf_counter() - start,
        notes=dict(sources),
    )
