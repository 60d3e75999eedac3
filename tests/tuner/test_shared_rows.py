"""The gathered posterior (``fast/shared_rows.py``) gives the acquisition values of the plain call.

On a mixed space, for every acquisition ``build_acquisition`` returns there: qLogNEI on one
GP, with an outcome constraint (a batched multi-output GP) and with a feasibility outcome as
well (a ``ModelListGP``), qLogNEHVI with two objectives, and qLogPoF before any trial is
feasible; each without and with pending points. The candidates are scored as the local
search scores them: ``b x 1 x d`` batches. qLogNEI's own direct sampling at the candidates
(``fast/candidate_samples.py``, tested in ``test_candidate_samples.py``) is turned off here, so
that its batches reach the posterior this module gathers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from botorch.models import ModelListGP, SingleTaskGP

import tuner.designer.fast.candidate_samples as candidate_samples_module
import tuner.designer.fast.shared_rows as shared_rows_module
from tuner.designer.acquisition.criteria import build_acquisition
from tuner.designer.fast.shared_rows import SharedRowsModel, shared_rows, training_marginals
from tuner.designer.models.likelihood import ScaledNoiseLikelihood
from tuner.designer.models.model import fit_models, outcome_data
from tuner.encoding import UnitBoxEncoder
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

KNOBS: list[dict[str, Any]] = [
    {"name": "f", "kind": "float", "low": 0.0, "high": 10.0},
    {"name": "small", "kind": "int", "low": 1, "high": 16},
    {"name": "wide", "kind": "int", "low": 0, "high": 100_000},
    {"name": "mode", "kind": "categorical", "choices": ["a", "b", "c", "d"]},
    {"name": "mixed", "kind": "categorical", "choices": ["x", 2, 3.5]},
    {"name": "level", "kind": "ordinal", "choices": [1, 2, 4, 8, 16]},
    {"name": "flag", "kind": "bool"},
]
TOLERANCE = 1e-9


def _spec(case: str) -> StudySpec:
    objectives = [{"name": "y", "goal": "maximize"}]
    if case == "hypervolume":
        objectives.append({"name": "c", "goal": "minimize"})
    constrained = case in ("constrained", "feasibility", "no-feasible", "stopped")
    return StudySpec.from_dict(
        {
            "name": "shared-rows",
            "knobs": KNOBS,
            "objectives": objectives,
            "outcome_constraints": ["c <= 0.3"] if constrained else [],
        }
    )


def _trials(spec: StudySpec, case: str, n: int = 30) -> list[Trial]:
    encoder = UnitBoxEncoder(spec.space)
    generator = torch.Generator().manual_seed(5)
    X = encoder.snap(torch.rand(n, encoder.d, generator=generator, dtype=torch.float64))
    weights = torch.randn(encoder.d, generator=generator, dtype=torch.float64)
    trials = []
    for i, row in enumerate(X):
        y = float((torch.sin(3 * row + weights) * weights).sum())
        c = float(row[:3].mean()) + (10.0 if case == "no-feasible" else 0.0)
        status, metrics = TrialStatus.COMPLETED, {"y": y, "c": c}
        if case == "feasibility" and i % 7 == 3:
            status, metrics = TrialStatus.INFEASIBLE, {}
        windows = 0
        if case == "stopped":  # every fifth stopped after 4 of 10 windows: a noise per row
            status, windows = (TrialStatus.EARLY_STOPPED, 4) if i % 5 == 2 else (status, 10)
        config = encoder.decode(row.tolist())
        trials.append(
            Trial(id=i + 1, config=config, status=status, metrics=metrics, windows=windows)
        )
    return trials


@pytest.fixture(autouse=True)
def _botorch_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    """qLogNEI samples through ``model.posterior``, as BoTorch's class does."""
    monkeypatch.setattr(candidate_samples_module, "direct_values", lambda *args: None)
    monkeypatch.setattr(candidate_samples_module, "candidate_samples", lambda *args: None)


CASES = ["plain", "constrained", "feasibility", "hypervolume", "no-feasible", "stopped"]


