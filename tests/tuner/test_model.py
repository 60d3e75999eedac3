"""Tests for tuner.designer.models.model and tuner.designer.acquisition.criteria (small, fast
fits)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from botorch.acquisition.logei import qLogNoisyExpectedImprovement, qLogProbabilityOfFeasibility
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.kernels.categorical import CategoricalKernel
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.means import LinearMean

from tuner.designer.acquisition.criteria import (
    CONTENDERS_FROM,
    _contenders,
    build_acquisition,
    outcome_constraints,
    thompson_candidates,
)
from tuner.designer.models import model as model_module
from tuner.designer.models.model import (
    FEASIBILITY,
    FitCache,
    OutcomeData,
    build_model,
    distinct_rows,
    fit_models,
    outcome_data,
    replicates,
)
from tuner.encoding import UnitBoxEncoder
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

S = TrialStatus
# linear_operator touches deprecated torch storage APIs when evaluating batched posteriors
pytestmark = [
    pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning"),
    pytest.mark.filterwarnings("ignore:torch.sparse.SparseTensor:UserWarning"),
    # Cholesky jitter on tiny data sets (the designer logs these; see steps/bo.py)
    pytest.mark.filterwarnings("ignore::linear_operator.utils.warnings.NumericalWarning"),
]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """Small GPs are overhead-bound: extra threads only contend on a busy two-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _spec(knobs: list[dict[str, Any]] | None = None, goal: str = "maximize") -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "m",
            "knobs": knobs
            or [{"name": "x", "kind": "float"}, {"name": "n", "kind": "int", "low": 0, "high": 4}],
            "objectives": [{"name": "tps", "goal": goal}],
            "outcome_constraints": ["p95 <= 20", "hit >= 0.5"],
        }
    )


def _trial(id_: int, x: float, status: TrialStatus = S.COMPLETED, **metrics: float) -> Trial:
    return Trial(id_, {"x": x, "n": id_ % 5}, status, dict(metrics))


def _history() -> tuple[Trial, ...]:
    return (
        _trial(1, 0.1, tps=100.0, p95=30.0, hit=0.6),
        _trial(2, 0.4, tps=150.0, p95=25.0, hit=0.7),
        _trial(3, 0.6, S.INFEASIBLE),  # broke the system: no metrics
        _trial(4, 0.8, tps=120.0, p95=21.0, hit=0.8),
        _trial(5, 0.9, S.TIMED_OUT, tps=10.0),
    )


# -- training data ----------------------------------------------------------------------


def test_outcome_data_one_entry_per_observed_metric_objective_first() -> None:
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    data = outcome_data(spec, encoder, _history())
    assert [d.name for d in data] == ["tps", "p95", "hit", FEASIBILITY]
    tps, p95, hit, feasibility = data
    assert tps.X.shape == (4, 2) and tps.Y.shape == (4, 1)  # the TIMED_OUT trial reported tps
    assert p95.X.shape == (3, 2) and torch.equal(p95.X, hit.X)
    assert p95.Y.flatten().tolist() == [30.0, 25.0, 21.0]
    assert feasibility.X.shape == (5, 2)
    assert feasibility.Y.flatten().tolist() == [0.0, 0.0, 1.0, 0.0, 1.0]
    assert all(d.X.dtype == torch.float64 and d.Y.dtype == torch.float64 for d in data)


