"""Ax as a peer: its ``Client`` with the default generation strategy, one trial at a time.

ax-platform 1.3.1 (the release whose ``botorch`` pin, ``>=0.18.1,<0.18.2``, admits the
project's botorch; installed with the dev extra without changing torch, botorch or
gpytorch). ``Client(random_seed=seed)``; ``configure_experiment`` with one parameter per
knob and ``configure_optimization`` with the objective and the outcome constraints; no
``configure_generation_strategy``, so Ax chooses its default (a Sobol initialization, the
center point first, then BoTorch modular BO).

Parameters (``_common.Encoding``): float and int knobs ``RangeParameterConfig`` (``scaling=
"log"`` for log-scaled ones; an int knob with more than ``MAX_INT_VALUES`` values as a
float range, rounded: with int parameters, a run on sysbench-20 was killed for memory at
23.6 GB); categorical and bool knobs an unordered ``ChoiceParameterConfig`` over their value
indices, ordinal knobs an ordered one; a candidate list one unordered
choice over the candidates' indices (a repeated candidate is completed with its earlier
measurement without using the budget, ``Tracker.propose``). Metric names are given to Ax as
``objective``, ``c0``, ``c1``, ... so that any metric name survives Ax's expression parser.

Measurements: completed -> ``complete_trial`` with the objective and every constrained metric
measured; ``infeasible`` (the configuration broke the system) -> ``mark_trial_abandoned``
(Ax does not suggest an abandoned arm again); ``failed`` (says nothing about the
configuration) -> ``mark_trial_failed`` (Ax may suggest it again).

Reported best: what Ax itself reports, ``get_best_parameterization()`` (model predictions,
its default; never an arm observed to break a constraint), after every evaluation; None
while Ax has none.
"""

from __future__ import annotations

import logging
from typing import Any

from bench.contract import MethodRun, SuiteProblem
from bench.peers._common import (
    MAX_INT_VALUES,
    Dim,
    Encoding,
    Judge,
    OnEval,
    Tracker,
    missing,
    quiet,
)
from tuner.space import Config

NAME = "ax"
OBJECTIVE = "objective"


def available() -> str | None:
    """None when ax-platform imports."""
    return missing("ax", "in the dev extra: pip install -e '.[dev]'")


def run(problem: SuiteProblem, seed: int, budget: int, on_eval: OnEval | None = None) -> MethodRun:
    """One run of ``budget`` evaluations."""
    Client, handler = _import_ax()
    level = handler.level
    handler.setLevel(logging.ERROR)  # notes on model fit quality at every step otherwise
    try:
        tracker = Tracker(NAME, problem, seed, budget, on_eval)
        encoding = Encoding(problem)
        with quiet():
            client = Client(random_seed=seed)
            client.configure_experiment(parameters=[_parameter(d) for d in encoding.dims])
            client.configure_optimization(
                objective=OBJECTIVE if problem.goal == "maximize" else f"-{OBJECTIVE}",
                outcome_constraints=_constraints(tracker.judge),
            )
            trials: dict[int, Config] = {}
            while not tracker.done:
                if tracker.stalled:
                    tracker.fill()
                    break
                ((index, params),) = client.get_next_trials(max_trials=1).items()
                trials[index] = encoding.decode(params)
                measurement, new = tracker.propose(trials[index])
                _tell(client, index, measurement, tracker.judge)
                if new:
                    tracker.report(_best(client, trials))
    finally:
        handler.setLevel(level)
    return tracker.result()


def _import_ax() -> tuple[Any, Any]:
    """Ax's ``Client`` and its log handler, imported without its import-time notes."""
    disabled = logging.root.manager.disable
    logging.disable(logging.INFO)  # "SQL storage initialized" on first import
    try:
        with quiet():  # deprecation shims inside Ax
            from ax.api.client import Client
            from ax.utils.common.logger import ROOT_STREAM_HANDLER
    finally:
        logging.disable(disabled)
    return Client, ROOT_STREAM_HANDLER


def _parameter(dim: Dim) -> Any:
    from ax.api.configs import ChoiceParameterConfig, RangeParameterConfig

    if dim.kind in ("float", "int"):
        wide = dim.high - dim.low + 1 > MAX_INT_VALUES
        return RangeParameterConfig(
            name=dim.name,
            bounds=(dim.low, dim.high),
            parameter_type="float" if dim.kind == "float" or wide else "int",
            scaling="log" if dim.log else "linear",
        )
    return ChoiceParameterConfig(
        name=dim.name,
        values=list(range(int(dim.high) + 1)),
        parameter_type="int",
        is_ordered=dim.kind == "ordinal",
    )


def _constraints(judge: Judge) -> list[str]:
    return [f"c{i} {c.op} {c.bound!r}" for i, c in enumerate(judge.constraints)]


def _tell(client: Any, index: int, measurement: Any, judge: Judge) -> None:
    value = judge.value(measurement)
    if measurement.status == "infeasible":
        client.mark_trial_abandoned(index)
    elif value is None:
        client.mark_trial_failed(index, failed_reason=f"measurement {measurement.status}")
    else:
        data = {OBJECTIVE: value}
        for i, constraint in enumerate(judge.constraints):
            if constraint.metric in measurement.metrics:
                data[f"c{i}"] = float(measurement.metrics[constraint.metric])
        client.complete_trial(index, raw_data=data)


def _best(client: Any, trials: dict[int, Config]) -> Config | None:
    try:
        _, _, index, _ = client.get_best_parameterization()
    except Exception:  # Ax raises (several types) while it has no best point
        return None
    return trials[int(index)]
