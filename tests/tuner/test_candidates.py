"""Studies with a candidate list: the spec validates it, and every designer step (default,
Sobol design, model-based, random fill-in) proposes only untaken candidates."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tuner.designer import make_designer
from tuner.errors import StateError, ValidationError
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

SIZES = {
    "large": [4, 6, 8, 10, 12, 16, 24, 32, 40, 48],
    "xlarge": [4, 8, 12, 20],
    "2xlarge": [4, 8],
}
KNOBS = [
    {"name": "family", "kind": "categorical", "choices": ["c4", "m4", "r4"], "default": "m4"},
    {"name": "size", "kind": "ordinal", "choices": list(SIZES), "default": "large"},
    {"name": "nodes", "kind": "int", "low": 4, "high": 48, "log": True, "default": 4},
]
CANDIDATES = [
    {"family": f, "size": s, "nodes": n}
    for f in ("c4", "m4", "r4")
    for s in SIZES
    for n in SIZES[s]
]


def spec(**changes: Any) -> StudySpec:
    data: dict[str, Any] = {
        "name": "cloud",
        "knobs": KNOBS,
        "objectives": [{"name": "runtime_s", "goal": "minimize"}],
        "candidates": CANDIDATES,
    }
    data.update(changes)
    return StudySpec.from_dict(data)


def key(config: dict[str, Any]) -> tuple[Any, ...]:
    return (config["family"], config["size"], config["nodes"])


def runtime(config: dict[str, Any]) -> float:
    """A made-up job: more and bigger nodes help until 16 vCPU-nodes; r4 is fastest."""
    cores = {"large": 2, "xlarge": 4, "2xlarge": 8}[config["size"]] * config["nodes"]
    family = {"c4": 1.3, "m4": 1.2, "r4": 1.0}[config["family"]]
    return family * (1000.0 / cores + 3.0 * abs(math.log(cores / 64.0)) * 10)


def test_the_list_round_trips_and_an_empty_list_keeps_older_fingerprints() -> None:
    with_list = spec()
    assert len(with_list.candidates) == len(CANDIDATES)
    assert StudySpec.from_dict(with_list.to_dict()) == with_list
    without = spec(candidates=[])
    assert "candidates" not in without.to_dict()
    assert without.fingerprint() != with_list.fingerprint()


@pytest.mark.parametrize(
    ("candidates", "field", "words"),
    [
        ([{"family": "c4", "size": "large"}], "candidates[0].nodes", "missing"),
        ([{"family": "x9", "size": "large", "nodes": 4}], "candidates[0].family", "x9"),
        ([{"family": "m4", "size": "large", "nodes": 4, "zone": "a"}], "candidates[0].zone", ""),
        ([CANDIDATES[0], CANDIDATES[1], dict(CANDIDATES[0])], "candidates[2]", "candidates[0]"),
        ("c4.large", "candidates", "list"),
    ],
)
def test_a_bad_candidate_is_named(candidates: Any, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(candidates=candidates, designer={"start_with_default": False})
    assert caught.value.field == field
    assert words in str(caught.value)


def test_the_default_configuration_must_be_a_candidate_when_it_is_measured_first() -> None:
    others = [c for c in CANDIDATES if key(c) != ("m4", "large", 4)]
    with pytest.raises(ValidationError) as caught:
        spec(candidates=others)
    assert caught.value.field == "candidates"
    assert "start_with_default" in str(caught.value)
    assert len(spec(candidates=others, designer={"start_with_default": False}).candidates) == 47


def test_candidates_must_satisfy_the_parameter_constraints_and_not_use_an_embedding() -> None:
    ints = [{"name": n, "kind": "int", "low": 0, "high": 10, "default": 1} for n in "ab"]
    with pytest.raises(ValidationError) as caught:
        spec(
            knobs=ints,
            parameter_constraints=["a + b <= 10"],
            candidates=[{"a": 1, "b": 1}, {"a": 8, "b": 5}],
        )
    assert caught.value.field == "candidates[1]" and "a + b <= 10" in str(caught.value)
    with pytest.raises(ValidationError) as caught:
        spec(embedding={"kind": "llamatune", "dims": 2})
    assert caught.value.field == "candidates"


@pytest.mark.parametrize("algorithm", ["bo", "sobol", "random"])
def test_every_suggestion_is_an_untaken_candidate_until_the_list_runs_out(algorithm: str) -> None:
    small = CANDIDATES[:12]  # m4.large x 4 is not among them
    study = spec(candidates=small, designer={"algorithm": algorithm, "start_with_default": False})
    designer = make_designer(study)
    trials: list[Trial] = []
    while len(trials) < len(small):
        batch = designer.suggest(3, trials, [])
        assert batch
        for s in batch:
            trials.append(
                Trial(
                    len(trials) + 1,
                    s.config,
                    TrialStatus.COMPLETED,
                    {"runtime_s": runtime(s.config)},
                )
            )
    assert sorted(key(t.config) for t in trials) == sorted(key(c) for c in small)
    with pytest.raises(StateError, match="exhausted"):
        designer.suggest(1, trials, [])


def test_pending_candidates_are_not_handed_out_twice() -> None:
    designer = make_designer(spec(designer={"initial_trials": 3}))
    done = [
        Trial(i + 1, c, TrialStatus.COMPLETED, {"runtime_s": runtime(c)})
        for i, c in enumerate([CANDIDATES[0], CANDIDATES[20], CANDIDATES[40]])
    ]
    pending = [Trial(4, CANDIDATES[30], TrialStatus.ACTIVE)]
    batch = designer.suggest(4, done, pending)
    keys = [key(s.config) for s in batch]
    assert len(set(keys)) == 4
    assert {s.source for s in batch} <= {"default", "bo"}
    assert not set(keys) & {
        key(c) for c in [CANDIDATES[0], CANDIDATES[20], CANDIDATES[40], CANDIDATES[30]]
    }
    assert all(k in {key(c) for c in CANDIDATES} for k in keys)


def test_the_sobol_design_spreads_over_families_and_sizes() -> None:
    seen = set()
    for seed in range(4):
        study = spec(designer={"algorithm": "sobol", "seed": seed, "start_with_default": False})
        seen |= {
            (s.config["family"], s.config["size"]) for s in make_designer(study).suggest(6, [], [])
        }
    assert len(seen) == 9  # every instance type within 24 design points


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_design_asked_one_point_at_a_time_is_the_design_asked_at_once(seed: int) -> None:
    study = spec(designer={"algorithm": "sobol", "seed": seed, "start_with_default": False})
    at_once = [key(s.config) for s in make_designer(study).suggest(6, [], [])]
    designer = make_designer(study)
    trials: list[Trial] = []
    for i in range(6):
        config = designer.suggest(1, trials, [])[0].config
        trials.append(Trial(i + 1, config, TrialStatus.INFEASIBLE, {}))
    assert [key(t.config) for t in trials] == at_once
    # one at a time the design still moves across instance types, not along the node
    # counts of the first point's type
    assert len({k[:2] for k in at_once[:3]}) >= 2


@pytest.mark.slow
def test_bo_finds_the_best_candidate_within_a_third_of_the_list() -> None:
    best = min(CANDIDATES, key=runtime)
    found = 0
    for seed in range(3):
        designer = make_designer(spec(designer={"seed": seed}))
        trials: list[Trial] = []
        for i in range(len(CANDIDATES) // 3):
            config = designer.suggest(1, trials, [])[0].config
            trials.append(
                Trial(i + 1, config, TrialStatus.COMPLETED, {"runtime_s": runtime(config)})
            )
        found += any(key(t.config) == key(best) for t in trials)
    assert found >= 2
