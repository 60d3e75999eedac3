"""Tests for the BO designer (tuner.designer.steps.bo): policy, constraints, dedup, fallback.

BO suggestions cost seconds each on a busy two-core machine, so these tests use a small
acquisition-optimizer budget and share one short study run (``run`` below) between tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
import torch
from botorch.exceptions.errors import ModelFittingError
from linear_operator.utils.errors import NanError, NotPSDError

import tuner.designer.steps.bo as bo
from tuner import runtime
from tuner.designer import (
    BODesigner,
    History,
    QuasiRandomDesigner,
    Suggestion,
    make_designer,
)
from tuner.designer.acquisition.criteria import OptimizerSettings
from tuner.encoding import UnitBoxEncoder
from tuner.errors import StateError
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, TrialStatus

S = TrialStatus
FAST = OptimizerSettings(num_restarts=2, raw_samples=64, maxiter=30)
CONSTRAINED: list[dict[str, Any]] = [
    {"name": "a", "kind": "int", "low": 0, "high": 10},
    {"name": "b", "kind": "float", "low": 0.0, "high": 10.0},
]
MIXED: list[dict[str, Any]] = [
    {"name": "x", "kind": "float", "low": -1.0, "high": 1.0},
    {"name": "n", "kind": "int", "low": 1, "high": 16},
    {"name": "big", "kind": "int", "low": 1, "high": 100_000, "log": True},
    {"name": "mode", "kind": "categorical", "choices": ["wal", "delete", "off"]},
    {"name": "page", "kind": "ordinal", "choices": [1024, 4096, 16384]},
    {"name": "flag", "kind": "bool"},
]


def _spec(
    knobs: list[dict[str, Any]] | None = None,
    constraints: Sequence[str] = (),
    outcome: Sequence[str] = (),
    **designer: Any,
) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "bo-test",
            "knobs": knobs or CONSTRAINED,
            "objectives": [{"name": "y", "goal": "maximize"}],
            "outcome_constraints": list(outcome),
            "parameter_constraints": list(constraints),
            "designer": {"initial_trials": 3, "seed": 0, **designer},
        }
    )


def _y(config: dict[str, Any]) -> float:
    """A smooth objective of every knob kind (maximum near a=5, b=2.5 for CONSTRAINED)."""
    value = 0.0
    for name, v in config.items():
        if isinstance(v, bool):
            value += 0.5 * v
        elif isinstance(v, str):
            value += {"wal": 1.0, "delete": 0.2}.get(v, 0.0)
        else:
            value -= 0.05 * (float(v) - 5.0) ** 2 if name in ("a", "n") else 0.0
            value -= (float(v) - 2.5) ** 2 if name == "b" else 0.0
            value -= (float(v) - 0.3) ** 2 if name == "x" else 0.0
    return value


def _complete(id_: int, suggestion: Suggestion, **metrics: float) -> Trial:
    return Trial(
        id_,
        suggestion.config,
        S.COMPLETED,
        metrics or {"y": _y(suggestion.config)},
        source=suggestion.step.value,
        step=suggestion.step,
    )


def _keys(spec: StudySpec, configs: Sequence[dict[str, Any]]) -> list[tuple[int, ...]]:
    encoder = UnitBoxEncoder(spec.space)
    return [encoder.key(c) for c in configs]


# -- one short constrained study, shared -------------------------------------------------


@dataclass(frozen=True)
class Run:
    spec: StudySpec
    initial: list[Suggestion]  # default + Sobol
    completed: list[Trial]
    first: Suggestion  # model-based, sequential
    parallel: list[Suggestion]  # count=3 with `first` pending
    repeated: list[Suggestion]  # count=2 with `first` and `parallel` pending


@pytest.fixture(scope="module")
def run() -> Run:
    knobs: list[dict[str, Any]] = [
        dict(CONSTRAINED[0], default=2),
        dict(CONSTRAINED[1], default=1.0),
    ]
    spec = _spec(knobs, ["a + 2*b <= 10"])
    designer = BODesigner(spec, settings=FAST)
    initial = designer.suggest(4, [], [])  # the default comes on top of initial_trials=3
    completed = [_complete(i + 1, s) for i, s in enumerate(initial)]
    (first,) = designer.suggest(1, completed, [])
    pending = [Trial(5, first.config, S.ACTIVE)]
    parallel = designer.suggest(3, completed, pending)
    pending += [Trial(6 + i, s.config, S.ACTIVE) for i, s in enumerate(parallel)]
    repeated = designer.suggest(2, completed, pending)
    return Run(spec, initial, completed, first, parallel, repeated)


def test_initial_design_is_default_then_sobol(run: Run) -> None:
    assert [s.step for s in run.initial] == [StepKind.DEFAULT] + [StepKind.SOBOL] * 3
    assert run.initial[0].config == {"a": 2, "b": 1.0}


def test_model_based_suggestions_come_after_the_initial_design(run: Run) -> None:
    assert run.first.step.model_based and run.first.warning == ""
    assert len(run.parallel) == 3 and len(run.repeated) == 2
    assert all(s.step in (StepKind.GLOBAL, StepKind.FILL_IN) for s in run.parallel + run.repeated)
    assert sum(s.step.model_based for s in run.parallel + run.repeated) >= 3


def test_every_suggestion_satisfies_the_linear_constraint_with_an_int_knob(run: Run) -> None:
    for s in [*run.initial, run.first, *run.parallel, *run.repeated]:
        config: dict[str, Any] = run.spec.space.validate_config(s.config)
        assert isinstance(config["a"], int) and not isinstance(config["a"], bool)
        assert config["a"] + 2 * config["b"] <= 10 + 1e-9, s
        assert run.spec.satisfies_parameter_constraints(config)


def test_parallel_suggestions_are_distinct_from_each_other_and_from_pending(run: Run) -> None:
    configs = [*(t.config for t in run.completed), run.first.config]
    configs += [s.config for s in run.parallel + run.repeated]
    keys = _keys(run.spec, configs)
    assert len(set(keys)) == len(keys) == 10


def test_the_designer_is_stateless(run: Run) -> None:
    fresh = BODesigner(run.spec, settings=FAST)
    assert fresh.suggest(4, [], []) == run.initial
    assert fresh.suggest(1, run.completed, []) == [run.first]


# -- other spaces and policies ------------------------------------------------------------


def test_mixed_space_gets_valid_values_from_the_model() -> None:
    spec = _spec(MIXED)
    designer = BODesigner(spec, settings=FAST)
    initial = designer.suggest(3, [], [])
    assert [s.step for s in initial] == [StepKind.SOBOL] * 3  # no defaults
    completed = [_complete(i + 1, s) for i, s in enumerate(initial)]
    suggestions = designer.suggest(2, completed, [])
    assert len(suggestions) == 2 and suggestions[0].step.model_based
    for s in suggestions:
        config = spec.space.validate_config(s.config)
        assert config == s.config
        assert type(config["n"]) is int and type(config["big"]) is int
        assert config["mode"] in ("wal", "delete", "off")
        assert config["page"] in (1024, 4096, 16384) and type(config["page"]) is int
        assert type(config["flag"]) is bool
    assert (
        len(set(_keys(spec, [*(t.config for t in completed), *(s.config for s in suggestions)])))
        == 5
    )


def test_infeasible_trials_without_metrics_are_learned_from() -> None:
    spec = _spec(outcome=["y >= -100"])
    designer = BODesigner(spec, settings=FAST)
    initial = designer.suggest(4, [], [])
    trials = [_complete(1, initial[0]), _complete(2, initial[1])]
    trials += [
        Trial(3 + i, s.config, S.INFEASIBLE, reason="OOM") for i, s in enumerate(initial[2:])
    ]
    (suggestion,) = designer.suggest(1, trials, [])
    assert suggestion.step.model_based and suggestion.warning == ""
    assert suggestion.config not in [t.config for t in trials]


def test_only_infeasible_trials_keep_the_sobol_design_going() -> None:
    spec = _spec()
    designer = BODesigner(spec, settings=FAST)
    initial = designer.suggest(5, [], [])
    trials = [Trial(i + 1, s.config, S.INFEASIBLE) for i, s in enumerate(initial)]
    more = designer.suggest(2, trials, [])
    assert [s.step for s in more] == [StepKind.SOBOL] * 2
    assert more == QuasiRandomDesigner(_spec(algorithm="sobol")).suggest(7, [], [])[5:]


def test_random_fraction_one_replaces_model_suggestions(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fit(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model must not be fitted")

    monkeypatch.setattr(bo, "fit_models", no_fit)
    spec = _spec(random_fraction=1.0)
    designer = BODesigner(spec, settings=FAST)
    completed = [_complete(i + 1, s) for i, s in enumerate(designer.suggest(3, [], []))]
    suggestions = designer.suggest(2, completed, [])
    assert [s.step for s in suggestions] == [StepKind.RANDOM] * 2


def test_failed_trials_do_not_count_toward_the_initial_design() -> None:
    """Failed design points are not suggested again; the design goes on with the next Sobol
    points, and stays the size it was asked to be."""
    spec = _spec()
    designer = BODesigner(spec, settings=FAST)
    initial = designer.suggest(5, [], [])
    trials = [_complete(1, initial[0])] + [
        Trial(2 + i, s.config, S.FAILED, reason="vm lost") for i, s in enumerate(initial[1:3])
    ]
    again = designer.suggest(2, trials, [])
    assert [s.step for s in again] == [StepKind.SOBOL] * 2
    assert [s.config for s in again] == [s.config for s in initial[3:5]]  # the next ones


def test_with_retries_a_failed_configuration_is_suggested_again() -> None:
    spec = _spec(retry_failed=1)
    designer = BODesigner(spec, settings=FAST)
    initial = designer.suggest(3, [], [])
    once = [_complete(1, initial[0])] + [
        Trial(2 + i, s.config, S.FAILED, reason="flaky") for i, s in enumerate(initial[1:])
    ]
    again = designer.suggest(2, once, [])
    assert [s.config for s in again] == [s.config for s in initial[1:]]  # retried once
    twice = [
        *once,
        *(Trial(4 + i, s.config, S.FAILED, reason="flaky") for i, s in enumerate(again)),
    ]
    assert not {_keys(spec, [s.config for s in designer.suggest(2, twice, [])])[0]} & set(
        _keys(spec, [s.config for s in initial])
    )


def test_failures_steer_the_model_away() -> None:
    """A failed configuration teaches the feasibility model: the next model-based step does
    not go back to its neighbourhood, as it would if the failure were invisible."""
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    best = {"a": 9, "b": 9.0}  # the objective (a + b, maximized) peaks in this corner
    trials = [
        Trial(i + 1, c, S.COMPLETED, {"y": float(c["a"]) + float(c["b"])})
        for i, c in enumerate([{"a": 1, "b": 1.0}, {"a": 4, "b": 2.0}, {"a": 2, "b": 5.0},
                               {"a": 6, "b": 6.0}, {"a": 8, "b": 7.5}])
    ]  # fmt: skip
    fails = [
        Trial(6 + i, {"a": a, "b": b}, S.FAILED, reason="capacity")
        for i, (a, b) in enumerate([(9, 9.0), (10, 8.0), (8, 10.0), (9, 10.0), (10, 9.5)])
    ]
    history = History.build(encoder, [*trials, *fails], [])
    assert len(history.observed) == 10 and encoder.key(best) in history.taken
    (blind,) = BODesigner(spec, settings=FAST).suggest(
        1, [*trials, *(replace(f, status=S.ABANDONED) for f in fails)], []
    )
    (steered,) = BODesigner(spec, settings=FAST).suggest(1, [*trials, *fails], [])
    corner = lambda c: float(c["a"]) >= 8 and float(c["b"]) >= 7.5  # noqa: E731
    assert corner(blind.config) and not corner(steered.config)


# -- numerical trouble ------------------------------------------------------------------------


def _fail(*args: Any, **kwargs: Any) -> Any:
    raise NotPSDError("Matrix not positive definite after repeatedly adding jitter")


@pytest.fixture
def lenient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Numerical errors fall back, as in production (the suite runs strict)."""
    monkeypatch.setattr(runtime, "STRICT", False)