def test_an_early_stopped_trial_trains_as_a_measurement_not_as_a_failure() -> None:
    """What a stopped trial measured is a value of its configuration: it joins every
    metric's training set, and the feasibility model does not count it as broken."""
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    stopped = _trial(6, 0.3, S.EARLY_STOPPED, tps=60.0, p95=40.0, hit=0.5)
    data = {d.name: d for d in outcome_data(spec, encoder, (*_history(), stopped))}
    tps, p95 = data["tps"], data["p95"]
    assert tps.Y.flatten().tolist()[-1] == pytest.approx(math.log(60.0) if tps.log else 60.0)
    assert p95.Y.flatten().tolist()[-1] == pytest.approx(math.log(40.0) if p95.log else 40.0)
    assert data[FEASIBILITY].Y.flatten().tolist() == [0.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_a_trial_stopped_after_part_of_its_windows_weighs_as_a_noisier_value() -> None:
    """Its row's noise factor is ``W / w`` (a full run's windows over its own), 1 for every
    other row; with no completed trial measured in windows there is nothing to compare with,
    and no factor. A misleading value measured over 2 of 10 windows moves the fitted GP at
    its configuration less than the same value measured in full, and a far-off short value
    leaves the GP nearer the truth there."""
    spec = StudySpec.from_dict(
        {
            "name": "fidelity",
            "knobs": [{"name": "x", "kind": "float"}],
            "objectives": [{"name": "y", "goal": "maximize"}],
        }
    )
    encoder = UnitBoxEncoder(spec.space)
    xs = [i / 19 for i in range(20)]
    truth = [math.sin(6 * x) for x in xs]
    full = [Trial(i + 1, {"x": x}, S.COMPLETED, {"y": v}, windows=10)
            for i, (x, v) in enumerate(zip(xs, truth, strict=True))]  # fmt: skip
    odd = 10  # its truth is sin(6 * 10 / 19); the measurement says 3 more
    measured = truth[odd] + 3.0

    def fitted(status: TrialStatus, windows: int) -> tuple[OutcomeData, float]:
        trials = list(full)
        trials[odd] = replace(trials[odd], status=status, metrics={"y": measured}, windows=windows)
        (data,) = outcome_data(spec, encoder, tuple(trials))
        model = fit_models([data], encoder)
        with torch.no_grad():
            mean = model.posterior(data.X[odd : odd + 1]).mean.item()
        return data, mean

    short, short_mean = fitted(S.EARLY_STOPPED, 2)
    long, long_mean = fitted(S.COMPLETED, 10)
    assert short.scale is not None and long.scale is None
    assert short.scale.tolist() == [5.0 if i == odd else 1.0 for i in range(20)]
    assert abs(short_mean - truth[odd]) < abs(long_mean - truth[odd])
    unknown = [replace(t, windows=0) for t in full]
    unknown[odd] = replace(unknown[odd], status=S.EARLY_STOPPED, windows=2)
    assert outcome_data(spec, encoder, tuple(unknown))[0].scale is None
    # the daemon's windows are its repeats: 10 rows for a full trial, 2 for one stopped
    # after 2 windows, which already weighs it; no factor on top
    daemon = [replace(t, repeats=10, windows=10, spread={"y": 0.1}) for t in full]
    daemon[odd] = replace(daemon[odd], status=S.EARLY_STOPPED, repeats=2, windows=2)
    (data,) = outcome_data(spec, encoder, tuple(daemon))
    assert data.scale is None and data.X.shape[0] == 19 * 10 + 2
    # a session measuring 2 runs of 10 windows: one stopped in its first run after 4
    twice = [replace(t, repeats=2, windows=20, spread={"y": 0.1}) for t in full]
    twice[odd] = replace(twice[odd], status=S.EARLY_STOPPED, repeats=1, windows=4)
    (data,) = outcome_data(spec, encoder, tuple(twice))
    assert data.scale is not None and max(data.scale.tolist()) == 2.5


def test_a_repeated_trial_trains_one_row_per_repeat_with_its_mean_and_spread() -> None:
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    raw = [140.0, 150.0, 175.0]  # the stored mean and spread of three repeats
    mean, spread = sum(raw) / 3, statistics.stdev(raw)
    repeated = Trial(2, {"x": 0.4, "n": 2}, S.COMPLETED,
                     {"tps": mean, "p95": 25.0, "hit": 0.7}, repeats=3,
                     spread={"tps": spread, "p95": 0.0, "hit": 0.0})  # fmt: skip
    history = (_history()[0], repeated)
    tps, p95, _ = outcome_data(spec, encoder, history)
    assert tps.X.shape == (4, 2) and torch.equal(tps.X, p95.X)  # 1 + 3 rows, shared
    values = tps.Y.flatten().tolist()[1:]
    assert statistics.fmean(values) == pytest.approx(mean)
    assert statistics.stdev(values) == pytest.approx(spread)
    assert p95.Y.flatten().tolist()[1:] == [25.0] * 3
    # the GP trained on the rebuilt rows is the GP trained on the raw repeats
    X = tps.X
    rebuilt = SingleTaskGP(X, tps.Y)
    exact = SingleTaskGP(X, torch.tensor([[100.0], *[[v] for v in raw]], dtype=torch.float64))
    for gp in (rebuilt, exact):
        gp.likelihood.noise = torch.tensor([0.3])
        gp.eval()
    grid = torch.rand(5, 2, dtype=torch.float64)
    assert torch.allclose(rebuilt.posterior(grid).mean, exact.posterior(grid).mean, atol=1e-6)
    # a reconstruction that would go negative keeps copies of the mean
    wild = Trial(3, {"x": 0.5, "n": 1}, S.COMPLETED, {"tps": 10.0}, repeats=2,
                 spread={"tps": 30.0})  # fmt: skip
    assert replicates(wild, "tps") == [10.0, 10.0]
    assert replicates(_history()[0], "tps") == [100.0]


def test_no_feasibility_outcome_while_everything_completed() -> None:
    spec = _spec()
    trials = [t for t in _history() if t.status is S.COMPLETED]
    data = outcome_data(spec, UnitBoxEncoder(spec.space), tuple(trials))
    assert FEASIBILITY not in [d.name for d in data]


def test_metrics_without_finite_values_are_left_out() -> None:
    spec = _spec()
    trials = (
        _trial(1, 0.2, tps=1.0, p95=math.nan),
        _trial(2, 0.3, tps=2.0, p95=math.inf),
    )
    data = outcome_data(spec, UnitBoxEncoder(spec.space), trials)
    assert [d.name for d in data] == ["tps"]


def test_wide_positive_metrics_are_modelled_in_log_space() -> None:
    spec = _spec()
    trials = (
        _trial(1, 0.2, tps=10.0, p95=1.0, hit=0.1),
        _trial(2, 0.3, tps=20.0, p95=100.0, hit=-0.1),
    )
    tps, p95, hit = outcome_data(spec, UnitBoxEncoder(spec.space), trials)
    assert not tps.log and tps.Y.flatten().tolist() == [10.0, 20.0]  # span 2: linear
    assert p95.log and p95.Y.flatten().tolist() == pytest.approx([0.0, math.log(100.0)])
    assert not hit.log  # not all positive
    assert p95.transform(20.0) == pytest.approx(math.log(20.0))
    assert tps.transform(20.0) == 20.0


# -- constraints on posterior samples ---------------------------------------------------


def _data(name: str, log: bool = False) -> OutcomeData:
    return OutcomeData(name, torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, 1), log)


