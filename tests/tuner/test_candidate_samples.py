"""qLogNEI's samples at the candidates from the GP's caches (``fast/candidate_samples.py``, with
the moments of ``fast/rbf_moments.py`` on box spaces) give BoTorch's acquisition values and
gradients.

For every GP structure ``build_acquisition`` gives qLogNEI: one GP, a batched two-output GP
(an outcome constraint) and a ``ModelListGP`` (a feasibility outcome as well), with a
constant or a linear prior mean (the trend probe's); with and without pending points
(BoTorch's incremental qLogNEI adds them to the baseline), with the candidate-list margin,
inside and outside ``shared_rows``; the moments from ``rbf_moments`` and from
``shared_rows.model_moments``. BoTorch's values are those of the same acquisition with the
direct path turned off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from botorch.acquisition.objective import GenericMCObjective
from botorch.models import ModelListGP, SingleTaskGP
from linear_operator.utils.errors import NotPSDError

import tuner.designer.acquisition.criteria as acquisition_module
import tuner.designer.fast.candidate_samples as candidate_samples_module
from tuner.designer.acquisition.criteria import build_acquisition
from tuner.designer.fast.candidate_samples import LogNEI
from tuner.designer.fast.rbf_moments import CandidateMoments
from tuner.designer.fast.sample_terms import Bound, Constant, LogNEITerms
from tuner.designer.models.model import fit_models, outcome_data
from tuner.encoding import UnitBoxEncoder
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

TOLERANCE = 1e-9
# the fixtures of tests/tuner/conftest.py
ValueAndGradient = Callable[..., tuple[torch.Tensor, torch.Tensor]]
PathTaken = Callable[..., list[bool]]


def _spec(case: str, d: int) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "candidate-samples",
            "knobs": [
                {"name": f"x{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(d)
            ],
            "objectives": [{"name": "y", "goal": "minimize"}],
            "outcome_constraints": [] if case == "plain" else ["c <= 0.4"],
        }
    )


def _acquisition(
    case: str, pending: bool, margin: float, trend: bool = False
) -> tuple[LogNEI, Any, int]:
    spec = _spec(case, 4)
    encoder = UnitBoxEncoder(spec.space)
    generator = torch.Generator().manual_seed(7)
    X = torch.rand(25, encoder.d, generator=generator, dtype=torch.float64)
    trials = []
    for i, row in enumerate(X):
        status, metrics = (
            TrialStatus.COMPLETED,
            {
                "y": float((row - 0.3).square().sum() + 0.1 * torch.sin(9 * row).sum()),
                "c": float(row[:2].mean()),
            },
        )
        if case == "feasibility" and i % 6 == 2:
            status, metrics = TrialStatus.INFEASIBLE, {}
        trials.append(
            Trial(id=i + 1, config=encoder.decode(row.tolist()), status=status, metrics=metrics)
        )
    data = outcome_data(spec, encoder, tuple(trials))
    model = fit_models(data, encoder, trend=trend)
    expected_type = {"plain": SingleTaskGP, "constrained": SingleTaskGP, "feasibility": ModelListGP}
    assert type(model) is expected_type[case]
    X_pending = torch.rand(2, encoder.d, generator=generator).double() if pending else None
    acquisition = build_acquisition(
        spec, model, data, data[0].X, X_pending, True, seed=3, margin=margin
    )
    assert isinstance(acquisition, LogNEI) and acquisition._cache_root
    return acquisition, model, encoder.d


def _botorch_only(patch: pytest.MonkeyPatch) -> None:
    """Turns both direct paths off: the acquisition is then BoTorch's."""
    patch.setattr(candidate_samples_module, "direct_values", lambda *args: None)
    patch.setattr(candidate_samples_module, "candidate_samples", lambda *args: None)


