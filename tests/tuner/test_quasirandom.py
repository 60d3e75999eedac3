"""Tests for tuner.designer.sampling.quasirandom and the quasi-random designers (Sobol, random)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from tuner.designer import QuasiRandomDesigner, Suggestion, make_designer
from tuner.designer.sampling.quasirandom import FeasibleSampler, unit_box_inequalities
from tuner.encoding import UnitBoxEncoder
from tuner.errors import StateError
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, TrialStatus

S = TrialStatus


def _spec(
    knobs: list[dict[str, Any]] | None = None,
    constraints: tuple[str, ...] = (),
    **designer: Any,
) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "qr",
            "knobs": knobs
            or [
                {"name": "a", "kind": "int", "low": 0, "high": 10},
                {"name": "b", "kind": "float", "low": 0.0, "high": 10.0},
            ],
            "objectives": [{"name": "y"}],
            "parameter_constraints": list(constraints),
            "designer": {"algorithm": "sobol", **designer},
        }
    )


def _configs(suggestions: list[Suggestion]) -> list[dict[str, Any]]:
    return [s.config for s in suggestions]


def _trials(configs: list[dict[str, Any]], status: TrialStatus = S.COMPLETED) -> list[Trial]:
    return [
        Trial(i + 1, c, status, {"y": 1.0} if status is S.COMPLETED else {})
        for i, c in enumerate(configs)
    ]


DEFAULTS: list[dict[str, Any]] = [
    {"name": "a", "kind": "int", "low": 0, "high": 10, "default": 2},
    {"name": "b", "kind": "float", "low": 0.0, "high": 10.0, "default": 1.5},
    {"name": "mode", "kind": "categorical", "choices": ["x", "y", "z"], "default": "y"},
]
SMALL: list[dict[str, Any]] = [
    {"name": "flag", "kind": "bool"},
    {"name": "level", "kind": "ordinal", "choices": ["lo", "hi"]},
]


# -- determinism ------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["sobol", "random"])
def test_suggestions_are_deterministic_for_a_seed(algorithm: str) -> None:
    first = QuasiRandomDesigner(_spec(seed=5, algorithm=algorithm)).suggest(8, [], [])
    again = QuasiRandomDesigner(_spec(seed=5, algorithm=algorithm)).suggest(8, [], [])
    assert first == again
    assert len(first) == 8 and {s.step.value for s in first} == {algorithm}
    other = QuasiRandomDesigner(_spec(seed=6, algorithm=algorithm)).suggest(8, [], [])
    assert _configs(other) != _configs(first)
    assert len({repr(c) for c in _configs(first)}) == 8


def test_sobol_sequence_continues_where_the_history_stops() -> None:
    designer = QuasiRandomDesigner(_spec(seed=3))
    all_at_once = _configs(designer.suggest(6, [], []))
    head = _configs(designer.suggest(2, [], []))
    tail = _configs(designer.suggest(4, _trials(head), []))
    assert head + tail == all_at_once


def test_make_designer_picks_the_quasi_random_designer() -> None:
    designer = make_designer(_spec())
    assert type(designer) is QuasiRandomDesigner


# -- constraints ------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["sobol", "random"])
def test_every_suggestion_satisfies_the_parameter_constraint(algorithm: str) -> None:
    spec = _spec(constraints=("a + 2*b <= 10",), algorithm=algorithm)
    suggestions = QuasiRandomDesigner(spec).suggest(40, [], [])
    assert len(suggestions) == 40
    for suggestion in suggestions:
        config: dict[str, Any] = spec.space.validate_config(suggestion.config)
        assert isinstance(config["a"], int)
        assert config["a"] + 2 * config["b"] <= 10 + 1e-9


def test_tiny_feasible_region_is_filled_from_the_polytope() -> None:
    knobs: list[dict[str, Any]] = [
        {"name": "a", "kind": "float", "low": 0.0, "high": 10.0},
        {"name": "b", "kind": "float", "low": 0.0, "high": 10.0},
        {"name": "c", "kind": "float", "low": 0.0, "high": 10.0},
    ]
    spec = _spec(knobs, ("a + b + c <= 0.3",))  # about 5e-6 of the box
    suggestions = QuasiRandomDesigner(spec).suggest(10, [], [])
    assert len(suggestions) == 10
    for s in suggestions:
        c: dict[str, Any] = s.config
        assert c["a"] + c["b"] + c["c"] <= 0.3 + 1e-9
    assert len({repr(s.config) for s in suggestions}) == 10


def test_two_sided_constraints() -> None:
    spec = _spec(constraints=("a + 2*b <= 10", "a - b >= 2"))
    for s in QuasiRandomDesigner(spec).suggest(20, [], []):
        assert spec.satisfies_parameter_constraints(s.config)
        c: dict[str, Any] = s.config
        assert c["a"] - c["b"] >= 2 - 1e-9


def test_integer_rounding_is_repaired() -> None:
    spec = _spec(constraints=("a + 2*b <= 10",))
    sampler = FeasibleSampler(spec, UnitBoxEncoder(spec.space))
    assert sampler.feasible({"a": 5, "b": 2.5}) == {"a": 5, "b": 2.5}
    assert sampler.feasible({"a": 5, "b": 2.6}) == {"a": 4, "b": 2.6}
    assert sampler.feasible({"a": 0, "b": 9.0}) is None  # no integer move helps


def test_floats_only_cannot_be_repaired() -> None:
    knobs: list[dict[str, Any]] = [{"name": "a", "kind": "float"}, {"name": "b", "kind": "float"}]
    spec = _spec(knobs, ("a + b <= 1",))
    sampler = FeasibleSampler(spec, UnitBoxEncoder(spec.space))
    assert sampler.feasible({"a": 0.8, "b": 0.8}) is None


def test_unit_box_inequalities() -> None:
    knobs: list[dict[str, Any]] = [
        {"name": "a", "kind": "int", "low": 2, "high": 12},
        {"name": "m", "kind": "bool"},
        {"name": "b", "kind": "float", "low": -1.0, "high": 3.0},
    ]
    spec = _spec(knobs, ("a + 2*b <= 10",))
    ((indices, coefficients, rhs),) = unit_box_inequalities(spec, UnitBoxEncoder(spec.space))
    assert indices.tolist() == [0, 2]
    # a = 2 + 10 u0, b = -1 + 4 u2: 10 u0 + 8 u2 <= 10  <=>  -10 u0 - 8 u2 >= -10
    assert coefficients.tolist() == [-10.0, -8.0]
    assert rhs == -10.0
    assert coefficients.dtype == torch.float64


# -- the default configuration ----------------------------------------------------------


def test_default_configuration_comes_first() -> None:
    spec = _spec(DEFAULTS)
    designer = QuasiRandomDesigner(spec)
    first = designer.suggest(3, [], [])
    assert first[0] == Suggestion({"a": 2, "b": 1.5, "mode": "y"}, StepKind.DEFAULT)
    assert [s.step for s in first[1:]] == [StepKind.SOBOL] * 2
    later = designer.suggest(2, _trials([first[0].config]), [])
    assert all(s.step is StepKind.SOBOL for s in later)
    pending = designer.suggest(2, [], [Trial(1, dict(first[0].config), S.ACTIVE)])
    assert all(s.step is StepKind.SOBOL for s in pending)


def test_no_default_when_not_asked_for_or_incomplete() -> None:
    spec = _spec(DEFAULTS, start_with_default=False)
    assert all(s.step is StepKind.SOBOL for s in QuasiRandomDesigner(spec).suggest(3, [], []))
    partial = [dict(k) for k in DEFAULTS]
    del partial[1]["default"]
    assert all(
        s.step is StepKind.SOBOL for s in QuasiRandomDesigner(_spec(partial)).suggest(3, [], [])
    )


def test_no_default_when_it_breaks_a_parameter_constraint(caplog: Any) -> None:
    spec = _spec(DEFAULTS, ("a + 2*b <= 4",))  # default: 2 + 3 = 5 > 4
    with caplog.at_level(logging.WARNING, logger="tuner.designer.steps.bo"):
        suggestions = QuasiRandomDesigner(spec).suggest(3, [], [])
    assert all(s.step is StepKind.SOBOL for s in suggestions)
    assert all(spec.satisfies_parameter_constraints(s.config) for s in suggestions)
    assert "default configuration breaks a parameter constraint" in caplog.text


# -- deduplication and exhaustion -------------------------------------------------------


@pytest.mark.parametrize("status", [S.COMPLETED, S.INFEASIBLE, S.TIMED_OUT, S.ABANDONED])
def test_taken_configs_are_not_suggested_again(status: TrialStatus) -> None:
    designer = QuasiRandomDesigner(_spec(seed=9))
    first = _configs(designer.suggest(3, [], []))
    taken = _trials(first, status)
    again = _configs(designer.suggest(3, taken, []))
    keys = {designer.encoder.key(c) for c in first}
    assert not keys & {designer.encoder.key(c) for c in again}


@pytest.mark.parametrize("status", [S.ACTIVE, S.PENDING])
def test_pending_configs_are_not_suggested_again(status: TrialStatus) -> None:
    designer = QuasiRandomDesigner(_spec(seed=9))
    first = _configs(designer.suggest(3, [], []))
    again = _configs(designer.suggest(3, [], _trials(first, status)))
    assert not {designer.encoder.key(c) for c in first} & {designer.encoder.key(c) for c in again}


def test_a_failed_config_is_suggested_again_only_with_retries() -> None:
    designer = QuasiRandomDesigner(_spec(seed=9))
    (first,) = designer.suggest(1, [], [])
    (other,) = designer.suggest(1, _trials([first.config], S.FAILED), [])
    assert other.config != first.config
    lenient = QuasiRandomDesigner(_spec(seed=9, retry_failed=1))
    (again,) = lenient.suggest(1, _trials([first.config], S.FAILED), [])
    assert again.config == first.config


def test_small_space_returns_fewer_then_is_exhausted() -> None:
    spec = _spec(SMALL)
    designer = QuasiRandomDesigner(spec)
    suggestions = designer.suggest(6, [], [])
    assert len(suggestions) == 4  # fewer only when the space is exhausted
    assert {(s.config["flag"], s.config["level"]) for s in suggestions} == {
        (False, "lo"),
        (False, "hi"),
        (True, "lo"),
        (True, "hi"),
    }
    completed = _trials(_configs(suggestions[:3]))
    pending = [Trial(4, suggestions[3].config, S.ACTIVE)]
    with pytest.raises(StateError, match=r"study qr: the search space is exhausted"):
        designer.suggest(1, completed, pending)


def test_zero_count_gives_nothing() -> None:
    assert QuasiRandomDesigner(_spec(DEFAULTS)).suggest(0, [], []) == []


def test_nearest_feasible_projects_onto_the_constraints_and_keeps_other_knobs() -> None:
    knobs = [
        {"name": "x", "kind": "float", "low": 0.0, "high": 1.0},
        {"name": "y", "kind": "float", "low": 0.0, "high": 1.0},
        {"name": "z", "kind": "float", "low": 0.0, "high": 1.0},
    ]
    spec = _spec(knobs, ("x + y <= 1",))
    sampler = FeasibleSampler(spec, UnitBoxEncoder(spec.space))
    repaired = sampler.nearest_feasible({"x": 0.8, "y": 0.6, "z": 0.9})
    assert repaired is not None
    assert repaired["x"] == pytest.approx(0.6, abs=1e-6)
    assert repaired["y"] == pytest.approx(0.4, abs=1e-6)
    assert repaired["z"] == 0.9
    assert spec.satisfies_parameter_constraints(repaired)
    feasible = {"x": 0.1, "y": 0.2, "z": 0.3}
    assert sampler.nearest_feasible(feasible) == feasible


def test_nearest_feasible_rounds_integers_back_inside() -> None:
    spec = _spec(constraints=("a + b <= 4.5",))
    sampler = FeasibleSampler(spec, UnitBoxEncoder(spec.space))
    repaired = sampler.nearest_feasible({"a": 9, "b": 9.0})
    assert repaired is not None and spec.satisfies_parameter_constraints(repaired)
    assert repaired["a"] + repaired["b"] == pytest.approx(4.5, abs=0.6)
