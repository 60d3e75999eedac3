"""The plain-torch fit objective (``models/likelihood.py``) is GPyTorch's marginal log likelihood.

For the GPs the designer builds (RBF on a box; RBF times the categorical kernel on a mixed
space; with the trend's linear mean) the value and every gradient agree with BoTorch's own
loss closure at several hyperparameter settings; the fit reaches the same optimum; a batched
multi-output GP is left to BoTorch.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from botorch.optim.closures import get_loss_closure_with_grads
from botorch.optim.fit import fit_gpytorch_mll_scipy
from gpytorch.mlls import ExactMarginalLogLikelihood

from tuner.designer.models.likelihood import ScaledNoiseLikelihood, fit_plain, loss_closure
from tuner.designer.models.model import build_model, outcome_data
from tuner.encoding import UnitBoxEncoder
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

BOX: list[dict[str, Any]] = [
    {"name": f"x{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(6)
]
MIXED: list[dict[str, Any]] = [
    {"name": "f", "kind": "float", "low": 0.0, "high": 10.0},
    {"name": "wide", "kind": "int", "low": 0, "high": 100_000},
    {"name": "mode", "kind": "categorical", "choices": ["a", "b", "c", "d"]},
    {"name": "level", "kind": "ordinal", "choices": [1, 2, 4, 8, 16]},
    {"name": "flag", "kind": "bool"},
]


def _mll(
    knobs: list[dict[str, Any]],
    trend: bool = False,
    constrained: bool = False,
    stopped: bool = False,
) -> Any:
    """The MLL of a GP on 40 trials; ``stopped``: every fourth trial EARLY_STOPPED after 3 of
    the 10 windows the others reported."""
    spec = StudySpec.from_dict(
        {
            "name": "likelihood",
            "knobs": knobs,
            "objectives": [{"name": "y", "goal": "minimize"}],
            "outcome_constraints": ["c <= 0.5"] if constrained else [],
        }
    )
    encoder = UnitBoxEncoder(spec.space)
    generator = torch.Generator().manual_seed(4)
    X = encoder.snap(torch.rand(40, encoder.d, generator=generator, dtype=torch.float64))
    trials = []
    for i, row in enumerate(X):
        y = float(torch.sin(5 * row).sum() + 0.3 * row[0] ** 2)
        metrics = {"y": y, "c": float(row.mean())}
        short = stopped and i % 4 == 1
        trials.append(
            Trial(
                id=i + 1,
                config=encoder.decode(row.tolist()),
                status=TrialStatus.EARLY_STOPPED if short else TrialStatus.COMPLETED,
                metrics=metrics,
                windows=(3 if short else 10) if stopped else 0,
            )
        )
    data = outcome_data(spec, encoder, tuple(trials))
    model = build_model(data, encoder, trend)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    mll.train()
    return mll


@pytest.mark.parametrize(
    ("knobs", "trend", "stopped"),
    [(BOX, False, False), (MIXED, False, False), (MIXED, True, False), (MIXED, False, True)],
    ids=["box", "mixed", "trend", "stopped"],
)
def test_value_and_gradients_are_gpytorchs(
    knobs: list[dict[str, Any]], trend: bool, stopped: bool
) -> None:
    mll = _mll(knobs, trend, stopped=stopped)
    assert (type(mll.likelihood) is ScaledNoiseLikelihood) is stopped
    parameters = {name: p for name, p in mll.named_parameters() if p.requires_grad}
    tensors = list(parameters.values())
    reference = get_loss_closure_with_grads(mll, parameters)
    plain = loss_closure(mll)
    assert plain is not None
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):  # away from the initial values, every parameter moved
        with torch.no_grad():
            for p in tensors:
                step = 0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype)
                p.add_(step).clamp_(min=1e-3)
        expected, expected_grads = reference()
        value = plain()
        grads = torch.autograd.grad(value, tensors)
        assert torch.allclose(value, expected, rtol=1e-12, atol=0)
        for got, want in zip(grads, expected_grads, strict=True):
            assert want is not None
            assert torch.allclose(got, want, rtol=1e-9, atol=1e-12)


def test_fit_reaches_botorchs_optimum() -> None:
    """Same start, same L-BFGS-B: the same likelihood at the end (the paths may part by
    rounding on flat directions, the optimum's value may not)."""
    mll = _mll(MIXED)
    state = {k: v.clone() for k, v in mll.model.state_dict().items()}
    ours = fit_plain(mll, 200)
    assert ours is not None
    loss = loss_closure(mll)
    assert loss is not None
    ours_value = float(loss().detach())
    mll.model.load_state_dict(state)
    theirs = fit_gpytorch_mll_scipy(mll, options={"maxiter": 200})
    assert ours.status == theirs.status
    assert abs(ours_value - float(loss().detach())) < 1e-6 * abs(ours_value)


def test_batched_outputs_are_left_to_botorch() -> None:
    mll = _mll(BOX, constrained=True)
    assert mll.model.num_outputs == 2
    assert loss_closure(mll) is None
    assert fit_plain(mll, 10) is None


def test_a_row_s_noise_is_its_factor_times_the_level() -> None:
    """With trials stopped after 3 of 10 windows, the loss is the Gaussian log density with
    covariance ``K + s^2 diag(r)``, ``r = 10 / 3`` at those rows and 1 elsewhere (computed
    here from the formula, not through GPyTorch), plus the priors."""
    mll = _mll(BOX, stopped=True)
    model = mll.model
    plain = loss_closure(mll)
    assert plain is not None
    r = model.likelihood.scale
    assert sorted(set(r.tolist())) == [1.0, pytest.approx(10 / 3)]
    assert r.tolist()[1] == pytest.approx(10 / 3) and r.tolist()[0] == 1.0
    X, y = model.train_inputs[0], model.train_targets
    with torch.no_grad():
        covariance = model.covar_module(X).to_dense() + model.likelihood.noise * torch.diag(r)
        density = torch.distributions.MultivariateNormal(
            model.mean_module(X), covariance_matrix=covariance
        ).log_prob(y)
        priors = sum(
            prior.log_prob(closure(module)).sum()
            for _, module, prior, closure, _ in model.named_priors()
        )
        assert torch.allclose(plain(), -(density + priors) / len(y), rtol=1e-10)
