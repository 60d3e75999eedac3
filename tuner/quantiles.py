"""Quantiles of Student's t and Fisher's F distributions in plain Python.

The confirmation's intervals (``tuner.measurement_stats.ratio_interval``) need a t
quantile and the instability test (``unstable``) an F quantile. They are computed here
rather than with SciPy so that every command that reads results, including those of the
base install (no SciPy, no torch), rebuilds a stored confirmation exactly as the session
judged it, and starts in a fraction of a second (``import scipy.stats`` alone takes about
two seconds on a small machine).

Both quantiles invert the regularized incomplete beta function ``I_x(a, b)``:

* t with ``df`` degrees of freedom, for ``p > 1/2``: ``P(|T| > t) = I_x(df/2, 1/2)`` with
  ``x = df / (df + t²)``, so ``t = sqrt(df (1 - x) / x)`` for ``I_x = 2 (1 - p)``;
* F with ``(d1, d2)``: ``P(F <= f) = I_x(d1/2, d2/2)`` with ``x = d1 f / (d1 f + d2)``.

``I_x`` is evaluated by its continued fraction (modified Lentz; Press et al., *Numerical
Recipes*, 3rd ed., §6.4, with the symmetry ``I_x(a, b) = 1 - I_{1-x}(b, a)`` where the
fraction converges slowly) and inverted by bisection, which is monotone and cannot fail;
``tests/tuner/test_quantiles.py`` checks both against SciPy to 1e-10.
"""

from __future__ import annotations

import math

#: The continued fraction stops when a step changes it by less than this (relative).
_EPS = 1e-16
_TINY = 1e-300
_MAX_TERMS = 10_000


def t_ppf(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom.

    Raises:
        ValueError: ``p`` is not in (0, 1) or ``df`` is not positive and finite.
    """
    _check(p, "p")
    _check_df(df, "df")
    if p == 0.5:
        return 0.0
    upper = p > 0.5
    tail = 2.0 * ((1.0 - p) if upper else p)  # P(|T| > t)
    x, y = _beta_inverse(df / 2.0, 0.5, tail)
    t = math.sqrt(df * y / x) if x > 0 else math.inf
    return t if upper else -t


def f_ppf(p: float, d1: float, d2: float) -> float:
    """The ``p`` quantile of Fisher's F with ``(d1, d2)`` degrees of freedom.

    Raises:
        ValueError: ``p`` is not in (0, 1) or a ``d`` is not positive and finite.
    """
    _check(p, "p")
    _check_df(d1, "d1")
    _check_df(d2, "d2")
    x, y = _beta_inverse(d1 / 2.0, d2 / 2.0, p)
    return d2 * x / (d1 * y) if y > 0 else math.inf


def beta_cdf(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
        + a * math.log(x) + b * math.log1p(-x)
    )  # fmt: skip
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _fraction(x, a, b) / a
    return 1.0 - front * _fraction(1.0 - x, b, a) / b


# -- private --------------------------------------------------------------------------------
def _beta_inverse(a: float, b: float, p: float) -> tuple[float, float]:
    """``(x, 1 - x)`` with ``I_x(a, b) = p``. Bisection runs on the smaller of the two
    (``I_{1-x}(b, a) = 1 - p``), so that each keeps its relative precision."""
    if beta_cdf(0.5, a, b) >= p:
        x = _bisect(a, b, p)
        return x, 1.0 - x
    y = _bisect(b, a, 1.0 - p)
    return 1.0 - y, y


def _bisect(a: float, b: float, p: float) -> float:
    """The ``x`` in [0, 1/2] with ``I_x(a, b) = p`` (``p <= I_{1/2}(a, b)``), to the last
    bit: the bracket halves until it cannot shrink any more."""
    low, high = 0.0, 0.5
    for _ in range(2000):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if beta_cdf(middle, a, b) < p:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def _fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (modified Lentz's method)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS):
        m2 = 2 * m
        for numerator in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def _check(p: float, name: str) -> None:
    if not 0.0 < p < 1.0:
        raise ValueError(f"{name} must be between 0 and 1, got {p!r}")


def _check_df(df: float, name: str) -> None:
    if not (math.isfinite(df) and df > 0):
        raise ValueError(f"{name} must be positive and finite, got {df!r}")