def test_outcome_constraints_are_non_positive_when_satisfied() -> None:
    spec = _spec()
    data = [_data("tps"), _data("p95"), _data("hit")]
    upper, lower = outcome_constraints(spec, data)
    samples = torch.tensor([[0.0, 19.0, 0.9], [0.0, 21.0, 0.1]])
    assert upper(samples).tolist() == [-1.0, 1.0]
    assert lower(samples).tolist() == pytest.approx([-0.4, 0.4])


def test_outcome_constraints_use_the_log_scale_and_the_feasibility_classifier() -> None:
    spec = _spec()
    data = [_data("tps"), _data("p95", log=True), _data(FEASIBILITY)]
    p95, feasible = outcome_constraints(spec, data)  # 'hit' unobserved: no constraint
    samples = torch.tensor([[0.0, math.log(10.0), 0.2], [0.0, math.log(40.0), 0.9]])
    assert p95(samples)[0] < 0 < p95(samples)[1]
    assert feasible(samples).tolist() == pytest.approx([-0.3, 0.4])


def test_log_metric_against_a_non_positive_bound_is_constant() -> None:
    spec = StudySpec.from_dict(
        {
            "name": "m",
            "knobs": [{"name": "x", "kind": "float"}],
            "objectives": [{"name": "y"}],
            "outcome_constraints": ["lat <= 0", "mem >= -1"],
        }
    )
    never, always = outcome_constraints(spec, [_data("y"), _data("lat", True), _data("mem", True)])
    samples = torch.randn(4, 3)
    assert bool((never(samples) > 0).all())
    assert bool((always(samples) <= 0).all())


# -- fitting and acquisition ------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted() -> tuple[StudySpec, list[OutcomeData], Any, FitCache]:
    """One fit of the history's three GPs, shared by the tests below (fits are slow)."""
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    trials = (*_history(), _trial(6, 0.3, tps=130.0, p95=10.0, hit=0.9))  # one feasible
    data = outcome_data(spec, encoder, trials)
    cache = FitCache()
    return spec, data, fit_models(data, encoder, cache, "study-a"), cache


