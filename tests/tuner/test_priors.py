"""Expert priors: the recommended region first (design + coarse BO), then the whole space."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tuner.designer import BODesigner, Designer, Suggestion
from tuner.designer.acquisition.criteria import OptimizerSettings
from tuner.designer.sampling.priors import PriorRegion
from tuner.designer.steps.embedded import EmbeddedDesigner
from tuner.encoding import UnitBoxEncoder
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, TrialStatus

FAST = OptimizerSettings(num_restarts=2, raw_samples=64, maxiter=30)
SOURCE = "test: made-up guide"
CONTINUOUS: list[dict[str, Any]] = [
    {"name": "mem", "kind": "float", "low": 1.0, "high": 1024.0, "log": True, "default": 8.0,
     "recommended": [64.0, 256.0], "recommended_source": SOURCE},
    {"name": "ratio", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5,
     "recommended": [0.7, 0.9], "recommended_source": SOURCE},
    {"name": "free", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5},
]  # fmt: skip
MIXED: list[dict[str, Any]] = [
    *CONTINUOUS,
    {"name": "workers", "kind": "int", "low": 1, "high": 32, "default": 2,
     "recommended": [4, 8], "recommended_source": SOURCE},
    {"name": "mode", "kind": "categorical", "choices": ["a", "b", "c", "d"], "default": "a",
     "recommended": ["b", "c"], "recommended_source": SOURCE},
]  # fmt: skip


def make_spec(knobs: list[dict[str, Any]], priors: bool = True, **extra: Any) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "priors",
            "knobs": knobs,
            "objectives": [{"name": "y", "goal": "maximize"}],
            "designer": {"initial_trials": 4, "seed": 2, "expert_priors": priors},
            **extra,
        }
    )


def inside(config: dict[str, Any]) -> bool:
    checks = [64.0 - 1e-6 <= config["mem"] <= 256.0 + 1e-6, 0.7 <= config["ratio"] <= 0.9]
    if "workers" in config:
        checks += [4 <= config["workers"] <= 8, config["mode"] in ("b", "c")]
    return all(checks)


def y_of(config: dict[str, Any]) -> float:
    """Best outside the recommended region (free near 1, ratio near 0.2): priors can be wrong."""
    return -((config["ratio"] - 0.2) ** 2) - (config["free"] - 1.0) ** 2


def drive(designer: Designer, n: int) -> list[Trial]:
    trials: list[Trial] = []
    for _ in range(n):
        (s,) = designer.suggest(1, trials, [])
        trials.append(
            Trial(len(trials) + 1, s.config, TrialStatus.COMPLETED, {"y": y_of(s.config)},
                  source=s.step.value, step=s.step, embedded=s.embedded)
        )  # fmt: skip
    return trials


def test_region_squeezes_points_and_knows_what_is_inside() -> None:
    encoder = UnitBoxEncoder(make_spec(MIXED).space)
    region = PriorRegion.of(encoder)
    assert region is not None
    points = region.squeeze(torch.rand(200, encoder.d, generator=torch.Generator().manual_seed(0)))
    configs = [encoder.decode(p.tolist()) for p in points]
    assert all(inside(c) and region.contains(encoder, c) for c in configs)
    assert {c["mode"] for c in configs} == {"b", "c"}
    assert {c["workers"] for c in configs} == set(range(4, 9))
    assert not region.contains(encoder, {**configs[0], "mode": "a"})
    assert not region.contains(encoder, {**configs[0], "mem": 8.0})


def test_no_recommendation_means_no_region() -> None:
    plain = [{"name": "x", "kind": "float", "low": 0.0, "high": 1.0}]
    assert PriorRegion.of(UnitBoxEncoder(make_spec(plain).space)) is None


@pytest.mark.parametrize("knobs", [CONTINUOUS, MIXED], ids=["continuous", "mixed"])
def test_coarse_then_fine(knobs: list[dict[str, Any]]) -> None:
    trials = drive(BODesigner(make_spec(knobs), settings=FAST), 13)
    assert trials[0].step is StepKind.DEFAULT
    design, coarse, fine = trials[1:5], trials[5:9], trials[9:]
    assert [t.step for t in design] == [StepKind.SOBOL] * 4
    assert all(inside(t.config) for t in design + coarse)
    assert all(t.step.model_based for t in coarse)
    # the optimum lies outside the region: once widened, the search leaves it
    assert not all(inside(t.config) for t in fine)


def test_without_the_switch_the_region_is_ignored() -> None:
    trials = drive(BODesigner(make_spec(CONTINUOUS, priors=False), settings=FAST), 5)
    assert not all(inside(t.config) for t in trials[1:])


def test_priors_round_trip_through_the_spec() -> None:
    spec = make_spec(MIXED)
    assert spec.designer.expert_priors is True
    assert StudySpec.from_dict(spec.to_dict()) == spec
    assert "expert_priors" not in make_spec(MIXED, priors=False).to_dict()["designer"]


def test_in_an_embedding_the_prior_seeds_the_initial_design() -> None:
    many = MIXED + [
        {"name": f"k{i}", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5}
        for i in range(6)
    ]
    spec = make_spec(many, embedding={"kind": "llamatune", "dims": 3})
    designer = EmbeddedDesigner(spec, settings=FAST)
    trials = drive(designer, 6)
    seeds = trials[1:5]
    assert [t.step for t in seeds] == [StepKind.SOBOL] * 4
    assert all(len(t.embedded) == 3 for t in trials[1:])
    plain = EmbeddedDesigner(make_spec(many, priors=False, embedding={"kind": "llamatune",
                                                                      "dims": 3}))  # fmt: skip
    first: Suggestion = plain.suggest(2, trials[:1], [])[0]
    assert first.config != seeds[0].config  # the prior changed the design
    # seeds come from the region: mapped through the embedding they lean toward it
    near = sum(abs(t.config["ratio"] - 0.8) < 0.3 for t in seeds)
    assert near >= 2
