"""Studies with a candidate list: the spec validates it, and every designer step (default,
Sobol design, model-based, random fill-in) proposes only untaken candidates."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tuner.designer import make_designer
from tuner.designer.acquisition.criteria import build_acquisition
from tuner.designer.models.model import fit_models, outcome_data
from tuner.designer.sampling.candidates import CandidatePool, FeatureEncoder
from tuner.encoding import UnitBoxEncoder
from tuner.errors import StateError, ValidationError
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, TrialStatus

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
    assert {s.step for s in batch} <= {StepKind.DEFAULT, StepKind.GLOBAL}
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


# -- candidate features ------------------------------------------------------------------
CORES = {"large": 2, "xlarge": 4, "2xlarge": 8}
MEMORY = {"c4": 1.875, "m4": 4.0, "r4": 7.625}  # GiB per vCPU


def resources(config: dict[str, Any]) -> dict[str, float]:
    cores = CORES[config["size"]] * config["nodes"]
    return {"vcpus": float(cores), "memory_gib": cores * MEMORY[config["family"]]}


FEATURES = [resources(c) for c in CANDIDATES]


def featured(**changes: Any) -> StudySpec:
    return spec(candidate_features=FEATURES, **changes)


def test_features_round_trip_and_a_study_without_them_keeps_its_fingerprint() -> None:
    study = featured()
    assert study.candidate_features[3] == FEATURES[3]
    assert StudySpec.from_dict(study.to_dict()) == study
    assert "candidate_features" not in spec().to_dict()
    assert study.fingerprint() != spec().fingerprint()


@pytest.mark.parametrize(
    ("features", "field", "words"),
    [
        (FEATURES[:-1], "candidate_features", "one table of numbers per candidate"),
        ({"vcpus": 1.0}, "candidate_features", "list"),
        ([*FEATURES[:5], {}, *FEATURES[6:]], "candidate_features[5]", "non-empty"),
        (
            [*FEATURES[:2], {"vcpus": 8.0}, *FEATURES[3:]],
            "candidate_features[2]",
            "['vcpus']; every candidate needs the same (allowed: 'memory_gib', 'vcpus')",
        ),
        (
            [*FEATURES[:7], {"vcpus": math.inf, "memory_gib": 1.0}, *FEATURES[8:]],
            "candidate_features[7].vcpus",
            "finite number",
        ),
        (
            [*FEATURES[:1], {"vcpus": "8", "memory_gib": 1.0}, *FEATURES[2:]],
            "candidate_features[1].vcpus",
            "finite number",
        ),
        (
            [{"vcpus": 1.0, "memory_gib": True}, *FEATURES[1:]],
            "candidate_features[0].memory_gib",
            "finite number",
        ),
        ([{f"f{i}": 1.0 for i in range(17)} for _ in CANDIDATES], "candidate_features[0]", "16"),
        ([{"1bad": 1.0} for _ in CANDIDATES], "candidate_features[0].1bad", "feature name"),
    ],
)
def test_bad_features_are_named(features: Any, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(candidate_features=features)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_the_model_sees_the_categorical_knobs_and_the_features_scaled_to_the_unit_box() -> None:
    pool = CandidatePool(featured().candidates, UnitBoxEncoder(featured().space), tuple(FEATURES))
    encoder = pool.model_encoder
    assert isinstance(encoder, FeatureEncoder)
    assert encoder.d == 3 and list(encoder.cat_dims) == [0]  # family, memory_gib, vcpus
    X = pool.model_X
    assert X.shape == (len(CANDIDATES), 3)
    assert float(X[:, 1:].min()) == 0.0 and float(X[:, 1:].max()) == 1.0
    # vcpus span 8..96 (12x): log scale, so 4 x large (8) -> 0 and 16 x large (32) -> 0.56
    index = {key(c): i for i, c in enumerate(CANDIDATES)}
    low, mid = X[index[("c4", "large", 4)], 2], X[index[("c4", "large", 16)], 2]
    assert float(low) == 0.0
    assert float(mid) == pytest.approx(math.log(32 / 8) / math.log(96 / 8))
    # 8 x large and 4 x xlarge of one family are alike to the model; other families are not
    twin_a, twin_b = index[("m4", "large", 8)], index[("m4", "xlarge", 4)]
    assert torch.equal(X[twin_a], X[twin_b])
    assert not torch.equal(X[twin_a], X[index[("r4", "xlarge", 4)]])
    with pytest.raises(ValueError, match="not one of the study's candidates"):
        encoder.encode_many([{"family": "m4", "size": "large", "nodes": 5}])


def test_a_model_on_features_transfers_to_deployments_of_the_same_size() -> None:
    """What one deployment taught the model holds for another with the same totals."""
    study = featured(designer={"start_with_default": False})
    pool = CandidatePool(study.candidates, UnitBoxEncoder(study.space), tuple(FEATURES))
    measured = [c for c in CANDIDATES if c["size"] != "xlarge"]
    trials = tuple(
        Trial(i + 1, c, TrialStatus.COMPLETED, {"runtime_s": runtime(c)})
        for i, c in enumerate(measured)
    )
    data = outcome_data(study, pool.model_encoder, trials)
    model = fit_models(data, pool.model_encoder)
    unseen = [c for c in CANDIDATES if c["size"] == "xlarge"]
    with torch.no_grad():
        mean = model.posterior(pool.model_encoder.encode_many(unseen)).mean[:, 0]
    predicted = mean.exp() if data[0].log else mean
    truth = torch.tensor([runtime(c) for c in unseen], dtype=torch.float64)
    # every xlarge deployment has a measured twin (same vCPUs and memory): near-exact
    assert float(((predicted - truth).abs() / truth).max()) < 0.05


def failed_and_measured(goal: str = "minimize") -> tuple[StudySpec, tuple[Trial, ...]]:
    study = featured(
        objectives=[{"name": "runtime_s", "goal": goal}], designer={"start_with_default": False}
    )
    configs = CANDIDATES[::6]
    trials = tuple(
        Trial(
            i + 1,
            c,
            TrialStatus.INFEASIBLE if c["nodes"] == 4 else TrialStatus.COMPLETED,
            {} if c["nodes"] == 4 else {"runtime_s": runtime(c)},
        )
        for i, c in enumerate(configs)
    )
    return study, trials


@pytest.mark.parametrize("goal", ["minimize", "maximize"])
def test_failed_trials_count_as_the_worst_value_seen_when_imputed(goal: str) -> None:
    study, trials = failed_and_measured(goal)
    encoder = UnitBoxEncoder(study.space)
    failed = [t for t in trials if t.status is TrialStatus.INFEASIBLE]
    values = [t.metrics["runtime_s"] for t in trials if t.metrics]
    assert failed and len(values) > 3
    plain = outcome_data(study, encoder, trials)
    imputed = outcome_data(study, encoder, trials, impute_failures=True)
    assert plain[0].Y.shape[0] == len(values)
    assert imputed[0].Y.shape[0] == len(trials)
    worst = max(values) if goal == "minimize" else min(values)
    tail = imputed[0].Y[len(values) :, 0]
    assert torch.allclose(tail, torch.full_like(tail, imputed[0].transform(worst)))
    assert torch.equal(imputed[0].X[len(values) :], encoder.encode_many([t.config for t in failed]))
    # the feasibility classifier is unchanged, and several objectives are never imputed
    assert torch.equal(plain[-1].Y, imputed[-1].Y)
    pareto = featured(
        objectives=[{"name": "runtime_s", "goal": goal}, {"name": "cost_usd", "goal": goal}],
        designer={"start_with_default": False},
    )
    assert outcome_data(pareto, encoder, trials, impute_failures=True)[0].Y.shape[0] == len(values)


def test_a_margin_lowers_the_improvement_of_every_candidate() -> None:
    study, trials = failed_and_measured()
    encoder = UnitBoxEncoder(study.space)
    data = outcome_data(study, encoder, trials, impute_failures=True)
    model = fit_models(data, encoder)
    X = encoder.encode_many(CANDIDATES[1::6]).unsqueeze(-2)  # 12 untaken, one at a time
    values = []
    for margin in (0.0, 0.5):
        torch.manual_seed(0)  # the same pruned baseline for both
        acquisition = build_acquisition(study, model, data, data[0].X, None, True, 0, None, margin)
        with torch.no_grad():
            values.append(acquisition(X))
    assert bool((values[1] < values[0]).all())


def test_a_featured_study_with_failures_gets_model_based_candidates() -> None:
    study, trials = failed_and_measured()
    designer = make_designer(study)
    batch = designer.suggest(2, list(trials), [])
    assert [s.step for s in batch] == [StepKind.GLOBAL] * 2 and not any(s.warning for s in batch)
    taken = {key(t.config) for t in trials}
    assert all(key(s.config) in {key(c) for c in CANDIDATES} - taken for s in batch)
