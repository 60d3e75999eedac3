"""Tests for tuner.measurement_stats (ratio intervals, instability, drift) and the mean
and spread of a trial's repeats (``tuner.trial.repeat_summary``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.measurement_stats import (
    RatioInterval,
    drift,
    pooled_log_variance,
    ratio_interval,
    sequential_ratio_interval,
    unstable,
)
from tuner.trial import Measurement, repeat_summary


def _lognormal(rng: np.random.Generator, cov: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Multiplicative noise with median 1 and coefficient of variation ``cov``."""
    return rng.lognormal(0.0, math.sqrt(math.log1p(cov**2)), size)


def test_paired_interval_covers_under_drift_and_beats_unpaired() -> None:
    rng = np.random.default_rng(7)
    true_ratio, rounds, simulations = 1.5, 10, 400
    covered, paired_widths, unpaired_widths = 0, [], []
    for _ in range(simulations):
        machine = rng.uniform(0.3, 1.0, rounds)  # strong drift, shared within a round
        default = (100.0 * machine * _lognormal(rng, 0.10, rounds)).tolist()
        candidate = (true_ratio * 100.0 * machine * _lognormal(rng, 0.10, rounds)).tolist()
        paired = ratio_interval(default, candidate, maximize=True)
        unpaired = ratio_interval(default, candidate, maximize=True, paired=False)
        assert paired is not None and unpaired is not None
        covered += paired.low <= true_ratio <= paired.high
        paired_widths.append(paired.high - paired.low)
        unpaired_widths.append(unpaired.high - unpaired.low)
    assert 0.92 <= covered / simulations <= 0.98
    assert np.mean(paired_widths) < 0.5 * np.mean(unpaired_widths)


def test_unpaired_interval_covers_without_drift() -> None:
    rng = np.random.default_rng(11)
    true_ratio, simulations = 1.5, 400
    covered = 0
    for _ in range(simulations):
        default = (100.0 * _lognormal(rng, 0.10, 10)).tolist()
        candidate = (true_ratio * 100.0 * _lognormal(rng, 0.10, 8)).tolist()
        interval = ratio_interval(default, candidate, maximize=True, paired=False)
        assert interval is not None and interval.n == 8 and not interval.paired
        covered += interval.low <= true_ratio <= interval.high
    assert 0.92 <= covered / simulations <= 0.98


def test_paired_interval_known_values() -> None:
    # log ratios 0.1 and 0.3: mean 0.2, sd 0.1 * sqrt(2), t_{0.975, 1} = 12.7062
    interval = ratio_interval([1.0, 1.0], [math.exp(0.1), math.exp(0.3)], maximize=True)
    assert interval is not None
    half = 12.7062047 * 0.1
    assert interval.ratio == pytest.approx(math.exp(0.2))
    assert interval.low == pytest.approx(math.exp(0.2 - half))
    assert interval.high == pytest.approx(math.exp(0.2 + half))
    assert (interval.n, interval.paired, interval.level) == (2, True, 0.95)


def test_minimize_orients_the_ratio() -> None:
    latency_default = [10.0, 10.4, 9.8, 10.1]
    latency_candidate = [5.0, 5.1, 4.9, 5.2]
    better = ratio_interval(latency_default, latency_candidate, maximize=False)
    assert better is not None
    assert better.ratio == pytest.approx(2.0, rel=0.03)
    assert better.significant and better.low > 1.0
    worse = ratio_interval(latency_candidate, latency_default, maximize=False)
    assert worse is not None
    assert worse.ratio == pytest.approx(1 / better.ratio)
    assert worse.significant and worse.high < 1.0
    unpaired = ratio_interval(latency_default, latency_candidate, maximize=False, paired=False)
    assert unpaired is not None
    assert unpaired.ratio == pytest.approx(np.mean(latency_default) / np.mean(latency_candidate))


def test_no_significance_within_noise() -> None:
    interval = ratio_interval([100.0, 90.0, 110.0], [95.0, 105.0, 100.0], maximize=True)
    assert interval is not None
    assert interval.low < 1.0 < interval.high
    assert not interval.significant


