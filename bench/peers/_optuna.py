"""The ask/tell loop that both Optuna peers share; only the sampler differs.

Knob spaces (``_common.Encoding``): ``suggest_float`` / ``suggest_int`` with ``log`` as the
knob says, categorical and bool knobs ``suggest_categorical`` over their value indices,
ordinal knobs ``suggest_int`` over their level indices.

**Candidate lists**: ``bench/cloud.py``'s encoding made general (``CandidateTree``). The
knobs are suggested in order, each a categorical over the values that some candidate still
allows given the values chosen before it, so every proposal is a candidate. A knob whose
allowed values are all of its values among the candidates keeps its name; one whose values
depend on the earlier choices is named after the allowed set (``nodes|4,8,16``, as
``bench/cloud.py``'s ``nodes_<size>``), so Optuna sees a conditional parameter. A repeated
candidate is told its earlier measurement without using the budget (``Tracker.propose``).

**Constraints**: a completed measurement is told its objective value, with one constraint
value per outcome constraint (``-slack``: ``<= 0`` met) set with ``Trial.set_constraint``.
Optuna 5 deprecates the samplers' ``constraints_func`` (a ``FutureWarning``) for
``set_constraint``, and both samplers read the values it stores. A measurement that broke the
system (``infeasible``) or failed has no value: the trial is told ``TrialState.FAIL``,
which is how Optuna records an objective that raised; the samplers ignore failed trials.
Reported best: the best completed feasible measurement so far.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.contract import MethodRun, SuiteProblem
from bench.peers._common import Encoding, OnEval, Tracker, missing, quiet
from tuner.space import Config, Scalar, value_key

N_STARTUP = 10


def available() -> str | None:
    """None when Optuna imports."""
    return missing("optuna", "in the dev extra: pip install -e '.[dev]'")


class CandidateTree:
    """Suggests a candidate knob by knob, each knob among the values still possible."""

    def __init__(self, names: tuple[str, ...], candidates: tuple[Config, ...]) -> None:
        self.names = names
        self.candidates = candidates
        self._all = {n: _distinct([c[n] for c in candidates]) for n in names}

    def suggest(self, trial: Any) -> Config:
        """The candidate chosen through ``trial``'s categorical suggestions."""
        pool = list(self.candidates)
        for name in self.names:
            allowed = _distinct([c[name] for c in pool])
            if len(allowed) > 1:
                label = name if allowed == self._all[name] else _label(name, allowed)
                value = trial.suggest_categorical(label, allowed)
                pool = [c for c in pool if value_key(c[name]) == value_key(value)]
        return dict(pool[0])


def run_optuna(
    method: str,
    sampler: Callable[[int], Any],
    problem: SuiteProblem,
    seed: int,
    budget: int,
    on_eval: OnEval | None,
    max_int_values: int | None = None,
) -> MethodRun:
    """One ask/tell run of ``budget`` evaluations with the sampler ``sampler(seed)``.

    ``max_int_values``: an int knob with more values is suggested as a float (``log`` kept)
    and rounded (None: never).
    """
    import optuna
    from optuna.study import StudyDirection

    tracker = Tracker(method, problem, seed, budget, on_eval)
    encoding = Encoding(problem)
    tree = CandidateTree(encoding.space.names, problem.candidates) if problem.candidates else None
    labels = [str(c) for c in tracker.judge.constraints]
    with quiet("optuna"):
        direction = StudyDirection.MINIMIZE if problem.sign > 0 else StudyDirection.MAXIMIZE
        study = optuna.create_study(direction=direction, sampler=sampler(seed))
        while not tracker.done:
            if tracker.stalled:
                tracker.fill()
                break
            trial = study.ask()
            config = (
                tree.suggest(trial)
                if tree is not None
                else _suggest(trial, encoding, max_int_values)
            )
            measurement, _ = tracker.propose(config)
            value = tracker.judge.value(measurement)
            if value is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            for label, violation in zip(labels, tracker.judge.violations(measurement), strict=True):
                trial.set_constraint(label, violation)
            study.tell(trial, value)
    return tracker.result()


def _suggest(trial: Any, encoding: Encoding, max_int_values: int | None) -> Config:
    raw: dict[str, Any] = {}
    for dim in encoding.dims:
        wide = max_int_values is not None and dim.high - dim.low + 1 > max_int_values
        if dim.kind == "float" or (dim.kind == "int" and wide):
            raw[dim.name] = trial.suggest_float(dim.name, dim.low, dim.high, log=dim.log)
        elif dim.kind == "int":
            raw[dim.name] = trial.suggest_int(dim.name, int(dim.low), int(dim.high), log=dim.log)
        elif dim.kind == "ordinal":
            raw[dim.name] = trial.suggest_int(dim.name, 0, int(dim.high))
        else:
            raw[dim.name] = trial.suggest_categorical(dim.name, list(range(int(dim.high) + 1)))
    return encoding.decode(raw)


def _distinct(values: list[Scalar]) -> list[Scalar]:
    """The distinct values, sorted (numbers by value, then strings; bools apart)."""
    unique = {value_key(v): v for v in values}
    return [unique[k] for k in sorted(unique, key=lambda k: (k[0], k[1]))]


def _label(name: str, allowed: list[Scalar]) -> str:
    return f"{name}|{','.join(str(v) for v in allowed)}"
