"""Statistics for noisy measurements: ratio intervals, instability and machine drift.

Real systems are noisy: on a shared machine one benchmark run can be off by a factor of ten,
and the machine itself may get slower or faster during a session. Noise-aware tuning (TUNA,
Freischuetz et al., EuroSys 2025) therefore measures trials several times, re-measures a
control configuration (the default) in between, and confirms the winners at the end in an
interleaved run: in rounds ``r = 1..n`` the default and each candidate are measured once,
back to back. This module holds the statistics behind that protocol. Noise on systems is
multiplicative, so everything works on the log scale; all values must be positive and
finite (throughput- or latency-like numbers).

``ratio_interval``
    How much better a candidate is than the default, as a ratio with a t interval. It is
    oriented so that a ratio above 1 means the candidate is better (``maximize`` says which
    way is better). *Paired* (the interleaved confirmation): with the log ratios
    ``d_i = log(candidate_i / default_i)`` of the rounds, the ratio is ``exp(mean d)`` and the
    interval ``exp(mean d ± t_{n-1} · sd(d) / sqrt(n))``. A drift of the machine between
    rounds multiplies both values of a round alike and cancels in ``d_i``. *Unpaired*: the
    ratio of the arithmetic means, with the interval on the log scale by the delta method,
    ``var(log mean) ≈ s² / (n · mean²)`` for each side, and the t quantile at the
    Welch–Satterthwaite degrees of freedom (Welch 1947; Satterthwaite 1946).
``sequential_ratio_interval``
    The paired ratio with a *confidence sequence* instead of a t interval: it holds at
    every round at once, so a confirmation may look after each round and stop as soon as
    the interval excludes 1 (or is narrow enough) without inflating its error rate (the
    fixed-n t interval read after every round would). It is the Gaussian-mixture t
    confidence sequence of Wang & Ramdas (2023, "Anytime-valid t-tests and confidence
    sequences for Gaussian means with unknown variance", the scale-invariant test
    martingale of Lai (1976) with a normal mixture over the effect size): for the log
    ratios ``d_1..d_n`` and a hypothesised mean ``m``, with ``S = sum(d_i - m)`` and
    ``V = sum((d_i - m)^2)``, the process ``sqrt(c²/(n+c²)) (1 - S²/((n+c²) V))^(-n/2)`` is
    a nonnegative martingale under ``m`` (for Gaussian ``d_i`` of any variance), so by
    Ville's inequality it passes ``1/alpha`` at some round with probability at most
    ``alpha``. The ``m`` where it stays below are the interval
    ``mean d ± sd_ml · sqrt(q / (n - q))``, ``q = (1 - K^(-2/n)) (n + c²)``,
    ``K = sqrt((n + c²)/c²) / alpha``, ``sd_ml`` the spread with divisor ``n``; unbounded
    while ``n <= q`` (about 4 rounds at 95 %). ``c = 1``: the mixture's effect sizes have the
    spread of one round's noise, a gain about as large as the noise, the size a
    confirmation is there to settle.
``window_factor``
    How much longer a confirmation round's measurement should be, from where the noise
    lives. A measurement of ``W`` windows whose windows scatter with log variance ``w``
    would scatter with ``w / W`` run to run if the noise were all within the run; what the
    runs scatter beyond that (``b``, the run-to-run variance less ``w / W``) a longer window
    does not average away. A window ``k`` times longer gives a run variance of
    ``b + w / (k W)``, and a round costs ``k · window + overhead`` seconds (warm-up,
    restart); the rounds a given precision needs scale with the variance, so the time it
    needs is their product, and ``k`` is where that is least.
``pooled_log_variance``, ``unstable``
    The noise of repeated measurements and whether a trial is noisier than the machine's noise: a
    one-sided F test of the trial's log variance against the variance of log values pooled
    over the other trials.
``drift``
    The control measurements over time: how fast the machine was at time ``t`` relative to
    the start of the session, to flag a changed machine or to normalise trials.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.quantiles import f_ppf, t_ppf


def _positive(values: Sequence[float], name: str) -> list[float]:
    """``values`` as floats; ValueError naming the first that is not positive and finite.

    Plain Python, not NumPy: the samples are a handful of values, and the commands that
    read results (which rebuild confirmations with these functions) start faster without
    it."""
    out = [float(v) for v in values]
    for i, v in enumerate(out):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name}[{i}] must be positive and finite, got {values[i]!r}")
    return out


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _variance(values: Sequence[float]) -> float:
    """The sample variance (``n - 1`` in the denominator) of at least two values."""
    center = _mean(values)
    return math.fsum((v - center) ** 2 for v in values) / (len(values) - 1)


def _log_ratios(base: list[float], other: list[float], sign: float) -> list[float]:
    """The paired log ratios ``sign · log(other_i / base_i)``, oriented so that above 0 is
    better; equal lengths required."""
    if len(base) != len(other):
        raise ValueError(
            f"paired samples need equal lengths, got {len(base)} default and "
            f"{len(other)} candidate values"
        )
    return [sign * math.log(c / b) for b, c in zip(base, other, strict=True)]


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, got {level!r}")


@dataclass(frozen=True)
class RatioInterval:
    """A ratio candidate/default with its confidence interval, oriented so that above 1 is better.

    Attributes:
        ratio: The point estimate (above 1: the candidate is better).
        low: The lower end of the interval.
        high: The upper end of the interval.
        level: The confidence level, e.g. 0.95.
        n: The number of pairs (paired), or the smaller sample size (unpaired).
        paired: Whether the values were paired by round.
        sequential: A confidence sequence (``sequential_ratio_interval``): valid at
            whichever round the measuring stopped, however that round was chosen.
    """

    ratio: float
    low: float
    high: float
    level: float
    n: int
    paired: bool
    sequential: bool = False

    @property
    def significant(self) -> bool:
        """Whether the interval excludes 1.0 (a difference either way)."""
        return self.low > 1.0 or self.high < 1.0

    def __str__(self) -> str:
        if not math.isfinite(self.high):
            return f"{self.ratio:.2f}x (no bound yet after {self.n} rounds)"
        return f"{self.ratio:.2f}x ({self.low:.2f}–{self.high:.2f})"


def ratio_interval(
    default: Sequence[float],
    candidate: Sequence[float],
    *,
    maximize: bool,
    paired: bool = True,
    level: float = 0.95,
) -> RatioInterval | None:
    """How much better ``candidate`` is than ``default``, with a confidence interval.

    Args:
        default: The default's measurements.
        candidate: The candidate's measurements; with ``paired``, ``candidate[i]`` was
            measured in the same round as ``default[i]``.
        maximize: Whether larger values are better (throughput); else smaller (latency).
        paired: Pair the values by round (log-ratio t interval) rather than compare the
            two means (delta method, Welch–Satterthwaite degrees of freedom).
        level: The confidence level.

    Returns:
        The interval, or None with fewer than 2 pairs (paired) or fewer than 2 values on a
        side (unpaired). Without spread the interval collapses to the ratio.

    Raises:
        ValueError: A value is not positive and finite, ``level`` is not in (0, 1), or
            paired samples differ in length.
    """
    base = _positive(default, "default")
    other = _positive(candidate, "candidate")
    _check_level(level)
    sign = 1.0 if maximize else -1.0
    if paired:
        d = _log_ratios(base, other, sign)
        n = len(d)
        if n < 2:
            return None
        center = _mean(d)
        se = math.sqrt(_variance(d)) / math.sqrt(n)
        df = n - 1.0
    else:
        n = min(len(base), len(other))
        if n < 2:
            return None
        mean_base, mean_other = _mean(base), _mean(other)
        center = sign * math.log(mean_other / mean_base)
        var_base = _variance(base) / (len(base) * mean_base**2)
        var_other = _variance(other) / (len(other) * mean_other**2)
        se = math.sqrt(var_base + var_other)
        df = (
            (var_base + var_other) ** 2
            / (var_base**2 / (len(base) - 1) + var_other**2 / (len(other) - 1))
            if se > 0
            else 1.0  # no spread: the half-width is 0 whatever the quantile
        )
    half = t_ppf((1 + level) / 2, df) * se if se > 0 else 0.0
    return RatioInterval(
        ratio=math.exp(center),
        low=math.exp(center - half),
        high=math.exp(center + half),
        level=level,
        n=n,
        paired=paired,
    )


#: The mixture's spread of effect sizes, in units of one round's noise (module doc).
SEQUENTIAL_MIXTURE = 1.0


def sequential_ratio_interval(
    default: Sequence[float],
    candidate: Sequence[float],
    *,
    maximize: bool,
    level: float = 0.95,
    mixture: float = SEQUENTIAL_MIXTURE,
) -> RatioInterval | None:
    """The paired ratio of ``candidate`` to ``default`` with a confidence sequence (module
    doc): the chance that the interval misses the true ratio at *any* round is at most
    ``1 - level``, so the rounds may stop on what the interval says.

    Returns:
        The interval (``sequential``), unbounded (low 0, high infinite) while too few rounds
        bound it, or None with fewer than 2 pairs.

    Raises:
        ValueError: As ``ratio_interval``; ``mixture`` not positive.
    """
    base = _positive(default, "default")
    other = _positive(candidate, "candidate")
    _check_level(level)
    if not (math.isfinite(mixture) and mixture > 0):
        raise ValueError(f"mixture must be positive, got {mixture!r}")
    d = _log_ratios(base, other, 1.0 if maximize else -1.0)
    n = len(d)
    if n < 2:
        return None
    center = _mean(d)
    spread = math.sqrt(sum((x - center) ** 2 for x in d) / n)
    c2 = mixture * mixture
    threshold = math.sqrt((n + c2) / c2) / (1 - level)
    q = (1 - threshold ** (-2 / n)) * (n + c2)
    if n <= q:
        low, high = 0.0, math.inf
    else:
        half = spread * math.sqrt(q / (n - q))
        low, high = math.exp(center - half), math.exp(center + half)
    return RatioInterval(math.exp(center), low, high, level, n, paired=True, sequential=True)


def window_factor(
    run_variance: float,
    window_variance: float,
    windows: int,
    window_s: float,
    overhead_s: float,
    most: int = 4,
) -> int:
    """The ``k`` in 1..``most`` at which ``(b + w / (k W)) · (k · window_s + overhead_s)``
    is least (module doc), the smallest on ties: longer rounds where the noise averages
    within a run and a round's fixed cost is large, more rounds of the same length where
    the noise is between runs.

    Args:
        run_variance: Log variance of a whole measurement, run to run.
        window_variance: Log variance of its windows within a run.
        windows: Windows per measurement.
        window_s: Seconds of a measurement.
        overhead_s: Seconds a run costs besides its measurement.
    """
    if windows < 1 or window_s <= 0 or most < 1:
        raise ValueError("windows, window_s and most must be positive")
    within = max(window_variance, 0.0) / windows
    between = max(run_variance - within, 0.0)
    costs = [
        ((between + within / k) * (k * window_s + max(overhead_s, 0.0)), k)
        for k in range(1, most + 1)
    ]
    return min(costs)[1]


def pooled_log_variance(groups: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """The pooled within-group variance of the log values and its degrees of freedom.

    Noise on systems is multiplicative, so groups with different means share one variance
    on the log scale. Groups with fewer than 2 values carry no information and are skipped.

    Args:
        groups: The repeated measurements of each trial.

    Returns:
        ``(variance, df)`` with ``df = sum(n_i - 1)``, or None when ``df`` is 0.

    Raises:
        ValueError: A value is not positive and finite.
    """
    sum_squares, df = 0.0, 0
    for i, group in enumerate(groups):
        logs = [math.log(v) for v in _positive(group, f"groups[{i}]")]
        if len(logs) >= 2:
            center = _mean(logs)
            sum_squares += math.fsum((v - center) ** 2 for v in logs)
            df += len(logs) - 1
    return (sum_squares / df, df) if df else None


def unstable(
    values: Sequence[float],
    pooled: tuple[float, int] | None,
    *,
    alpha: float = 0.01,
    floor_cov: float = 0.02,
) -> bool:
    """Whether a trial's repeats spread more than the machine's noise explains.

    A one-sided F test on the log scale: the group's sample variance of log values over the
    pooled one, with the pooled variance raised to at least ``log(1 + floor_cov)²`` so that
    a machine with almost no noise does not flag every tiny disagreement, against the
    ``1 - alpha`` quantile of F(n - 1, pooled df).

    Args:
        values: The trial's repeated measurements.
        pooled: ``pooled_log_variance`` of the *other* trials. Pooling the trial itself in
            would let a wild trial inflate its own yardstick; the test also assumes the two
            variances independent.
        alpha: The false-alarm rate for a trial with ordinary noise.
        floor_cov: The smallest noise, as a coefficient of variation, taken as the machine's.

    Returns:
        Whether the trial is unstable; False with fewer than 2 values or no pooled estimate.

    Raises:
        ValueError: A value is not positive and finite.
    """
    logs = [math.log(v) for v in _positive(values, "values")]
    if len(logs) < 2 or pooled is None:
        return False
    pooled_var, pooled_df = pooled
    ratio = _variance(logs) / max(pooled_var, math.log1p(floor_cov) ** 2)
    return ratio > f_ppf(1 - alpha, len(logs) - 1, pooled_df)


@dataclass(frozen=True)
class Drift:
    """The control configuration's measurements over a session: how the machine drifted.

    A factor is a control's value over the reference: 0.5 means the control measured half
    the reference, i.e. for throughput the machine got 2x slower. A quantity that scales
    with machine speed is normalised as ``value / factor_at(t)``.

    Attributes:
        times: When the controls were measured, in increasing order.
        values: The control measurements, in the same order.
        reference: The median of the first min(3, n) controls (1.0 without controls).
    """

    times: tuple[float, ...]
    values: tuple[float, ...]
    reference: float

    @property
    def factors(self) -> tuple[float, ...]:
        """Each control's value over the reference."""
        return tuple(value / self.reference for value in self.values)

    def factor_at(self, t: float) -> float:
        """The machine's speed at time ``t`` relative to the reference.

        Linear between the controls nearest in time, constant beyond the first and last;
        1.0 without controls.
        """
        if not self.times:
            return 1.0
        times, factors = self.times, self.factors
        if t <= times[0]:
            return factors[0]
        if t >= times[-1]:
            return factors[-1]
        i = bisect.bisect_right(times, t)  # times[i - 1] <= t < times[i]
        (t0, t1), (f0, f1) = times[i - 1 : i + 1], factors[i - 1 : i + 1]
        return f0 + (f1 - f0) * (t - t0) / (t1 - t0) if t1 > t0 else f1

    def worst(self, maximize: bool) -> tuple[float, float]:
        """``(time, factor)`` of the control that deviates most from 1 in log terms.

        Of two equal deviations (0.5 and 2.0) the one of a slower machine wins: a factor
        below 1 when maximizing, above 1 when minimizing; then the earlier one.

        Raises:
            ValueError: There are no controls.
        """
        if not self.times:
            raise ValueError("no control measurements")

        def key(item: tuple[float, float]) -> tuple[float, bool]:
            factor = item[1]
            return abs(math.log(factor)), ((factor < 1) if maximize else (factor > 1))

        return max(zip(self.times, self.factors, strict=True), key=key)

    def changed(self, threshold: float = 0.2, window: int = 3) -> bool:
        """Whether the controls moved away from the reference by more than ``threshold``:
        the median of some ``window`` consecutive controls (all of them, when fewer)
        deviates by more, on the log scale (``|log m| > log(1 + threshold)``, so 1.2 and
        1 / 1.2 both sit on the threshold). A median, so that one noisy control is not a
        changed machine: a change must last ``window // 2 + 1`` controls to count.
        """
        factors = self.factors
        if not factors:
            return False
        width = min(window, len(factors))
        medians = (
            statistics.median(factors[i : i + width]) for i in range(len(factors) - width + 1)
        )
        return any(abs(math.log(m)) > math.log1p(threshold) for m in medians)


def drift(times: Sequence[float], values: Sequence[float]) -> Drift:
    """The drift of the control measurements ``values`` taken at ``times`` (any order).

    Raises:
        ValueError: The lengths differ, a time is not finite, or a value is not positive
            and finite.
    """
    if len(times) != len(values):
        raise ValueError(f"got {len(times)} times and {len(values)} values")
    array = _positive(values, "values")
    for i, t in enumerate(times):
        if not math.isfinite(t):
            raise ValueError(f"times[{i}] must be finite, got {t!r}")
    order = sorted(range(len(times)), key=lambda i: float(times[i]))  # stable
    ordered = [array[i] for i in order]
    reference = float(statistics.median(ordered[:3])) if ordered else 1.0
    return Drift(
        times=tuple(float(times[i]) for i in order),
        values=tuple(float(v) for v in ordered),
        reference=reference,
    )