@pytest.mark.parametrize(
    ("case", "pending", "margin", "trend", "rbf"),
    [
        ("plain", False, 0.0, False, True),
        ("plain", True, 0.1, False, True),
        ("plain", False, 0.0, True, True),
        ("plain", True, 0.0, False, False),
        ("constrained", False, 0.1, False, True),
        ("constrained", True, 0.0, False, True),
        ("constrained", True, 0.0, True, True),
        ("constrained", False, 0.0, False, False),
        ("feasibility", False, 0.0, False, True),
        ("feasibility", True, 0.0, False, True),
        ("feasibility", True, 0.0, False, False),
    ],
)
def test_values_and_gradients_equal_botorch(
    case: str,
    pending: bool,
    margin: float,
    trend: bool,
    rbf: bool,
    monkeypatch: pytest.MonkeyPatch,
    value_and_gradient: ValueAndGradient,
    path_taken: PathTaken,
) -> None:
    acquisition, _, d = _acquisition(case, pending, margin, trend)
    if not rbf:  # the moments from shared_rows.model_moments
        monkeypatch.setattr(CandidateMoments, "build", classmethod(lambda *args: None))
    X = torch.rand(6, 1, d, generator=torch.Generator().manual_seed(2)).double()
    with monkeypatch.context() as botorch_only:
        _botorch_only(botorch_only)
        expected, expected_gradient = value_and_gradient(acquisition, X, False)
    direct = path_taken(candidate_samples_module, "direct_values")
    sampled = path_taken(candidate_samples_module, "candidate_samples")
    for shared in (False, True):
        got, gradient = value_and_gradient(acquisition, X, shared)
        assert ((got - expected).abs() <= TOLERANCE * expected.abs()).all()
        assert torch.allclose(gradient, expected_gradient, rtol=1e-9, atol=1e-12)
    # both calls direct: all in NumPy on box spaces, else the samples from model_moments
    assert direct == [rbf, rbf] and sampled == ([] if rbf else [True, True])
    moments = acquisition._candidate_moments  # built, or found not to cover the model
    assert moments is not None and (moments[3] is not None) == rbf
    assert expected_gradient.abs().max() > 0
    assert not torch.equal(expected[0], expected[1])  # the candidates differ in value


def test_a_new_q_is_first_set_up_by_botorch(path_taken: PathTaken) -> None:
    """BoTorch fits its sampler's base samples to a new ``q`` in its own first call (the
    baseline's samples must stay the cached ones); only later calls are direct. Inputs
    with several candidates per batch always take BoTorch's path."""
    acquisition, _, d = _acquisition("plain", pending=False, margin=0.0)
    taken = path_taken(candidate_samples_module, "direct_values")
    generator = torch.Generator().manual_seed(4)
    one = torch.rand(5, 1, d, generator=generator).double()
    two = torch.rand(5, 2, d, generator=generator).double()
    with torch.no_grad():
        first = acquisition(one)
        again = acquisition(one)
        pairs = acquisition(two)
    assert taken == [False, True, False]
    assert torch.allclose(first, again, rtol=1e-12, atol=0)
    assert torch.isfinite(pairs).all()


