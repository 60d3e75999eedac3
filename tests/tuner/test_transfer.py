"""Transfer from earlier studies (``tuner/transfer.py``, ``designer/models/transfer.py``).

The pieces against their definitions (ranking losses by brute force, leave-one-out against a
GP refitted without the point, the prior mean's loss against GPyTorch's, the embedding lift
against ``project``), then the behaviour the issue asks for: a source that helps gets weight,
one that misleads loses it as the study's own data grows, knobs missing on either side are
ignored, a deleted source is a warning, not a crash.
"""

from __future__ import annotations

import math
import random
import warnings
from typing import Any

import pytest
import torch
from botorch.exceptions.warnings import InputDataWarning
from botorch.models import SingleTaskGP
from gpytorch.mlls import ExactMarginalLogLikelihood

from runner.loop import Measured, run_trials
from runner.memory import MemoryAPI
from tuner.designer.models.likelihood import loss_closure
from tuner.designer.models.means import Prior
from tuner.designer.models.model import build_model, fit_models, outcome_data
from tuner.designer.models.transfer import (
    LIFT_GRID,
    TARGET,
    embedding_lift,
    leave_one_out,
    make_transfer,
    ranking_loss,
    source_models,
)
from tuner.embedding import HeSBOEmbedding
from tuner.encoding import UnitBoxEncoder
from tuner.errors import ValidationError
from tuner.study import StudySpec, TransferSource
from tuner.transfer import read_sources, source_study
from tuner.trial import StepKind, Trial, TrialStatus

KNOBS: list[dict[str, Any]] = [
    {"name": f"x{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(3)
]


def _spec(
    name: str = "target", knobs: list[dict[str, Any]] | None = None, **extra: Any
) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": knobs or KNOBS,
            "objectives": [{"name": "y", "goal": "minimize"}],
            "designer": {"seed": 3, "start_with_default": False},
            **extra,
        }
    )


def _bowl(config: dict[str, Any], centre: float = 0.3) -> float:
    return sum((float(config[f"x{i}"]) - centre) ** 2 for i in range(3) if f"x{i}" in config)


def _trials(spec: StudySpec, f: Any, n: int, seed: int = 0) -> list[Trial]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        config = {k.name: rng.random() for k in spec.space.knobs}
        out.append(Trial(i + 1, config, TrialStatus.COMPLETED, {"y": f(config)}))
    return out


# -- the spec -----------------------------------------------------------------------------
def test_transfer_from_round_trips_and_names_bad_fields() -> None:
    spec = _spec(transfer_from=["tpcc", {"study": "ycsb", "knobs": {"x0": "old_x0"}}])
    assert spec.transfer_from == (
        TransferSource("tpcc"),
        TransferSource("ycsb", (("x0", "old_x0"),)),
    )
    assert StudySpec.from_dict(spec.to_dict()) == spec
    assert "transfer_from" not in _spec().to_dict()  # specs without sources keep fingerprints
    cases = [
        (["target"], "transfer_from[0].study"),
        (["a", "a"], "transfer_from[1].study"),
        ([{"study": "a", "knobs": {"nope": "x"}}], "transfer_from[0].knobs.nope"),
        ([{"study": "a", "weight": 1}], "transfer_from[0].weight"),
        ([3], "transfer_from[0]"),
        (["bad name!"], "transfer_from[0].study"),
    ]
    for value, field in cases:
        with pytest.raises(ValidationError) as raised:
            _spec(transfer_from=value)
        assert raised.value.field == field
    with pytest.raises(ValidationError, match="several objectives"):
        StudySpec.from_dict(
            {
                "name": "mo",
                "knobs": KNOBS,
                "objectives": [{"name": "a"}, {"name": "b"}],
                "transfer_from": ["x"],
            }
        )