@pytest.mark.parametrize("path", ["direct", "lazy"])
@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_scores_equal_the_plain_call(
    case: str, pending: bool, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ways of gathering: from the GPs' caches (``_direct``, what the local search
    gets) and from the posterior over the unique rows (``_gather``, the general one)."""
    spec = _spec(case)
    encoder = UnitBoxEncoder(spec.space)
    trials = _trials(spec, case)
    data = outcome_data(spec, encoder, tuple(trials))
    model = fit_models(data, encoder)
    if case == "feasibility":
        assert isinstance(model, ModelListGP)
    elif case in ("constrained", "hypervolume"):
        assert isinstance(model, SingleTaskGP) and model.num_outputs == 2
    generator = torch.Generator().manual_seed(9)
    X_pending = None
    if pending:
        X_pending = encoder.snap(torch.rand(2, encoder.d, generator=generator).double())
    reference = [-5.0, 2.0] if case == "hypervolume" else None
    acquisition = build_acquisition(
        spec,
        model,
        data,
        data[0].X,
        X_pending,
        case != "no-feasible",
        seed=3,
        reference=reference,
    )
    candidates = encoder.snap(torch.rand(300, encoder.d, generator=generator).double())
    candidates[:3] = data[0].X[:3]  # points of the baseline score too
    taken: list[str] = []
    original_direct, original_gather = shared_rows_module._direct, shared_rows_module._gather

    def direct(*args: Any) -> Any:
        result = original_direct(*args) if path == "direct" else None
        if result is not None:
            taken.append("direct")
        return result

    def gather(*args: Any) -> Any:
        result = original_gather(*args)
        if result is not None:
            taken.append("lazy")
        return result

    monkeypatch.setattr(shared_rows_module, "_direct", direct)
    monkeypatch.setattr(shared_rows_module, "_gather", gather)
    with torch.no_grad():
        expected = acquisition(candidates.unsqueeze(-2))
        with shared_rows(acquisition):
            got = acquisition(candidates.unsqueeze(-2))
    assert taken and set(taken) == {path}  # that path was taken, every time
    assert acquisition.model is model  # and the model is back
    assert torch.isfinite(expected).all()
    assert ((got - expected).abs() <= TOLERANCE * expected.abs()).all()


def test_greedy_pending_picks_see_the_model_itself() -> None:
    """``set_X_pending`` outside the context re-caches the baseline's Cholesky factor,
    which BoTorch only does for the model's own type."""
    spec = _spec("constrained")
    encoder = UnitBoxEncoder(spec.space)
    data = outcome_data(spec, encoder, tuple(_trials(spec, "constrained")))
    model = fit_models(data, encoder)
    acquisition = build_acquisition(spec, model, data, data[0].X, None, True, seed=3)
    candidates = encoder.snap(torch.rand(64, encoder.d, dtype=torch.float64))
    with torch.no_grad(), shared_rows(acquisition):
        first = acquisition(candidates.unsqueeze(-2))
    acquisition.set_X_pending(candidates[:1])
    assert acquisition._cache_root
    # the local search never scores a taken point: next to its pending copy the joint
    # covariance is singular, and the jitter of the Cholesky factor amplifies rounding
    rest = candidates[1:].unsqueeze(-2)
    with torch.no_grad():
        expected = acquisition(rest)
        with shared_rows(acquisition):
            got = acquisition(rest)
    assert ((got - expected).abs() <= TOLERANCE * expected.abs()).all()
    assert not torch.equal(first[1:], got)


def test_other_inputs_take_the_plain_call() -> None:
    """Inputs without a batch, or whose batches share no rows worth it, are passed on."""
    spec = _spec("plain")
    encoder = UnitBoxEncoder(spec.space)
    data = outcome_data(spec, encoder, tuple(_trials(spec, "plain")))
    model = fit_models(data, encoder)
    wrapped = SharedRowsModel(model)
    X = torch.rand(4, 3, encoder.d, dtype=torch.float64)  # no row shared
    assert shared_rows_module._plan(X) is None
    assert shared_rows_module._plan(X[0]) is None
    with torch.no_grad():
        for inputs in (X, X[0]):
            a, b = wrapped.posterior(inputs), model.posterior(inputs)
            assert torch.equal(a.mean, b.mean)
            assert torch.equal(a.variance, b.variance)