def test_a_candidate_covariance_that_does_not_factor_leaves_it_to_botorch(
    monkeypatch: pytest.MonkeyPatch, value_and_gradient: ValueAndGradient, path_taken: PathTaken
) -> None:
    """Where the candidate's conditional variance is not positive (``rbf_moments``' samples
    are NaN: a candidate on top of a baseline point of a nearly noise-free GP) and does not
    factor even with jitter, the direct path gives None and BoTorch's path answers (it
    warns and samples the plain way there)."""
    acquisition, _, d = _acquisition("constrained", pending=False, margin=0.0)
    X = torch.rand(4, 1, d, generator=torch.Generator().manual_seed(5)).double()
    expected, expected_gradient = value_and_gradient(acquisition, X, False)
    rbf_samples = CandidateMoments.samples

    def not_positive(self: CandidateMoments, *args: np.ndarray) -> tuple[np.ndarray, Any]:
        samples, state = rbf_samples(self, *args)
        return np.full_like(samples, np.nan), state

    def not_psd(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise NotPSDError("Matrix not positive definite after repeatedly adding jitter")

    monkeypatch.setattr(CandidateMoments, "samples", not_positive)
    monkeypatch.setattr(candidate_samples_module, "psd_safe_cholesky", not_psd)
    taken = path_taken(candidate_samples_module, "candidate_samples")
    got, gradient = value_and_gradient(acquisition, X, False)
    assert taken == [False]
    assert torch.allclose(got, expected, rtol=1e-9, atol=0)
    assert torch.allclose(gradient, expected_gradient, rtol=1e-9, atol=1e-12)


def test_the_pick_of_a_suggestion_is_botorch_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole L-BFGS-B maximization picks the same candidate either way (rounding can
    move the optimizer's path: 1e-6 in the unit box is far below a knob's resolution)."""
    from tuner.designer.acquisition.criteria import OptimizerSettings, optimize_continuous

    picks = []
    for direct in (True, False):
        acquisition, _, d = _acquisition("constrained", pending=True, margin=0.0)
        if not direct:
            _botorch_only(monkeypatch)
        picks.append(optimize_continuous(acquisition, d, 1, [], OptimizerSettings(), seed=5))
    assert torch.allclose(picks[0], picks[1], atol=1e-5)


def test_samples_with_no_improvement_anywhere_reduce_as_botorch_s(
    monkeypatch: pytest.MonkeyPatch, value_and_gradient: ValueAndGradient
) -> None:
    """Where some sample's smoothed improvement is -inf (its log underflows), ``forward``
    leaves the reductions to BoTorch, which handles infinities."""
    acquisition, _, d = _acquisition("constrained", pending=False, margin=0.0)
    X = torch.rand(4, 1, d, generator=torch.Generator().manual_seed(6)).double()
    plain = type(acquisition)._sample_forward

    def with_infinities(self: LogNEI, obj: torch.Tensor) -> torch.Tensor:
        values = plain(self, obj)
        every_third = torch.arange(values.shape[0]).view(-1, 1, 1) % 3 == 0
        return torch.where(every_third, -torch.inf, values)

    monkeypatch.setattr(LogNEI, "_sample_forward", with_infinities)
    monkeypatch.setattr(candidate_samples_module, "direct_values", lambda *args: None)
    got, gradient = value_and_gradient(acquisition, X, False)
    with monkeypatch.context() as botorch_only:
        _botorch_only(botorch_only)
        expected, expected_gradient = value_and_gradient(acquisition, X, False)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, expected, rtol=1e-9, atol=0)
    assert torch.allclose(gradient, expected_gradient, rtol=1e-9, atol=1e-12)


def test_no_fixed_features_leave_the_optimization_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``optimize_continuous`` hands BoTorch's L-BFGS-B None for "no fixed features" where
    ``optimize_acqf`` would hand it ``{}`` (``acquisition._gen_candidates``): the same
    evaluations, so the same pick, to the last bit."""
    from botorch.generation.gen import gen_candidates_scipy

    from tuner.designer.acquisition.criteria import OptimizerSettings, optimize_continuous

    picks = []
    for ours in (True, False):
        acquisition, _, d = _acquisition("plain", pending=False, margin=0.0)
        if not ours:
            monkeypatch.setattr(acquisition_module, "_gen_candidates", gen_candidates_scipy)
        picks.append(optimize_continuous(acquisition, d, 2, [], OptimizerSettings(), seed=5))
    assert torch.equal(picks[0], picks[1])


def test_a_conditional_variance_that_is_not_positive_gets_botorch_s_jitter(
    monkeypatch: pytest.MonkeyPatch, value_and_gradient: ValueAndGradient, path_taken: PathTaken
) -> None:
    """Where ``rbf_moments``' samples are NaN (a conditional variance at or below zero), the
    general path factors it with BoTorch's jitter, as BoTorch's own path does."""
    acquisition, _, d = _acquisition("plain", pending=False, margin=0.0)
    X = torch.rand(4, 1, d, generator=torch.Generator().manual_seed(8)).double()
    expected, expected_gradient = value_and_gradient(acquisition, X, False)
    rbf_samples = CandidateMoments.samples

    def not_positive(self: CandidateMoments, *args: np.ndarray) -> tuple[np.ndarray, Any]:
        samples, state = rbf_samples(self, *args)
        samples = samples.copy()
        samples[:, 0, :] = np.nan  # the first candidate's
        return samples, state

    monkeypatch.setattr(CandidateMoments, "samples", not_positive)
    taken = path_taken(candidate_samples_module, "candidate_samples")
    got, gradient = value_and_gradient(acquisition, X, False)
    assert taken == [True]  # sampled directly, the general way
    assert torch.allclose(got, expected, rtol=1e-9, atol=0)
    assert torch.allclose(gradient, expected_gradient, rtol=1e-9, atol=1e-12)


def test_a_constant_constraint_and_an_eta_per_constraint_give_botorch_s_values(
    monkeypatch: pytest.MonkeyPatch, value_and_gradient: ValueAndGradient, path_taken: PathTaken
) -> None:
    """``sample_terms`` reads each constraint's coefficients: a ``Constant`` one (a bound a
    log-modelled metric always meets or breaks), two ``Bound``s on the same output in both
    directions, and BoTorch's temperature ``eta`` given per constraint."""
    direct = path_taken(candidate_samples_module, "direct_values")
    for satisfied in (True, False):
        acquisition, _, d = _acquisition("constrained", pending=False, margin=0.0)
        acquisition._constraints = [
            Bound(1, 0.4, 1.0),
            Constant(1, satisfied),
            Bound(1, 0.1, -1.0),
        ]
        acquisition._eta = torch.tensor([1e-3, 2e-3, 5e-2], dtype=torch.float64)
        acquisition._terms = None
        X = torch.rand(5, 1, d, generator=torch.Generator().manual_seed(9)).double()
        with monkeypatch.context() as botorch_only:
            _botorch_only(botorch_only)
            expected, expected_gradient = value_and_gradient(acquisition, X, False)
        got, gradient = value_and_gradient(acquisition, X, False)
        assert direct[-1] is True
        assert ((got - expected).abs() <= TOLERANCE * expected.abs()).all()
        assert torch.allclose(gradient, expected_gradient, rtol=1e-9, atol=1e-12)
        assert expected_gradient.abs().max() > 0


def test_an_objective_it_does_not_know_leaves_the_terms_to_botorch(
    monkeypatch: pytest.MonkeyPatch, value_and_gradient: ValueAndGradient, path_taken: PathTaken
) -> None:
    """An objective other than ``SignedObjective`` (BoTorch's arithmetic on it is unknown to
    ``sample_terms``): the samples still come directly, the rest is BoTorch's."""
    acquisition, _, d = _acquisition("plain", pending=False, margin=0.0)
    acquisition.objective = GenericMCObjective(lambda samples, X=None: -(samples[..., 0] ** 3))
    X = torch.rand(4, 1, d, generator=torch.Generator().manual_seed(10)).double()
    with monkeypatch.context() as botorch_only:
        _botorch_only(botorch_only)
        expected, expected_gradient = value_and_gradient(acquisition, X, False)
    direct = path_taken(candidate_samples_module, "direct_values")
    sampled = path_taken(candidate_samples_module, "candidate_samples")
    got, gradient = value_and_gradient(acquisition, X, False)
    assert direct == [False] and sampled == [True]
    assert torch.allclose(got, expected, rtol=1e-9, atol=0)
    assert torch.allclose(gradient, expected_gradient, rtol=1e-9, atol=1e-12)


def test_values_that_are_not_finite_leave_it_to_the_samples_path(
    monkeypatch: pytest.MonkeyPatch, value_and_gradient: ValueAndGradient, path_taken: PathTaken
) -> None:
    """Where a direct value is not finite (an improvement whose log underflows), the samples
    path answers, whose reductions are BoTorch's with their handling of infinities."""
    acquisition, _, d = _acquisition("constrained", pending=False, margin=0.0)
    X = torch.rand(4, 1, d, generator=torch.Generator().manual_seed(11)).double()
    expected, expected_gradient = value_and_gradient(acquisition, X, False)
    forward = LogNEITerms.forward

    def underflow(self: LogNEITerms, *args: np.ndarray) -> tuple[np.ndarray, Any]:
        values, state = forward(self, *args)
        values = values.copy()
        values[1] = -np.inf
        return values, state

    monkeypatch.setattr(LogNEITerms, "forward", underflow)
    direct = path_taken(candidate_samples_module, "direct_values")
    sampled = path_taken(candidate_samples_module, "candidate_samples")
    got, gradient = value_and_gradient(acquisition, X, False)
    assert direct == [False] and sampled == [True]
    assert torch.allclose(got, expected, rtol=1e-9, atol=0)
    assert torch.allclose(gradient, expected_gradient, rtol=1e-9, atol=1e-12)