@pytest.mark.parametrize("paired", [True, False])
def test_no_spread_collapses_to_the_ratio(paired: bool) -> None:
    interval = ratio_interval([4.0, 4.0, 4.0], [6.0, 6.0, 6.0], maximize=True, paired=paired)
    assert interval is not None
    assert interval.low == interval.ratio == interval.high == pytest.approx(1.5)
    assert interval.significant


@pytest.mark.parametrize("paired", [True, False])
def test_fewer_than_two_values_give_none(paired: bool) -> None:
    assert ratio_interval([1.0], [2.0], maximize=True, paired=paired) is None
    assert ratio_interval([], [], maximize=True, paired=paired) is None
    assert ratio_interval([1.0, 1.1, 1.2], [2.0], maximize=True, paired=False) is None


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match=r"candidate\[1\] must be positive and finite, got 0.0"):
        ratio_interval([1.0, 2.0], [1.0, 0.0], maximize=True)
    with pytest.raises(ValueError, match=r"default\[0\] must be positive and finite, got nan"):
        ratio_interval([math.nan, 2.0], [1.0, 1.0], maximize=True)
    with pytest.raises(ValueError, match=r"default\[2\] .* got inf"):
        ratio_interval([1.0, 2.0, math.inf], [1.0], maximize=True, paired=False)
    with pytest.raises(ValueError, match=r"equal lengths, got 2 default and 3 candidate"):
        ratio_interval([1.0, 2.0], [1.0, 2.0, 3.0], maximize=True)
    with pytest.raises(ValueError, match=r"level must be between 0 and 1, got 95"):
        ratio_interval([1.0, 2.0], [1.0, 2.0], maximize=True, level=95)


def test_str_format() -> None:
    interval = RatioInterval(ratio=1.8449, low=1.7123, high=1.9688, level=0.95, n=10, paired=True)
    assert str(interval) == "1.84x (1.71–1.97)"


def test_repeat_summary_is_the_trials_mean_and_sample_deviation() -> None:
    repeats = [Measurement({"tps": v, "p95": 2 * v}) for v in (9.0, 10.0, 11.0)]
    means, spread = repeat_summary(repeats)
    assert means == {"tps": 10.0, "p95": 20.0} and spread == {"tps": 1.0, "p95": 2.0}
    assert repeat_summary(repeats[:1]) == ({"tps": 9.0, "p95": 18.0}, {})


def test_pooled_log_variance() -> None:
    groups = [[1.0, math.e], [2.0], [1.0, math.e, math.e**2]]
    # log values (0, 1): squares 0.5; (0, 1, 2): squares 2; df 1 + 2
    assert pooled_log_variance(groups) == (pytest.approx(2.5 / 3), 3)
    assert pooled_log_variance([[1.0], [2.0]]) is None
    assert pooled_log_variance([]) is None
    with pytest.raises(ValueError, match=r"groups\[1\]\[0\] must be positive"):
        pooled_log_variance([[1.0, 2.0], [0.0, 1.0]])


def test_ordinary_noise_is_rarely_unstable() -> None:
    rng = np.random.default_rng(3)
    cases = 300
    flagged = 0
    for _ in range(cases):
        pooled = pooled_log_variance(list(100.0 * _lognormal(rng, 0.05, (20, 5))))
        flagged += unstable((100.0 * _lognormal(rng, 0.05, 5)).tolist(), pooled)
    assert flagged / cases <= 0.03


def test_wild_group_is_unstable() -> None:
    rng = np.random.default_rng(5)
    cases = 100
    flagged = 0
    for _ in range(cases):
        pooled = pooled_log_variance(list(100.0 * _lognormal(rng, 0.05, (20, 5))))
        flagged += unstable((100.0 * _lognormal(rng, 0.40, 5)).tolist(), pooled)
    assert flagged / cases >= 0.95


def test_unstable_floor_and_degenerate_cases() -> None:
    tiny = [100.0, 101.0, 99.0, 100.5]  # CoV about 1%
    quiet_machine = (1e-8, 50)
    assert not unstable(tiny, quiet_machine)  # under the 2% floor
    assert unstable(tiny, quiet_machine, floor_cov=0.0)
    assert not unstable([100.0], quiet_machine)
    assert not unstable([100.0, 300.0], None)