@pytest.mark.usefixtures("lenient")
def test_numerical_failure_falls_back_to_quasi_random(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bo, "fit_models", _fail)
    spec = _spec(constraints=["a + 2*b <= 10"])
    designer = BODesigner(spec, settings=FAST)
    completed = [_complete(i + 1, s) for i, s in enumerate(designer.suggest(3, [], []))]
    pending = [Trial(4, designer.suggest(4, [], [])[3].config, S.ACTIVE)]
    suggestions = designer.suggest(3, completed, pending)
    assert len(suggestions) == 3
    for s in suggestions:
        assert s.step is StepKind.FALLBACK
        assert "NotPSDError: Matrix not positive definite" in s.warning
        assert "quasi-random" in s.warning
        assert spec.satisfies_parameter_constraints(s.config)
    taken = _keys(spec, [*(t.config for t in completed), pending[0].config])
    keys = _keys(spec, [s.config for s in suggestions])
    assert len(set(keys)) == 3 and not set(keys) & set(taken)


@pytest.mark.usefixtures("lenient")
@pytest.mark.parametrize(
    "error",
    [
        NanError("NaN in the covariance"),
        ModelFittingError("All attempts to fit the model have failed."),
        np.linalg.LinAlgError("Singular matrix"),
        torch.linalg.LinAlgError("linalg.cholesky: The factorization could not be completed"),
    ],
    ids=type,
)
def test_each_named_numerical_error_falls_back(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(bo, "build_acquisition", broken)
    designer = BODesigner(_spec(), settings=FAST)
    completed = [_complete(i + 1, s) for i, s in enumerate(designer.suggest(3, [], []))]
    (suggestion,) = designer.suggest(1, completed, [])
    assert suggestion.step is StepKind.FALLBACK
    assert type(error).__name__ in suggestion.warning


@pytest.mark.usefixtures("lenient")
def test_fallback_warning_is_truncated(monkeypatch: pytest.MonkeyPatch) -> None:
    def long_failure(*args: Any, **kwargs: Any) -> Any:
        raise NanError("x" * 1000)

    monkeypatch.setattr(bo, "fit_models", long_failure)
    designer = BODesigner(_spec(), settings=FAST)
    completed = [_complete(i + 1, s) for i, s in enumerate(designer.suggest(3, [], []))]
    (suggestion,) = designer.suggest(1, completed, [])
    assert suggestion.step is StepKind.FALLBACK
    assert 0 < len(suggestion.warning) <= 300


@pytest.mark.usefixtures("lenient")
def test_any_other_exception_is_a_bug_and_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ValueError or a KeyError inside a step is not numerical trouble: it must reach the
    caller (and the server's log as INTERNAL), never hide behind a quasi-random point."""
    for bug in (ValueError("shape mismatch"), KeyError("x9"), RuntimeError("cholesky")):

        def broken(*args: Any, bug: Exception = bug, **kwargs: Any) -> Any:
            raise bug

        monkeypatch.setattr(bo, "build_acquisition", broken)
        designer = BODesigner(_spec(), settings=FAST)
        completed = [_complete(i + 1, s) for i, s in enumerate(designer.suggest(3, [], []))]
        with pytest.raises(type(bug)):
            designer.suggest(1, completed, [])


def test_strict_mode_lets_numerical_errors_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "STRICT", True)
    monkeypatch.setattr(bo, "fit_models", _fail)
    designer = BODesigner(_spec(), settings=FAST)
    completed = [_complete(i + 1, s) for i, s in enumerate(designer.suggest(3, [], []))]
    with pytest.raises(NotPSDError):
        designer.suggest(1, completed, [])


# -- history, dedup, exhaustion ---------------------------------------------------------------


def test_history_sorts_trials_for_the_designer() -> None:
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    configs: list[Config] = [{"a": i, "b": float(i)} for i in range(8)]
    statuses = [S.COMPLETED, S.INFEASIBLE, S.TIMED_OUT, S.FAILED, S.ABANDONED]
    finished = [Trial(i + 1, configs[i], status) for i, status in enumerate(statuses)]
    pending = [Trial(6, configs[5], S.ACTIVE), Trial(7, configs[6], S.PENDING)]
    history = History.build(encoder, finished, pending)
    assert [t.id for t in history.observed] == [1, 2, 3, 4]  # the failure teaches the model
    assert [t.id for t in history.pending] == [6, 7]
    assert history.taken == {encoder.key(configs[i]) for i in (0, 1, 2, 3, 4, 5, 6)}
    assert history.size == 7 and history.designed == 6
    lenient = History.build(encoder, finished, pending, retry_failed=1)
    assert [t.id for t in lenient.observed] == [1, 2, 3]  # may be retried: not yet a verdict
    assert encoder.key(configs[3]) not in lenient.taken and lenient.size == 6


def test_abandoned_configs_are_not_suggested_again() -> None:
    spec = _spec(algorithm="sobol")
    designer = make_designer(spec)
    first = designer.suggest(2, [], [])
    abandoned = [Trial(i + 1, s.config, S.ABANDONED) for i, s in enumerate(first)]
    again = designer.suggest(2, abandoned, [])
    assert not set(_keys(spec, [s.config for s in again])) & set(
        _keys(spec, [s.config for s in first])
    )


def test_small_discrete_space_is_exhausted() -> None:
    knobs: list[dict[str, Any]] = [
        {"name": "flag", "kind": "bool"},
        {"name": "level", "kind": "ordinal", "choices": [1, 2]},
    ]
    spec = _spec(knobs, initial_trials=2)
    designer = BODesigner(spec, settings=FAST)
    initial = designer.suggest(2, [], [])
    completed = [_complete(i + 1, s, y=float(i)) for i, s in enumerate(initial)]
    rest = designer.suggest(5, completed, [])
    assert len(rest) == 2  # only two configurations are left
    assert rest[0].step.model_based
    all_four = [*(t.config for t in completed), *(s.config for s in rest)]
    assert len(set(_keys(spec, all_four))) == 4
    completed += [_complete(3 + i, s, y=0.5) for i, s in enumerate(rest)]
    with pytest.raises(StateError, match=r"search space is exhausted"):
        designer.suggest(1, completed, [])


def test_make_designer_picks_bo() -> None:
    assert type(make_designer(_spec())) is BODesigner


def test_bo_skips_a_default_that_breaks_a_parameter_constraint() -> None:
    knobs: list[dict[str, Any]] = [
        dict(CONSTRAINED[0], default=8),
        dict(CONSTRAINED[1], default=2.0),
    ]  # 8 + 4 > 10
    spec = _spec(knobs, ["a + 2*b <= 10"])
    suggestions = BODesigner(spec, settings=FAST).suggest(2, [], [])
    assert [s.step for s in suggestions] == [StepKind.SOBOL] * 2
    assert all(spec.satisfies_parameter_constraints(s.config) for s in suggestions)
    with_room = _spec(knobs, ["a + 2*b <= 12"])
    assert BODesigner(with_room, settings=FAST).suggest(1, [], [])[0].step is StepKind.DEFAULT


def test_probability_of_feasibility_until_a_trial_is_feasible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    original = bo.build_acquisition

    def spy(*args: Any, **kwargs: Any) -> Any:
        acquisition = original(*args, **kwargs)
        built.append(type(acquisition).__name__)
        return acquisition

    monkeypatch.setattr(bo, "build_acquisition", spy)
    spec = _spec(outcome=["y >= 0"], start_with_default=False)  # _y <= 0: only y == 0 passes
    designer = BODesigner(spec, settings=FAST)
    initial = designer.suggest(3, [], [])
    trials = [_complete(1, initial[0], y=-1.0), _complete(2, initial[1], y=-2.0)]
    trials.append(Trial(3, initial[2].config, S.INFEASIBLE, reason="crashed"))
    (first,) = designer.suggest(1, trials, [])
    assert first.step.model_based
    trials.append(_complete(4, first, y=0.5))  # now one trial is feasible
    (second,) = designer.suggest(1, trials, [])
    assert second.step.model_based
    assert built == [
        "qLogProbabilityOfFeasibility",
        "LogNEI",
    ]  # LogNEI: qLogNEI (fast/candidate_samples.py)


def _gramacy(config: dict[str, Any]) -> dict[str, float]:
    """Gramacy's constrained problem (see test_designer_gramacy.py)."""
    x1, x2 = float(config["x1"]), float(config["x2"])
    c1 = 1.5 - x1 - 2.0 * x2 - 0.5 * math.sin(2.0 * math.pi * (x1**2 - 2.0 * x2))
    return {"f": x1 + x2, "c1": c1, "c2": x1**2 + x2**2 - 1.5}


def test_without_a_cache_the_same_history_gives_the_same_suggestions() -> None:
    # base.py: without a fit cache a designer is a pure function of the stored history and
    # the study seed, so two servers (or one before and after a restart) agree exactly.
    spec = StudySpec.from_dict(
        {
            "name": "warm",
            "knobs": [
                {"name": "x1", "kind": "float", "low": 0.0, "high": 1.0},
                {"name": "x2", "kind": "float", "low": 0.0, "high": 1.0},
            ],
            "objectives": [{"name": "f", "goal": "minimize"}],
            "outcome_constraints": ["c1 <= 0", "c2 <= 0"],
            "designer": {"seed": 0},
        }
    )
    first = BODesigner(spec)
    trials: list[Trial] = []
    for i in range(10):
        (suggestion,) = first.suggest(1, trials, [])
        (restarted,) = BODesigner(spec).suggest(1, trials, [])
        assert restarted == suggestion, f"suggestion {i + 1} differs after a restart"
        metrics = _gramacy(suggestion.config)
        trials.append(Trial(i + 1, suggestion.config, S.COMPLETED, metrics))


def test_the_default_comes_on_top_of_the_initial_design() -> None:
    knobs = [dict(CONSTRAINED[0], default=2), dict(CONSTRAINED[1], default=1.0)]
    spec = _spec(knobs, initial_trials=2)
    designer = BODesigner(spec, settings=FAST)
    (default,) = designer.suggest(1, [], [])
    assert default.step is StepKind.DEFAULT
    trials = [_complete(1, default)]
    sobol = designer.suggest(2, trials, [])
    assert [s.step for s in sobol] == [StepKind.SOBOL] * 2
    trials += [_complete(2 + i, s) for i, s in enumerate(sobol)]
    (model_based,) = designer.suggest(1, trials, [])
    assert model_based.step.model_based


def test_a_failed_default_does_not_shrink_the_initial_design() -> None:
    # initial_trials=2 Sobol points were measured; the default trial FAILED (infrastructure).
    # Two designed trials exist, so the next suggestion is model-based, not a third Sobol point.
    knobs = [dict(CONSTRAINED[0], default=2), dict(CONSTRAINED[1], default=1.0)]
    spec = _spec(knobs, initial_trials=2, retry_failed=1)
    designer = BODesigner(spec, settings=FAST)
    default, first, second = designer.suggest(3, [], [])
    trials = [
        Trial(1, default.config, S.FAILED, step=StepKind.DEFAULT),
        _complete(2, first),
        _complete(3, second),
    ]
    retried, suggestion = designer.suggest(2, trials, [])
    assert (retried.step, retried.config) == (StepKind.DEFAULT, default.config)
    assert suggestion.step.model_based