def test_gathered_covariance_equals_the_batched_one() -> None:
    """Mean and covariance blocks of each batch, with several shared rows and one own row,
    and with two own rows (the whole matrix gathered)."""
    spec = _spec("constrained")
    encoder = UnitBoxEncoder(spec.space)
    data = outcome_data(spec, encoder, tuple(_trials(spec, "constrained")))
    model = fit_models(data, encoder)
    shared = data[0].X[:6]
    generator = torch.Generator().manual_seed(1)
    for own in (1, 2):
        new = encoder.snap(torch.rand(40 * own, encoder.d, generator=generator).double())
        X = torch.cat([shared.expand(40, -1, -1), new.reshape(40, own, -1)], dim=-2)
        X = X[:, torch.randperm(X.shape[1], generator=generator)]  # shared rows anywhere
        with torch.no_grad():
            expected = model.posterior(X)
            got = SharedRowsModel(model).posterior(X)
            assert type(got.distribution) is type(expected.distribution)
            assert torch.allclose(got.mean, expected.mean, rtol=1e-10, atol=1e-12)
            assert torch.allclose(
                got.distribution.covariance_matrix,
                expected.distribution.covariance_matrix,
                rtol=1e-9,
                atol=1e-12,
            )


@pytest.mark.parametrize("case", ["plain", "constrained"])
def test_gradients_equal_the_plain_call(
    case: str,
    value_and_gradient: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    path_taken: Callable[..., list[bool]],
) -> None:
    """L-BFGS-B on a continuous space differentiates the acquisition through the gathered
    posterior: values and gradients of its restart batches are the plain call's."""
    spec = StudySpec.from_dict(
        {
            "name": "shared-rows-box",
            "knobs": [
                {"name": f"x{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(5)
            ],
            "objectives": [{"name": "y", "goal": "maximize"}],
            "outcome_constraints": ["c <= 0.3"] if case == "constrained" else [],
        }
    )
    encoder = UnitBoxEncoder(spec.space)
    trials = _trials(spec, case)
    data = outcome_data(spec, encoder, tuple(trials))
    model = fit_models(data, encoder)
    acquisition = build_acquisition(spec, model, data, data[0].X, None, True, seed=3)
    X = torch.rand(4, 1, encoder.d, generator=torch.Generator().manual_seed(2)).double()

    taken = path_taken(shared_rows_module, "_direct")
    expected, expected_gradient = value_and_gradient(acquisition, X, False)
    got, gradient = value_and_gradient(acquisition, X, True)
    assert taken == [True]  # the restarts' batch went through the GP's caches
    assert ((got - expected).abs() <= TOLERANCE * expected.abs()).all()
    assert torch.allclose(gradient, expected_gradient, rtol=1e-9, atol=1e-12)
    assert gradient.abs().max() > 0


@pytest.mark.parametrize("case", ["plain", "constrained", "feasibility", "stopped"])
def test_training_marginals_equal_the_posterior_s(case: str) -> None:
    """At the training inputs, ``training_marginals`` gives GPyTorch's posterior means and
    variances (``_contenders`` bounds the baseline's points with them), also for a model
    whose caches are not built yet; None where some output was trained on other rows (the
    feasibility classifier sees the configurations that broke the system too)."""
    spec = _spec(case)
    encoder = UnitBoxEncoder(spec.space)
    data = outcome_data(spec, encoder, tuple(_trials(spec, case, n=40)))
    X = data[0].X
    for fresh in (True, False):
        model = fit_models(data, encoder)
        model.eval()
        if case == "stopped":  # one batched GP whose rows have their own noise
            assert type(model.likelihood) is ScaledNoiseLikelihood
        if not fresh:
            model.posterior(X[:2])
        with torch.no_grad():
            found = training_marginals(model, X)
            posterior = model.posterior(X)
        if case == "feasibility":
            assert found is None
            continue
        assert found is not None
        mean, variance = found
        assert mean.shape == variance.shape == (X.shape[0], model.num_outputs)
        assert torch.allclose(mean, posterior.mean.reshape(mean.shape), rtol=1e-9, atol=1e-12)
        assert torch.allclose(
            variance, posterior.variance.reshape(mean.shape), rtol=1e-9, atol=1e-12
        )
        assert bool((variance > 0).all())
    with torch.no_grad():
        assert training_marginals(model, X[1:]) is None  # not the training inputs