def test_outcomes_observed_on_different_trials_get_one_gp_each(fitted: Any) -> None:
    _, _, model, _ = fitted
    assert isinstance(model, ModelListGP)
    models: list[Any] = list(model.models)
    # tps (5 trials), p95 and hit (4 trials), feasibility (6 trials): one GP per outcome
    assert [m.num_outputs for m in models] == [1, 1, 1, 1]
    assert all(isinstance(m, SingleTaskGP) for m in models)
    assert [m.train_inputs[0].shape[-2] for m in models] == [5, 4, 4, 6]
    X = torch.rand(6, 2, dtype=torch.float64)
    posterior = model.posterior(X)
    assert posterior.mean.shape == (6, 4)
    for i, single in enumerate(models):  # the joint posterior keeps each output's slots
        alone = single.posterior(X)
        assert torch.allclose(posterior.mean[:, i], alone.mean[:, 0])
        assert torch.allclose(posterior.variance[:, i], alone.variance[:, 0])


def test_outcomes_observed_together_share_one_batched_gp() -> None:
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    trials = tuple(
        _trial(i + 1, i / 5, tps=100.0 + i, p95=10.0 + i % 3, hit=0.5 + i / 20) for i in range(5)
    )
    data = outcome_data(spec, encoder, trials)
    model: Any = fit_models(data, encoder)
    assert not isinstance(model, ModelListGP)
    assert model.num_outputs == 3
    assert model.posterior(torch.rand(4, 2, dtype=torch.float64)).mean.shape == (4, 3)


@pytest.mark.parametrize("trend", [False, True], ids=["constant", "trend"])
def test_a_batched_gps_outputs_are_their_own_gps(trend: bool) -> None:
    """The batched GP of outcomes observed together predicts each output exactly as that
    outcome's GP fitted alone (its hyperparameters are that GP's, stacked)."""
    spec = _spec([{"name": "x", "kind": "float"}, {"name": "c", "kind": "categorical",
                                                     "choices": ["a", "b", "c"]}])  # fmt: skip
    encoder = UnitBoxEncoder(spec.space)
    trials = tuple(
        Trial(i + 1, {"x": i / 11, "c": "abc"[i % 3]}, S.COMPLETED,
              {"tps": 100.0 + 10 * math.sin(4 * i), "p95": 10.0 + i % 4, "hit": 0.5 + i / 30})
        for i in range(12)
    )  # fmt: skip
    data = outcome_data(spec, encoder, trials)
    batched: Any = fit_models(data, encoder, trend=trend)
    assert not isinstance(batched, ModelListGP) and batched.num_outputs == 3
    X = encoder.snap(torch.rand(7, encoder.d, generator=torch.Generator().manual_seed(1),
                                dtype=torch.float64))  # fmt: skip
    together = batched.posterior(X)
    for i, outcome in enumerate(data):
        alone: Any = fit_models([outcome], encoder, trend=trend)
        posterior = alone.posterior(X)
        assert torch.allclose(together.mean[:, i], posterior.mean[:, 0], rtol=1e-9)
        assert torch.allclose(together.variance[:, i], posterior.variance[:, 0], rtol=1e-9)


