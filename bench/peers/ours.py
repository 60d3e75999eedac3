"""Our designer on a suite problem, through the one trial loop the service uses.

The problem becomes a ``StudySpec``: its knobs, objective and outcome constraints, its
candidates and their features, and for problems with ``embed_dims`` the LlamaTune embedding
``{kind = "llamatune", dims, special_bias = 0.2, buckets = 10000}``; product defaults
otherwise (``designer = {algorithm = "bo", seed}``). ``runner.loop.run_trials`` then runs it
exactly as a client of the server would: each trial stores its step kind, resolved
constraints and embedded point, one suggestion at a time, with a warm-starting fit cache.
Each measurement is ``problem.measure`` with the run's generator; a measurement that broke
the system is INFEASIBLE, a failed one FAILED. After each evaluation ours reports the
configuration the server's ``GetBestTrial`` reports for the trials so far
(``tuner.confirmation.best_of``: the best measured value, the objective GP's outliers set
aside; the runs before issue 57 reported the best measured value, ``tuner.trial.best_trial``).
The run's full log keeps each trial's step (``MethodRun.generators``).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from bench.common import Measured
from bench.contract import Measurement, MethodRun, SuiteProblem, run_rng
from runner.loop import run_trials
from runner.memory import MemoryAPI
from tuner.confirmation import best_of
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

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


def study_spec(
    problem: SuiteProblem, seed: int, designer: Mapping[str, Any] | None = None
) -> StudySpec:
    """The problem as our study (module doc); ``designer``: settings on top of the defaults
    (a variant's, e.g. ``ours-portfolio``)."""
    data: dict[str, Any] = {
        "name": re.sub(r"[^A-Za-z0-9_.-]", "_", problem.name),  # no ':' or '~' in study names
        "knobs": list(problem.knobs),
        "objectives": [{"name": problem.objective, "goal": problem.goal}],
        "outcome_constraints": list(problem.constraints),
        "designer": {"algorithm": "bo", "seed": seed, **(designer or {})},
    }
    if problem.candidates:
        data["candidates"] = list(problem.candidates)
        data["candidate_features"] = list(problem.candidate_features)
    if problem.embed_dims is not None:
        data["embedding"] = {**EMBEDDING, "dims": problem.embed_dims}
    return StudySpec.from_dict(data)


def run(
    problem: SuiteProblem,
    seed: int,
    budget: int,
    on_eval: Callable[[], None] | None = None,
    designer: Mapping[str, Any] | None = None,
    name: str = NAME,
) -> MethodRun:
    """``budget`` trials of our designer (module doc), named ``name`` in the logs."""
    return run_study(problem, study_spec(problem, seed, designer), seed, budget, on_eval, name)[0]


def run_study(
    problem: SuiteProblem,
    spec: StudySpec,
    seed: int,
    budget: int,
    on_eval: Callable[[], None] | None = None,
    name: str = NAME,
    api: MemoryAPI | None = None,
) -> tuple[MethodRun, list[Trial]]:
    """``budget`` new trials of ``spec`` on ``problem`` in ``api`` (a new store by default;
    one holding the study's transfer sources, or trials imported into it), and the study's
    trials. The reported configuration is ``best_of`` the study's trials so far, imported
    ones included."""
    api = api if api is not None else MemoryAPI()
    api.create_study(spec)
    before = api.list_trials(spec.name)
    rng = run_rng(problem.name, seed)
    measurements: list[Measurement] = []

    def measure(config: Config) -> Measured:
        measurement = problem.measure(config, rng)
        measurements.append(measurement)
        status = STATUS[measurement.status]
        if status is TrialStatus.COMPLETED:
            return Measured(dict(measurement.metrics))
        return Measured({}, status, f"the measurement was {measurement.status}")

    def tick(trial: Trial) -> None:
        if on_eval is not None:
            on_eval()

    start = time.perf_counter()
    trials = run_trials(spec, measure, budget + len(before), api=api, on_trial=tick)
    seconds = time.perf_counter() - start
    new = trials[len(before) :]
    reported: list[Config | None] = []
    for i in range(len(new)):
        best = best_of(spec, [*before, *new[: i + 1]], ()).trial
        reported.append(None if best is None else dict(best.config))
    steps = Counter(t.step.value for t in new)
    steps["warnings"] = sum(bool(t.warning) for t in new)
    run = MethodRun(
        method=name,
        problem=problem.name,
        seed=seed,
        configs=[dict(t.config) for t in new],
        measurements=measurements,
        reported=reported,
        seconds=seconds,
        notes=dict(steps),
        generators=[t.step.value for t in new],
    )
    return run, trials