def test_drift_interpolates_and_holds_at_the_ends() -> None:
    d = drift([20.0, 0.0, 10.0], [50.0, 100.0, 100.0])  # sorted by time
    assert d.times == (0.0, 10.0, 20.0)
    assert d.values == (100.0, 100.0, 50.0)
    assert d.reference == 100.0
    assert d.factors == (1.0, 1.0, 0.5)
    assert d.factor_at(15.0) == pytest.approx(0.75)
    assert d.factor_at(10.0) == 1.0
    assert d.factor_at(-5.0) == 1.0
    assert d.factor_at(100.0) == 0.5


def test_drift_reference_is_median_of_first_three() -> None:
    d = drift([0.0, 1.0, 2.0, 3.0], [100.0, 200.0, 110.0, 50.0])
    assert d.reference == 110.0
    assert d.worst(maximize=True) == (3.0, pytest.approx(50 / 110))
    assert drift([0.0, 1.0], [100.0, 120.0]).reference == 110.0


def test_drift_worst_and_changed() -> None:
    d = drift([0.0, 1.0, 2.0, 3.0, 4.0], [100.0, 100.0, 100.0, 115.0, 115.0])
    assert d.worst(maximize=True) == (3.0, pytest.approx(1.15))
    assert not d.changed()
    assert d.changed(threshold=0.1)
    slower = drift([0.0, 1.0, 2.0, 3.0, 4.0], [100.0, 100.0, 100.0, 80.0, 80.0])
    assert slower.changed()  # 0.8 = 1/1.25 is as far from 1 as 1.25 on the log scale
    # one noisy control is not a changed machine; two in a window of three are
    once = drift([0.0, 1.0, 2.0, 3.0, 4.0], [100.0, 100.0, 60.0, 100.0, 100.0])
    assert not once.changed() and once.worst(maximize=True) == (2.0, 0.6)
    late = drift([0.0, 1.0, 2.0, 3.0, 4.0], [100.0, 100.0, 100.0, 100.0, 60.0])
    assert not late.changed()  # the last control alone: not yet
    # equal log deviations: the slower machine wins for the goal's direction
    both = drift([0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 2.0, 0.5])
    assert both.worst(maximize=True) == (3.0, 0.5)
    assert both.worst(maximize=False) == (2.0, 2.0)


def test_drift_without_controls() -> None:
    d = drift([], [])
    assert d.factors == ()
    assert d.factor_at(3.0) == 1.0
    assert not d.changed()
    with pytest.raises(ValueError, match="no control measurements"):
        d.worst(maximize=True)


def test_drift_bad_inputs() -> None:
    with pytest.raises(ValueError, match="got 2 times and 1 values"):
        drift([0.0, 1.0], [1.0])
    with pytest.raises(ValueError, match=r"values\[0\] must be positive and finite"):
        drift([0.0], [-2.0])
    with pytest.raises(ValueError, match=r"times\[1\] must be finite, got nan"):
        drift([0.0, math.nan], [1.0, 1.0])


# -- the confidence sequence ------------------------------------------------------------------
def _mixture_martingale(d: list[float], m: float, c: float = 1.0) -> float:
    """The Gaussian-mixture t test martingale at mean ``m`` (Wang & Ramdas 2023), directly."""
    n = len(d)
    s = sum(x - m for x in d)
    v = sum((x - m) ** 2 for x in d)
    return math.sqrt(c * c / (n + c * c)) * (1 - s * s / ((n + c * c) * v)) ** (-n / 2)


def test_the_sequence_ends_where_the_mixture_martingale_reaches_one_over_alpha() -> None:
    rng = np.random.default_rng(3)
    default = list(100 * _lognormal(rng, 0.1, 12))
    candidate = list(120 * _lognormal(rng, 0.1, 12))
    got = sequential_ratio_interval(default, candidate, maximize=True)
    assert got is not None and got.sequential and got.paired and got.n == 12
    d = [math.log(c / b) for b, c in zip(default, candidate, strict=True)]
    for end in (got.low, got.high):
        assert _mixture_martingale(d, math.log(end)) == pytest.approx(20.0, rel=1e-6)
    assert _mixture_martingale(d, math.log(got.ratio)) < 20.0
    fixed = ratio_interval(default, candidate, maximize=True)
    assert fixed is not None and got.low < fixed.low and got.high > fixed.high  # the price
    latency = sequential_ratio_interval(candidate, default, maximize=False)
    assert latency is not None and latency.ratio == pytest.approx(got.ratio)