def test_a_batched_gp_is_warm_started_output_by_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each output of a batched GP keeps its own cached hyperparameters, and the next fit
    starts from them: a few L-BFGS-B steps each, no refit from the priors. (BoTorch 0.18's
    batched fit reported every warm fit that used its 25 steps as a failure, so each
    constrained study's step refitted from the priors.)"""
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    trials = [
        _trial(i + 1, (i * 0.37) % 1, tps=100.0 + 20 * math.sin(5 * i), p95=10.0 + i % 3,
               hit=0.5 + (i % 4) / 10)
        for i in range(22)
    ]  # fmt: skip
    cache = FitCache()  # fitted on 20 rows, then 22: below 200 rows every suggestion fits
    fit_models(outcome_data(spec, encoder, tuple(trials[:20])), encoder, cache, "warm")
    assert all(cache.get(("warm", n), 2) is not None for n in ("tps", "p95", "hit"))
    assert cache.get(("warm", "tps,p95,hit"), 2) is None  # no entry for the batch
    steps: list[int] = []
    real = model_module._optimize
    monkeypatch.setattr(model_module, "_optimize", lambda m, maxiter: steps.append(maxiter)
                        or real(m, maxiter))  # fmt: skip
    batched: Any = fit_models(outcome_data(spec, encoder, tuple(trials)), encoder, cache, "warm")
    assert batched.num_outputs == 3
    assert steps == [model_module._WARM_MAXITER] * 3  # 22 rows: not a full fit's turn
    assert all(cache.fitted_rows(("warm", n), 2) == 22 for n in ("tps", "p95", "hit"))


def test_a_gp_between_fits_is_conditioned_on_every_observation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From 200 observations on the GP keeps its hyperparameters until the data grew by a
    tenth, and is conditioned on all the data in between; below 200 every suggestion fits."""
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    trials = [_trial(i + 1, (i * 0.37) % 1, tps=100.0 + 20 * math.sin(5 * i)) for i in range(222)]
    cache = FitCache()
    steps: list[int] = []
    real = model_module._optimize
    monkeypatch.setattr(model_module, "_optimize", lambda m, maxiter: steps.append(maxiter)
                        or real(m, maxiter))  # fmt: skip
    fit_models(outcome_data(spec, encoder, tuple(trials[:30]))[:1], encoder, cache, "small")
    fit_models(outcome_data(spec, encoder, tuple(trials[:31]))[:1], encoder, cache, "small")
    assert steps[1:] == [model_module._WARM_MAXITER]  # one new row below 200: a warm fit
    assert model_module.refit_interval(199) == 1 and model_module.refit_interval(222) == 22
    fit_models(outcome_data(spec, encoder, tuple(trials[:200])), encoder, cache, "keep")
    steps.clear()
    for rows in (201, 221):
        (data,) = outcome_data(spec, encoder, tuple(trials[:rows]))[:1]
        model: Any = fit_models([data], encoder, cache, "keep")
        assert model.train_inputs[0].shape[-2] == rows  # conditioned on every observation
        assert steps == [] and cache.fitted_rows(("keep", "tps"), 2) == 200
    fit_models(outcome_data(spec, encoder, tuple(trials[:222]))[:1], encoder, cache, "keep")
    assert steps == [model_module._WARM_MAXITER]  # 222 - 200 = refit_interval(222): a warm fit
    assert cache.fitted_rows(("keep", "tps"), 2) == 222


def test_categorical_knobs_get_a_categorical_kernel() -> None:
    knobs: list[dict[str, Any]] = [
        {"name": "x", "kind": "float"},
        {"name": "c", "kind": "categorical", "choices": ["a", "b", "c"]},
    ]
    spec = _spec(knobs)
    encoder = UnitBoxEncoder(spec.space)
    trials = tuple(
        Trial(i + 1, {"x": i / 4, "c": "abc"[i % 3]}, S.COMPLETED, {"tps": float(i)})
        for i in range(4)
    )
    (data,) = outcome_data(spec, encoder, trials)
    mixed: Any = build_model([data], encoder)
    assert any(isinstance(k, CategoricalKernel) for k in mixed.covar_module.modules())
    plain: Any = build_model([data], UnitBoxEncoder(_spec().space))
    assert not any(isinstance(k, CategoricalKernel) for k in plain.covar_module.modules())


def test_fit_cache_stores_and_forgets_hyperparameters(fitted: Any) -> None:
    _, data, _, cache = fitted
    keys = [("study-a", outcome.name) for outcome in data]
    for key in keys:
        state = cache.get(key, 2)
        assert state and all(isinstance(v, torch.Tensor) for v in state.values())
        assert cache.get(key, 3) is None  # another dimension: no warm start
    copy = FitCache()
    for key in keys:
        copy.put(key, 2, cache.get(key, 2))  # type: ignore[arg-type]
    copy.put(("study-b", "tps"), 2, {})
    copy.forget("study-a")
    assert all(copy.get(key, 2) is None for key in keys)
    assert copy.get(("study-b", "tps"), 2) == {}


def test_a_warm_started_fit_gives_the_same_kind_of_model(fitted: Any) -> None:
    _, data, _, cache = fitted
    encoder = UnitBoxEncoder(_spec().space)
    again = fit_models(data, encoder, cache, "study-a")
    assert isinstance(again, ModelListGP) and again.num_outputs == 4


def test_probability_of_feasibility_before_any_feasible_trial(fitted: Any) -> None:
    spec, data, model, _ = fitted
    X_pending = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    acquisition = build_acquisition(spec, model, data, data[0].X, X_pending, False, seed=1)
    assert isinstance(acquisition, qLogProbabilityOfFeasibility)
    assert acquisition.X_pending is not None and acquisition.X_pending.shape == (1, 2)
    value = acquisition(torch.rand(3, 1, 2, dtype=torch.float64))
    assert value.shape == (3,) and bool(torch.isfinite(value).all())


def test_noisy_expected_improvement_once_a_trial_is_feasible(fitted: Any) -> None:
    spec, data, model, _ = fitted
    acquisition = build_acquisition(spec, model, data, data[0].X, None, True, seed=1)
    assert isinstance(acquisition, qLogNoisyExpectedImprovement)
    value = acquisition(torch.rand(3, 1, 2, dtype=torch.float64))
    assert value.shape == (3,) and bool(torch.isfinite(value).all())


def _constrained_history() -> tuple[StudySpec, UnitBoxEncoder, list[OutcomeData]]:
    """Maximize y = x0 + x1 subject to c = x0 <= 0.5, on a 5 x 5 grid of the unit square."""
    spec = StudySpec.from_dict(
        {
            "name": "ts",
            "knobs": [
                {"name": "x0", "kind": "float", "low": 0.0, "high": 1.0},
                {"name": "x1", "kind": "float", "low": 0.0, "high": 1.0},
            ],
            "objectives": [{"name": "y", "goal": "maximize"}],
            "outcome_constraints": ["c <= 0.5"],
        }
    )
    trials = [
        Trial(
            i * 5 + j + 1,
            {"x0": i / 4, "x1": j / 4},
            S.COMPLETED,
            {"y": i / 4 + j / 4, "c": i / 4},
        )
        for i in range(5)
        for j in range(5)
    ]
    encoder = UnitBoxEncoder(spec.space)
    return spec, encoder, outcome_data(spec, encoder, tuple(trials))


def test_thompson_candidates_stay_in_the_box_and_move_away_from_the_center() -> None:
    spec, encoder, data = _constrained_history()
    model = fit_models(data, encoder)
    center = [0.5, 0.5]
    lows, highs = (0.3, 0.2), (0.7, 0.9)
    points = thompson_candidates(spec, model, data, center, lows, highs, q=3, seed=1)
    assert points.shape == (3, 2)
    assert len({tuple(row.tolist()) for row in points}) == 3
    for row in points.tolist():
        assert all(lo <= v <= hi for v, lo, hi in zip(row, lows, highs, strict=True))
        assert row != center


def test_thompson_candidates_respect_the_modelled_constraint() -> None:
    """The objective grows with x0 but c = x0 must stay <= 0.5: samples pick points near the
    constraint's edge, from the larger x1 side, not the infeasible half of the box."""
    spec, encoder, data = _constrained_history()
    model = fit_models(data, encoder)
    picks = torch.cat(
        [
            thompson_candidates(spec, model, data, [0.5, 0.5], (0.0, 0.0), (1.0, 1.0), 1, seed)
            for seed in range(8)
        ]
    )
    assert float(picks[:, 0].max()) < 0.62
    assert float(picks[:, 1].mean()) > 0.7
    # the same seed, the same point: a restarted server suggests the same
    again = thompson_candidates(spec, model, data, [0.5, 0.5], (0.0, 0.0), (1.0, 1.0), 1, 0)
    assert torch.equal(again, picks[:1])


def test_a_trend_carries_the_fitted_slope_to_the_face_of_the_box() -> None:
    """With ``trend`` the GP's prior mean is linear: beyond the data (x in [0, 0.4]) it keeps
    rising toward x = 1, where a constant-mean GP falls back toward the average."""
    spec = _spec([{"name": "x", "kind": "float"}])
    encoder = UnitBoxEncoder(spec.space)
    trials = tuple(_trial(i + 1, 0.4 * i / 7, tps=10.0 * (0.4 * i / 7)) for i in range(8))
    (data,) = [d for d in outcome_data(spec, encoder, trials) if d.name == "tps"]
    cache = FitCache()
    flat: Any = fit_models([data], encoder, cache, "s")
    sloped: Any = fit_models([data], encoder, cache, "s", trend=True)
    assert not isinstance(flat.mean_module, LinearMean)
    assert isinstance(sloped.mean_module, LinearMean)
    face = torch.tensor([[1.0]], dtype=torch.float64)
    with torch.no_grad():
        at_face = float(sloped.posterior(face).mean)
        flat_face = float(flat.posterior(face).mean)
    assert at_face == pytest.approx(10.0, abs=1.0)  # the line y = 10 x, continued
    assert flat_face < 6.0  # the constant mean pulls the prediction back down
    # the two kinds are cached apart: a constant-mean state never warm-starts a trend fit
    assert cache.get(("s", "tps"), 1) is not None and cache.get(("s:trend", "tps"), 1) is not None
    again: Any = fit_models([data], encoder, cache, "s", trend=True)
    assert isinstance(again.mean_module, LinearMean)


def test_a_trend_works_for_batched_outcomes_and_next_to_a_feasibility_classifier() -> None:
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    ran = [
        _trial(i + 1, i / 6, tps=100.0 + 10 * i, p95=10.0 + i, hit=0.5 + i / 20) for i in range(6)
    ]
    data = outcome_data(spec, encoder, tuple(ran))
    batched: Any = fit_models(data, encoder, trend=True)
    assert not isinstance(batched, ModelListGP) and isinstance(batched.mean_module, LinearMean)
    face = torch.tensor([[1.0, 0.5]], dtype=torch.float64)
    with torch.no_grad():
        tps, p95, _ = batched.posterior(face).mean[0].tolist()
    assert tps > 140.0 and p95 > 14.0  # both slopes carried beyond the data (x <= 5/6)
    broken = (*ran, _trial(7, 0.95, S.INFEASIBLE))
    listed: Any = fit_models(outcome_data(spec, encoder, broken), encoder, trend=True)
    assert isinstance(listed, ModelListGP) and len(listed.models) == 4
    assert all(isinstance(m.mean_module, LinearMean) for m in listed.models)
    assert listed.posterior(face).mean.shape == (1, 4)


def test_a_trend_starts_at_zero_and_leaves_torchs_global_generator_alone() -> None:
    """GPyTorch's LinearMean draws its start from torch's global generator; the trend's
    mean starts at zero, so a trend fit is the same whatever else drew from it."""
    spec = _spec()
    encoder = UnitBoxEncoder(spec.space)
    trials = tuple(
        _trial(i + 1, i / 6, tps=100.0 + 10 * i, p95=10.0 + i, hit=0.6) for i in range(6)
    )
    data = outcome_data(spec, encoder, trials)
    state = torch.get_rng_state()
    model: Any = build_model(data, encoder, trend=True)
    assert torch.equal(torch.get_rng_state(), state)
    assert isinstance(model.mean_module, LinearMean)
    assert not model.mean_module.weights.any() and not model.mean_module.bias.any()
    fits = []
    with torch.random.fork_rng():  # the test's own draws stay in the test
        for seed in (1, 2):
            torch.manual_seed(seed)
            fitted: Any = fit_models(data[:1], encoder, trend=True)
            fits.append(fitted.mean_module.weights.detach().clone())
    assert torch.equal(fits[0], fits[1])


def _box_data(n: int) -> tuple[UnitBoxEncoder, list[Any]]:
    spec = StudySpec.from_dict(
        {
            "name": "big",
            "knobs": [{"name": "x", "kind": "float"}, {"name": "y", "kind": "float"}],
            "objectives": [{"name": "f", "goal": "minimize"}],
        }
    )
    encoder = UnitBoxEncoder(spec.space)
    rng = torch.Generator().manual_seed(3)
    X = torch.rand(n, 2, generator=rng, dtype=torch.float64)
    f = ((X - 0.3) ** 2).sum(-1) + 0.01 * torch.randn(n, generator=rng, dtype=torch.float64)
    trials = tuple(
        Trial(i + 1, {"x": float(a), "y": float(b)}, S.COMPLETED, {"f": float(v)})
        for i, ((a, b), v) in enumerate(zip(X.tolist(), f.tolist(), strict=True))
    )
    return encoder, outcome_data(spec, encoder, trials)


def test_large_constrained_baselines_drop_sure_losers_and_surely_infeasible_points() -> None:
    spec = StudySpec.from_dict(
        {
            "name": "big-c",
            "knobs": [{"name": "x", "kind": "float"}, {"name": "y", "kind": "float"}],
            "objectives": [{"name": "f", "goal": "minimize"}],
            "outcome_constraints": ["c <= 0.5"],
        }
    )
    encoder = UnitBoxEncoder(spec.space)
    rng = torch.Generator().manual_seed(5)
    n = CONTENDERS_FROM + 60
    X = torch.rand(n, 2, generator=rng, dtype=torch.float64)
    f = ((X - 0.3) ** 2).sum(-1) + 0.01 * torch.randn(n, generator=rng, dtype=torch.float64)
    c = X[:, 0] + 0.02 * torch.randn(n, generator=rng, dtype=torch.float64)  # x <= 0.5
    trials = tuple(
        Trial(i + 1, {"x": float(a), "y": float(b)}, S.COMPLETED, {"f": float(u), "c": float(v)})
        for i, ((a, b), u, v) in enumerate(zip(X.tolist(), f.tolist(), c.tolist(), strict=True))
    )
    data = outcome_data(spec, encoder, trials)
    model = fit_models(data, encoder)
    constraints = outcome_constraints(spec, data)
    x_obs = data[0].X
    assert torch.equal(data[1].X, x_obs)  # both outputs observed on the same trials
    kept = _contenders(model, x_obs, sign=-1.0, constraints=constraints)
    with torch.no_grad():
        posterior = model.posterior(x_obs)
    mean, std = posterior.mean, posterior.variance.sqrt()
    low, high = mean - 6 * std, mean + 6 * std
    bound = data[1].transform(0.5)  # the constraint's output, in the model's units
    surely_feasible, surely_infeasible = high[:, 1] <= bound, low[:, 1] > bound
    best_lower = (-high[surely_feasible, 0]).max()  # minimized: the upper end is the worst
    expected = x_obs[~surely_infeasible & (-low[:, 0] >= best_lower)]
    assert torch.equal(kept, expected)
    assert surely_infeasible.any() and 0 < kept.shape[0] < int((~surely_infeasible).sum())
    # every point that is the best in some of 4096 posterior samples is kept
    samples = SobolQMCNormalSampler(sample_shape=torch.Size([4096]), seed=0)(posterior)
    signed = torch.where(samples[..., 1] <= bound, -samples[..., 0], -math.inf)
    winners = x_obs[torch.unique(signed.argmax(dim=-1))]
    assert all(any(torch.equal(w, k) for k in kept) for w in winners)
    hopeless = outcome_constraints(
        StudySpec.from_dict({**spec.to_dict(), "outcome_constraints": ["c <= -5"]}), data
    )
    assert torch.equal(_contenders(model, x_obs, -1.0, hopeless), x_obs)  # none feasible: all


def test_studies_keep_fitted_hyperparameters_until_the_data_grew_by_a_tenth() -> None:
    encoder, data = _box_data(280)
    cache = FitCache()
    key = ("big", "f")

    def fit(n: int) -> dict[str, torch.Tensor]:
        (outcome,) = data
        part = OutcomeData(outcome.name, outcome.X[:n], outcome.Y[:n], outcome.log)
        fit_models([part], encoder, cache, "big")
        return cache.get(key, 2)  # type: ignore[return-value]

    small = fit(8)
    assert fit(9) is not small  # under 20 observations every suggestion fits
    first = fit(250)
    assert cache.fitted_rows(key, 2) == 250
    assert fit(276) is first and cache.fitted_rows(key, 2) == 250  # 26 < 276 // 10
    refitted = fit(277)  # 27 = 277 // 10: fitted again
    assert refitted is not first and cache.fitted_rows(key, 2) == 277


def test_large_baselines_drop_only_sure_losers_before_pruning() -> None:
    encoder, data = _box_data(CONTENDERS_FROM + 40)
    model = fit_models(data, encoder)
    (outcome,) = data
    kept = _contenders(model, outcome.X, sign=-1.0)
    assert 0 < kept.shape[0] < outcome.X.shape[0]
    with torch.no_grad():
        posterior = model.posterior(outcome.X)
    mean, std = -posterior.mean[..., 0], posterior.variance[..., 0].sqrt()
    best_lower = (mean - 6 * std).max()
    expected = outcome.X[mean + 6 * std >= best_lower]
    assert torch.equal(kept, expected)
    assert any(torch.equal(row, outcome.X[int(mean.argmax())]) for row in kept)
    small = outcome.X[: CONTENDERS_FROM - 1]
    assert torch.equal(_contenders(model, small, sign=-1.0), small)  # below the size: all


def test_distinct_rows_keeps_the_first_of_each_in_order() -> None:
    X = torch.tensor(
        [[0.1, 0.2], [0.5, 0.5], [0.1, 0.2], [0.3, 0.4], [0.5, 0.5]], dtype=torch.float64
    )
    assert distinct_rows(X).tolist() == [[0.1, 0.2], [0.5, 0.5], [0.3, 0.4]]
    unique = torch.rand(4, 3)
    assert distinct_rows(unique) is unique
