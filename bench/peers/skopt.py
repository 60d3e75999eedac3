"""scikit-optimize's GP ``Optimizer`` as a peer, one ask/tell per proposal.

``Optimizer(dimensions, base_estimator="GP", n_initial_points=min(10, budget),
random_state=seed)``, skopt's defaults otherwise (Matern kernel, ``gp_hedge`` acquisition,
``sampling`` acquisition optimizer when a categorical dimension is present, ``lbfgs``
otherwise). Dimensions (``_common.Encoding``): float knobs ``Real``, int knobs ``Integer``
(``prior="log-uniform"`` for log-scaled ones), categorical and bool knobs ``Categorical``
over their value indices, ordinal knobs ``Integer`` over their level indices; a candidate
list one ``Categorical`` over the candidates' indices (a repeated candidate is answered from
its earlier measurement, ``_common.Tracker.propose``).

skopt knows no constraints: it is told ``sign * value`` for a feasible measurement and, for
a measurement that breaks a constraint, breaks the system or fails, the worst value measured
so far in the run (``_common.BadValues``; held back until the first value exists). Reported
best: the best completed feasible measurement so far.
"""

from __future__ import annotations

from typing import Any

from bench.contract import MethodRun, SuiteProblem
from bench.peers._common import BadValues, Dim, Encoding, OnEval, Tracker, missing, quiet

NAME = "skopt"
N_INITIAL = 10


def available() -> str | None:
    """None when scikit-optimize imports."""
    return missing("skopt", "a dependency of the project: pip install -e .")


def run(problem: SuiteProblem, seed: int, budget: int, on_eval: OnEval | None = None) -> MethodRun:
    """One run of ``budget`` evaluations."""
    from skopt import Optimizer

    tracker = Tracker(NAME, problem, seed, budget, on_eval)
    encoding = Encoding(problem)
    names = [d.name for d in encoding.dims]
    bad = BadValues(tracker.judge)
    with quiet():  # repeated-point and GP convergence warnings
        optimizer = Optimizer(
            [_dimension(d) for d in encoding.dims],
            base_estimator="GP",
            n_initial_points=min(N_INITIAL, budget),
            random_state=seed,
        )
        while not tracker.done:
            if tracker.stalled:
                tracker.fill()
                break
            point = optimizer.ask()
            measurement, _ = tracker.propose(encoding.decode(dict(zip(names, point, strict=True))))
            tells = bad.add(point, measurement)
            if tells:
                optimizer.tell([p for p, _ in tells], [v for _, v in tells])
    return tracker.result()


def _dimension(dim: Dim) -> Any:
    from skopt.space import Categorical, Integer, Real

    prior = "log-uniform" if dim.log else "uniform"
    if dim.kind == "float":
        return Real(dim.low, dim.high, prior=prior, name=dim.name)
    if dim.kind in ("int", "ordinal"):
        return Integer(int(dim.low), int(dim.high), prior=prior, name=dim.name)
    return Categorical(list(range(int(dim.high) + 1)), name=dim.name)
