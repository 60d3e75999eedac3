"""The t and F quantiles of ``tuner.quantiles`` against SciPy's (the dev install has it)."""

from __future__ import annotations

import math

import pytest
from scipy import special, stats

from tuner.quantiles import beta_cdf, f_ppf, t_ppf

LEVELS = (1e-6, 0.01, 0.3, 0.5, 0.9, 0.95, 0.975, 0.99, 0.995, 1 - 1e-6)
DFS = (0.5, 1, 1.5, 2, 3, 4, 7.3, 10, 29, 100, 1000)


@pytest.mark.parametrize("df", DFS)
def test_the_t_quantile_matches_scipy(df: float) -> None:
    for p in LEVELS:
        assert t_ppf(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("d1", (0.5, 1, 2, 4, 9, 30, 300))
def test_the_f_quantile_matches_scipy(d1: float) -> None:
    for d2 in DFS:
        for p in LEVELS:
            assert f_ppf(p, d1, d2) == pytest.approx(stats.f.ppf(p, d1, d2), rel=1e-10)


def test_the_t_quantile_near_the_median_keeps_its_precision() -> None:
    # 1 - x near 1 would cancel; the inverse runs on the smaller side (SciPy is off by
    # 1.6e-9 relative here; the value is checked by its CDF instead)
    t = t_ppf(0.5001, 4)
    assert stats.t.cdf(t, 4) == pytest.approx(0.5001, abs=1e-15)
    assert t_ppf(0.4999, 4) == -t


def test_the_incomplete_beta_matches_scipy() -> None:
    for a in (0.25, 0.5, 1, 2.5, 15, 150):
        for b in (0.5, 1, 3, 40, 400):
            for x in (0.0, 1e-8, 0.01, 0.3, 0.5, 0.7, 0.99, 1 - 1e-9, 1.0):
                expected = special.betainc(a, b, x)
                assert beta_cdf(x, a, b) == pytest.approx(expected, rel=1e-11, abs=1e-300)


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: t_ppf(0.0, 3), "p must be between 0 and 1, got 0.0"),
        (lambda: t_ppf(1.5, 3), "p must be between 0 and 1, got 1.5"),
        (lambda: t_ppf(0.9, 0), "df must be positive and finite, got 0"),
        (lambda: f_ppf(0.9, math.inf, 3), "d1 must be positive and finite, got inf"),
        (lambda: f_ppf(0.9, 3, -1), "d2 must be positive and finite, got -1"),
    ],
)
def test_bad_arguments_are_named(call: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
        call()  # type: ignore[operator]
