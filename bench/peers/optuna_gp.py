"""Optuna's GP sampler as a peer: ``GPSampler(seed=seed, n_startup_trials=10)``, ask/tell.

Everything but the sampler is ``bench/peers/_optuna.py``. With constraints GPSampler fits
one GP per constraint value and maximizes log constrained EI. Parameters outside its
intersection search space (the conditional knobs of a candidate list) are drawn by its
independent sampler, ``RandomSampler(seed)``; the warning it logs for each is turned off.

Wide int knobs: GPSampler lists every value of an int parameter when it optimizes its
acquisition function (``optuna/_gp/search_space.py``, ``np.arange(low, high + 1)``), which
for ``innodb_buffer_pool_size``'s 5.3e9 values asks for 40 GiB. An int knob with more than
``MAX_INT_VALUES`` values is therefore suggested with ``suggest_float`` (log-scaled when the
knob is) and rounded, as an Optuna user would have to; TPE keeps ``suggest_int``.
"""

from __future__ import annotations

from typing import Any

from bench.contract import MethodRun, SuiteProblem
from bench.peers._common import MAX_INT_VALUES, OnEval
from bench.peers._optuna import N_STARTUP, run_optuna
from bench.peers._optuna import available as available

NAME = "optuna-gp"


def run(problem: SuiteProblem, seed: int, budget: int, on_eval: OnEval | None = None) -> MethodRun:
    """One run of ``budget`` evaluations."""
    return run_optuna(NAME, _sampler, problem, seed, budget, on_eval, MAX_INT_VALUES)


def _sampler(seed: int) -> Any:
    import optuna

    return optuna.samplers.GPSampler(
        seed=seed, n_startup_trials=N_STARTUP, warn_independent_sampling=False
    )