# -- reading a source ---------------------------------------------------------------------
def test_source_matches_knobs_by_name_or_rename_and_ignores_the_rest() -> None:
    target = _spec(knobs=[*KNOBS, {"name": "mode", "kind": "categorical", "choices": ["a", "b"]}])
    source_knobs = [
        {"name": "x0", "kind": "float", "low": 0.0, "high": 1.0},
        {"name": "old_x1", "kind": "float", "low": 0.0, "high": 1.0},
        {"name": "extra", "kind": "int", "low": 0, "high": 9},
        {"name": "mode", "kind": "int", "low": 0, "high": 1},  # a number against a choice
    ]
    source_spec = StudySpec.from_dict(
        {"name": "src", "knobs": source_knobs, "objectives": [{"name": "tps"}]}
    )
    trials = [
        Trial(
            1,
            {"x0": 0.1, "old_x1": 0.2, "extra": 3, "mode": 1},
            TrialStatus.COMPLETED,
            {"tps": 5.0},
        ),
        Trial(2, {"x0": 0.4, "old_x1": 0.5, "extra": 1, "mode": 0}, TrialStatus.INFEASIBLE),
        Trial(
            3,
            {"x0": 0.4, "old_x1": 0.5, "extra": 1, "mode": 0},
            TrialStatus.EARLY_STOPPED,
            {"tps": 1.0},
        ),
        Trial(
            4,
            {"x0": 0.7, "old_x1": 0.9, "extra": 2, "mode": 0},
            TrialStatus.COMPLETED,
            {"tps": math.nan},
        ),
        Trial(
            5,
            {"x0": 0.8, "old_x1": 0.6, "extra": 2, "mode": 0},
            TrialStatus.COMPLETED,
            {"tps": 7.0},
        ),
    ]
    got = source_study(target, TransferSource("src", (("x1", "old_x1"),)), source_spec, trials)
    assert got.knobs == ("x0", "x1")  # x2 missing there, mode of another kind, extra unknown here
    assert got.points == (({"x0": 0.1, "x1": 0.2}, 5.0), ({"x0": 0.8, "x1": 0.6}, 7.0))
    assert got.goal.value == "maximize" and got.digest
    models = source_models(target, [got])
    assert len(models) == 1 and models[0].dims.tolist() == [0, 1]
    # the model reads only the shared knobs: x2 and mode change nothing
    a = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 1.0, 1.0]], dtype=torch.float64)
    with torch.no_grad():
        means = models[0].mean(a)
    assert float(means[0]) == pytest.approx(float(means[1]))


# -- the pieces against their definitions -------------------------------------------------
def test_ranking_loss_counts_discordant_pairs() -> None:
    generator = torch.Generator().manual_seed(0)
    y = torch.tensor([0.3, 1.0, 0.3, -2.0, 5.0], dtype=torch.float64)
    samples = torch.randn(7, 5, generator=generator, dtype=torch.float64)
    got = ranking_loss(samples, y)
    for s in range(7):
        count = sum(
            1
            for j in range(5)
            for k in range(j + 1, 5)
            if y[j] != y[k] and (samples[s, j] < samples[s, k]) != (y[j] < y[k])
        )
        assert float(got[s]) == count


def test_leave_one_out_equals_the_gp_without_that_point() -> None:
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    trials = _trials(spec, _bowl, 8)
    # a trial measured three times trains three equal rows: they leave together
    trials[2] = Trial(3, trials[2].config, TrialStatus.COMPLETED, {"y": 0.5}, repeats=3,
                      spread={"y": 0.1})  # fmt: skip
    data = outcome_data(spec, encoder, tuple(trials))
    model = fit_models(data[:1], encoder)
    assert isinstance(model, SingleTaskGP)
    points, values, mean, std = leave_one_out(model)
    assert points.shape == (8, 3)
    X, y = model.train_inputs[0], model.train_targets
    for i in range(8):
        keep = [r for r in range(X.shape[0]) if not torch.equal(X[r], points[i])]
        with warnings.catch_warnings():  # the rows left are not standardized: no matter here
            warnings.simplefilter("ignore", InputDataWarning)
            rest = SingleTaskGP(X[keep], y[keep].unsqueeze(-1), outcome_transform=None)
        rest.load_state_dict(
            {k: v for k, v in model.state_dict().items() if not k.startswith("outcome")},
            strict=False,
        )
        rest.eval()
        with torch.no_grad():
            posterior = rest.likelihood(rest(points[i : i + 1]))  # a new measurement there
        rows = [r for r in range(X.shape[0]) if torch.equal(X[r], points[i])]
        k = len(rows)
        noise = float(model.likelihood.noise.detach())
        expected_var = (
            float(posterior.variance.detach()) - noise + noise / k
        )  # the mean of k repeats
        assert float(mean[i]) == pytest.approx(float(posterior.mean.detach()), rel=1e-5, abs=1e-7)
        assert float(std[i]) ** 2 == pytest.approx(expected_var, rel=1e-4, abs=1e-8)
        assert float(values[i]) == pytest.approx(float(y[rows].mean()))