def test_too_few_rounds_leave_the_sequence_unbounded_and_more_rounds_narrow_it() -> None:
    rng = np.random.default_rng(4)
    default, candidate = list(_lognormal(rng, 0.1, 40)), list(1.2 * _lognormal(rng, 0.1, 40))
    assert sequential_ratio_interval(default[:1], candidate[:1], maximize=True) is None
    three = sequential_ratio_interval(default[:3], candidate[:3], maximize=True)
    assert three is not None and three.low == 0.0 and three.high == math.inf
    assert not three.significant
    widths = []
    for n in (6, 10, 20, 40):
        got = sequential_ratio_interval(default[:n], candidate[:n], maximize=True)
        assert got is not None and math.isfinite(got.high)
        widths.append(got.high / got.low)
    assert widths == sorted(widths, reverse=True)
    with pytest.raises(ValueError, match="mixture"):
        sequential_ratio_interval(default, candidate, maximize=True, mixture=0.0)


def test_stopping_when_the_sequence_excludes_one_keeps_false_claims_under_five_percent() -> None:
    """No gain at all, and a confirmation that looks after every round up to 30 and stops
    as soon as its interval excludes 1: the confidence sequence claims a difference in at
    most 5 % of sessions; the t interval read the same way claims one far more often,
    which is why a growing confirmation cannot stop on the t interval."""
    rng = np.random.default_rng(7)
    sessions, rounds = 400, 30
    false_sequential = false_fixed = 0
    for _ in range(sessions):
        default = list(_lognormal(rng, 0.15, rounds))
        candidate = list(_lognormal(rng, 0.15, rounds))
        seq = fixed = False
        for n in range(3, rounds + 1):
            if not seq:
                s = sequential_ratio_interval(default[:n], candidate[:n], maximize=True)
                seq = bool(s and s.significant)
            if not fixed:
                t = ratio_interval(default[:n], candidate[:n], maximize=True)
                fixed = bool(t and t.significant)
        false_sequential += seq
        false_fixed += fixed
    assert false_sequential / sessions <= 0.05
    assert false_fixed / sessions >= 0.15


def test_a_real_gain_is_settled_within_a_dozen_rounds() -> None:
    """1.3x at 10 % noise per measurement: the sequence excludes 1 within 12 rounds in
    nearly every session, and holds the true ratio where it stops."""
    rng = np.random.default_rng(11)
    stopped, held = [], 0
    for _ in range(200):
        default, candidate = list(_lognormal(rng, 0.1, 30)), list(1.3 * _lognormal(rng, 0.1, 30))
        for n in range(3, 31):
            got = sequential_ratio_interval(default[:n], candidate[:n], maximize=True)
            if got is not None and got.significant:
                stopped.append(n)
                held += got.low <= 1.3 <= got.high
                break
    assert len(stopped) >= 198 and sorted(stopped)[len(stopped) // 2] <= 12
    assert held >= 0.95 * len(stopped)


def test_a_longer_window_where_the_noise_averages_within_a_run_and_a_round_costs_much() -> None:
    from tuner.measurement_stats import window_factor

    # all the run-to-run noise is the windows' (0.04 / 10 = 0.004): a round's 3 s of
    # overhead against a 3 s window makes longer windows cheaper per unit of precision
    assert window_factor(0.004, 0.04, 10, 3.0, 3.0) > 1
    assert window_factor(0.004, 0.04, 10, 3.0, 30.0) == 4  # a restart: as long as allowed
    # the same noise without overhead: the time a precision costs is the same, so 1
    assert window_factor(0.004, 0.04, 10, 3.0, 0.0) == 1
    # the noise is between runs (the windows agree): a longer window buys nothing
    assert window_factor(0.05, 0.001, 10, 3.0, 30.0) == 1
    with pytest.raises(ValueError):
        window_factor(0.01, 0.01, 0, 3.0, 1.0)
