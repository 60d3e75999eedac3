"""Optuna's TPE sampler as a peer: ``TPESampler(seed=seed, n_startup_trials=10)``, ask/tell.

Everything but the sampler (encoding, candidate lists, constraints through
``Trial.set_constraint``, failed and infeasible measurements as ``FAIL``, the reported best)
is ``bench/peers/_optuna.py``. TPE's other settings are Optuna's defaults (independent,
not multivariate; constant liar is irrelevant to sequential runs).
"""

from __future__ import annotations

from typing import Any

from bench.contract import MethodRun, SuiteProblem
from bench.peers._common import OnEval
from bench.peers._optuna import N_STARTUP, run_optuna
from bench.peers._optuna import available as available

NAME = "optuna-tpe"


def run(problem: SuiteProblem, seed: int, budget: int, on_eval: OnEval | None = None) -> MethodRun:
    """One run of ``budget`` evaluations."""
    return run_optuna(NAME, _sampler, problem, seed, budget, on_eval)


def _sampler(seed: int) -> Any:
    import optuna

    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=N_STARTUP)
