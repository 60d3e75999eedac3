"""Tests for tuner.designer.acquisition.local_search, with a cheap stand-in acquisition function."""

from __future__ import annotations

from typing import Any

import torch

from tuner.designer.acquisition.local_search import LocalSearch
from tuner.encoding import UnitBoxEncoder
from tuner.space import (
    BoolKnob,
    CategoricalKnob,
    Config,
    FloatKnob,
    IntKnob,
    OrdinalKnob,
    SearchSpace,
)

SPACE = SearchSpace(
    (
        IntKnob("a", low=0, high=10),
        FloatKnob("b", low=0.0, high=10.0),
        CategoricalKnob("mode", choices=("x", "y", "z")),
        OrdinalKnob("level", choices=(1, 2, 4, 8)),
        BoolKnob("flag"),
    )
)
ENCODER = UnitBoxEncoder(SPACE)


class Closeness:
    """Acquisition stand-in: highest at ``target``; penalises pending points nearby.

    Called like BoTorch's acquisitions: ``b x 1 x d`` -> ``b``.
    """

    def __init__(self, target: Config, encoder: UnitBoxEncoder = ENCODER) -> None:
        self.target = torch.tensor(encoder.encode(target), dtype=torch.float64)
        self.X_pending: torch.Tensor | None = None

    def set_X_pending(self, X_pending: torch.Tensor | None) -> None:
        self.X_pending = X_pending

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        points = X.squeeze(-2)
        value = -((points - self.target) ** 2).sum(-1)
        if self.X_pending is not None:
            for pending in self.X_pending:
                value = value - 0.5 * torch.exp(-((points - pending) ** 2).sum(-1) / 0.01)
        return value


def _closeness(target: Config) -> Any:
    return Closeness(target)


def _search(taken: set[tuple[int, ...]] | None = None, valid: Any = None) -> LocalSearch:
    return LocalSearch(ENCODER, valid or (lambda config: True), taken or set())


def _anchors(*configs: Config) -> torch.Tensor:
    return ENCODER.encode_many(list(configs))


TARGET: Config = {"a": 7, "b": 2.5, "mode": "z", "level": 4, "flag": True}


def test_finds_the_best_valid_configuration() -> None:
    acquisition: Any = Closeness(TARGET)
    (point,) = _search().optimize(acquisition, 1, _anchors(), 64, 4, seed=0)
    config = ENCODER.decode(point.tolist())
    assert SPACE.validate_config(config) == config
    assert {k: config[k] for k in ("a", "mode", "level", "flag")} == {
        "a": 7,
        "mode": "z",
        "level": 4,
        "flag": True,
    }
    assert abs(float(config["b"]) - 2.5) < 10 / 64


def test_returned_points_are_valid_encodings() -> None:
    points = _search().optimize(_closeness(TARGET), 3, _anchors(), 32, 2, seed=1)
    assert torch.allclose(ENCODER.snap(points), points, atol=1e-12)
    assert bool(((points >= 0) & (points <= 1)).all())


def test_taken_configurations_are_never_returned() -> None:
    taken = {ENCODER.key(TARGET)}
    (point,) = _search(taken).optimize(_closeness(TARGET), 1, _anchors(TARGET), 64, 4, seed=0)
    config = ENCODER.decode(point.tolist())
    assert ENCODER.key(config) not in taken


def test_parameter_constraints_are_respected() -> None:
    def valid(config: Config) -> bool:
        return float(config["a"]) + 2 * float(config["b"]) <= 10.0

    far: Config = {**TARGET, "a": 10, "b": 10.0}  # outside the feasible region
    points = _search(valid=valid).optimize(_closeness(far), 3, _anchors(TARGET), 64, 4, seed=2)
    assert points.shape[0] == 3
    for point in points:
        assert valid(ENCODER.decode(point.tolist()))


def test_greedy_batch_is_distinct_and_pending_is_restored() -> None:
    acquisition: Any = Closeness(TARGET)
    before = torch.full((1, ENCODER.d), 0.5, dtype=torch.float64)
    acquisition.set_X_pending(before)
    points = _search().optimize(acquisition, 4, _anchors(TARGET), 32, 2, seed=3)
    keys = {ENCODER.key(ENCODER.decode(p.tolist())) for p in points}
    assert len(keys) == 4
    assert acquisition.X_pending is before


def test_a_single_pick_leaves_the_pending_points_alone() -> None:
    """With q = 1 nothing is made pending, so nothing is restored: each ``set_X_pending``
    makes qLogNEI sample its baseline again, tens of milliseconds for nothing."""
    acquisition: Any = Closeness(TARGET)
    before = torch.full((1, ENCODER.d), 0.5, dtype=torch.float64)
    acquisition.set_X_pending(before)
    calls: list[torch.Tensor | None] = []
    acquisition.set_X_pending = calls.append
    (point,) = _search().optimize(acquisition, 1, _anchors(TARGET), 32, 2, seed=3)
    assert calls == [] and acquisition.X_pending is before
    assert ENCODER.key(ENCODER.decode(point.tolist())) == ENCODER.key(
        ENCODER.decode(
            _search().optimize(Closeness(TARGET), 2, _anchors(TARGET), 32, 2, 3)[0].tolist()
        )
    )


def test_exhausted_space_gives_no_points() -> None:
    space = SearchSpace((BoolKnob("p"), BoolKnob("q")))
    encoder = UnitBoxEncoder(space)
    every: list[Config] = [{"p": p, "q": q} for p in (False, True) for q in (False, True)]
    taken = {encoder.key(c) for c in every[:3]}
    search = LocalSearch(encoder, lambda config: True, taken)
    acquisition: Any = Closeness(every[0], encoder)
    points = search.optimize(acquisition, 3, encoder.encode_many(every[:1]), 16, 2, seed=0)
    assert points.shape == (1, 2)  # only the one untaken configuration
    assert encoder.decode(points[0].tolist()) == every[3]
    none_left = LocalSearch(encoder, lambda config: True, {encoder.key(c) for c in every})
    empty = none_left.optimize(acquisition, 2, encoder.encode_many([]), 16, 2, seed=0)
    assert empty.shape == (0, 2)


def test_a_climb_moves_every_knob_it_can_improve_at_once() -> None:
    # Eight continuous knobs, each several steps (1/4, 1/16, 1/64 of its range) from the
    # maximum: one knob a round would take some 40 rounds, more than a climb has. Moving
    # every improving knob at once (the compound move), every knob ends within half the
    # smallest step of the target.
    space = SearchSpace(tuple(FloatKnob(f"x{i}", low=0.0, high=1.0) for i in range(8)))
    encoder = UnitBoxEncoder(space)
    target: Config = {f"x{i}": 0.1 + 0.1 * i for i in range(8)}
    start: Config = {f"x{i}": 0.95 - 0.1 * i for i in range(8)}
    acquisition: Any = Closeness(target, encoder)
    search = LocalSearch(encoder, None, set())
    # one raw sample: the climbs start from the start's neighbours and that sample
    (point,) = search.optimize(acquisition, 1, encoder.encode_many([start]), 1, 1, seed=0)
    reached = encoder.decode(point.tolist())
    assert all(abs(reached[k] - target[k]) <= 1 / 128 + 1e-9 for k in target), reached
