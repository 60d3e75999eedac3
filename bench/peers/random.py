"""Random search: each knob drawn uniformly as the knob is scaled, or the candidates shuffled.

Knob spaces: ``_common.random_config`` (float and int knobs uniform on their scale, log-scaled
ones log-uniform; categorical, bool and ordinal knobs uniform over their values), from
``numpy.random.default_rng(seed)``. Candidate lists: the candidates in a seeded random order
without repeats (``Tracker.fill``; as ``bench/cloud.py``'s random search), starting over in
the same order when the budget exceeds the list. Reported best: the best completed feasible
measurement so far.
"""

from __future__ import annotations

import numpy as np

from bench.contract import MethodRun, SuiteProblem
from bench.peers._common import OnEval, Tracker, random_config

NAME = "random"


def available() -> str | None:
    """Always usable (numpy only)."""
    return None


def run(problem: SuiteProblem, seed: int, budget: int, on_eval: OnEval | None = None) -> MethodRun:
    """One random-search run of ``budget`` evaluations."""
    tracker = Tracker(NAME, problem, seed, budget, on_eval)
    if problem.candidates:
        tracker.fill(note=None)
        return tracker.result()
    rng = np.random.default_rng(seed)
    while not tracker.done:
        tracker.measure(random_config(tracker.space, rng))
    return tracker.result()