def test_the_prior_mean_loss_is_gpytorchs() -> None:
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    data = outcome_data(spec, encoder, tuple(_trials(spec, _bowl, 9)))
    prior = Prior("y", lambda X: torch.sin(3 * X[..., 0]) - X[..., 1])
    model = build_model(data, encoder, prior=prior)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    mll.train()
    closure = loss_closure(mll)
    assert closure is not None
    with torch.no_grad():
        model.mean_module.raw_constant.fill_(0.4)
    X, y = model.train_inputs[0], model.train_targets
    expected = -mll(model(X), y)
    assert float(closure().detach()) == pytest.approx(float(expected.detach()), rel=1e-9)


def test_the_lift_is_the_projection_encoded() -> None:
    knobs: list[dict[str, Any]] = [
        *[{"name": f"f{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(6)],
        {"name": "n", "kind": "int", "low": -1, "high": 1000, "special_values": [-1]},
        {"name": "c", "kind": "categorical", "choices": ["a", "b", "c"]},
    ]
    spec = _spec(knobs=knobs, embedding={"kind": "llamatune", "dims": 3})
    assert spec.embedding is not None
    embedding = HeSBOEmbedding(spec.space, spec.embedding)
    encoder = UnitBoxEncoder(spec.space)
    lift = embedding_lift(embedding)
    buckets = spec.embedding.buckets
    generator = torch.Generator().manual_seed(1)
    levels = torch.randint(0, buckets, (50, 3), generator=generator)
    inner = levels.to(torch.float64) / (buckets - 1)
    got = lift(inner)
    for row, level in zip(got, levels.tolist(), strict=True):
        expected = encoder.encode(embedding.project(embedding.point(level)))
        # the nearest grid point: half a grid step of the axis, stretched by the special value's
        # band (1 / 0.8), and an integer knob then rounds to a neighbouring value (1 / 1001)
        assert row.tolist() == pytest.approx(expected, abs=1.25 / (LIFT_GRID - 1) + 1 / 1001)


# -- behaviour ----------------------------------------------------------------------------
def _weights(source_f: Any, n_target: int, goal: str = "minimize") -> dict[str, float]:
    target = _spec(transfer_from=["src"])
    source_spec = StudySpec.from_dict(
        {"name": "src", "knobs": KNOBS, "objectives": [{"name": "y", "goal": goal}]}
    )
    sources, _ = read_sources(
        target, lambda name: (source_spec, _trials(source_spec, source_f, 40, 7))
    )
    transfer = make_transfer(target, sources)
    assert transfer is not None
    encoder = UnitBoxEncoder(target.space)
    data = outcome_data(target, encoder, tuple(_trials(target, _bowl, n_target, 11)))
    plain = fit_models(data[:1], encoder)
    assert isinstance(plain, SingleTaskGP)
    _, weights = transfer.step("y", plain, seed=5)
    assert sum(weights.values()) == pytest.approx(1.0)
    return weights


def test_a_source_that_ranks_the_studys_trials_gets_the_weight() -> None:
    weights = _weights(lambda c: _bowl(c, 0.32), 12)
    assert weights["src"] > 0.7
    # the same evidence under the opposite goal and sign ranks the same way
    flipped = _weights(lambda c: -_bowl(c, 0.32), 12, goal="maximize")
    assert flipped["src"] > 0.7


def test_a_misleading_source_loses_its_weight_as_the_study_measures() -> None:
    early = _weights(lambda c: -_bowl(c), 2)  # nothing to rank by yet: the sources share it
    assert early == {"src": 1.0, TARGET: 0.0}
    late = _weights(lambda c: -_bowl(c), 12)  # it ranks every pair the wrong way round
    assert late["src"] == 0.0 and late[TARGET] == 1.0


def _run_target(api: MemoryAPI, spec: StudySpec, n: int) -> list[Trial]:
    return run_trials(
        spec, lambda c: Measured(TrialStatus.COMPLETED, metrics={"y": _bowl(c, 0.35)}), n, api=api
    )


def test_a_study_seeds_its_design_with_the_sources_best_and_stores_the_weights() -> None:
    api = MemoryAPI()
    source = _spec("src")
    api.create_study(source)
    api.import_trials("src", _trials(source, lambda c: _bowl(c, 0.3), 30, 1))
    best = min(api.list_trials("src"), key=lambda t: t.metrics["y"])
    trials = _run_target(api, _spec(transfer_from=["src"]), 9)
    assert trials[0].step is StepKind.TRANSFER and trials[0].config == best.config
    assert [t.step for t in trials[1:5]] == [StepKind.SOBOL] * 4  # the design: 5 in all
    model_steps = [t for t in trials if t.step.model_based]
    assert model_steps and all(dict(t.transfer).keys() == {"src", TARGET} for t in model_steps)
    assert all(not t.transfer for t in trials if not t.step.model_based)


def test_a_deleted_source_is_a_warning_and_the_others_still_count() -> None:
    api = MemoryAPI()
    source = _spec("src")
    api.create_study(source)
    api.import_trials("src", _trials(source, _bowl, 20, 1))
    trials = _run_target(api, _spec(transfer_from=["gone", "src"]), 8)
    assert all("'gone' not found" in t.warning for t in trials)
    assert trials[0].step is StepKind.TRANSFER
    assert all(dict(t.transfer).keys() == {"src", TARGET} for t in trials if t.step.model_based)
    # no source at all: an ordinary study, with the warning
    lonely = _run_target(api, _spec("lonely", transfer_from=["gone"]), 7)
    assert [t.step for t in lonely[:5]] == [StepKind.SOBOL] * 5
    assert all(not t.transfer for t in lonely)


def test_the_embedded_designer_learns_through_the_embedding() -> None:
    knobs = [{"name": f"x{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(8)]
    embedding = {"kind": "llamatune", "dims": 3, "seed": 1}
    api = MemoryAPI()
    source = _spec("src", knobs=knobs, embedding=embedding)
    api.create_study(source)
    api.import_trials("src", _trials(source, _bowl, 25, 2))
    trials = _run_target(api, _spec(knobs=knobs, embedding=embedding, transfer_from=["src"]), 9)
    assert trials[0].step is StepKind.TRANSFER and len(trials[0].embedded) == 3
    model_steps = [t for t in trials if t.step.model_based]
    assert model_steps and all(dict(t.transfer).keys() == {"src", TARGET} for t in model_steps)


def test_a_sources_best_is_its_best_trial_that_met_its_constraints() -> None:
    source = _spec("src", outcome_constraints=["p99 <= 10"])
    trials = [
        Trial(1, {"x0": 0.1, "x1": 0.1, "x2": 0.1}, TrialStatus.COMPLETED, {"y": 1.0, "p99": 50}),
        Trial(2, {"x0": 0.2, "x1": 0.2, "x2": 0.2}, TrialStatus.COMPLETED, {"y": 2.0, "p99": 5}),
        Trial(3, {"x0": 0.3, "x1": 0.3, "x2": 0.3}, TrialStatus.COMPLETED, {"y": 3.0, "p99": 5}),
    ]
    got = source_study(_spec(), TransferSource("src"), source, trials)
    assert got.best == {"x0": 0.2, "x1": 0.2, "x2": 0.2}  # minimize y, p99 <= 10
    assert len(got.points) == 3  # the model still learns the objective where p99 broke
