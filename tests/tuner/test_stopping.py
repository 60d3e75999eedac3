"""The early-stopping rule (``tuner.stopping``): one test per stop rule that fails when it
stops a trial that would have won, and the rule's settings."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from tuner.errors import ValidationError
from tuner.stopping import bound, screen_reason, stop_reason
from tuner.study import StoppingSettings, StudySpec
from tuner.trial import StepKind, Trial, TrialStatus

ON = StoppingSettings(early_stop=True)


def _spec(**extra: Any) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "s",
            "knobs": [{"name": "x", "kind": "float", "low": 0, "high": 1, "default": 0}],
            "objectives": [{"name": "tps", "goal": "maximize"}],
            "outcome_constraints": ["p95_ms <= 5"],
            "stopping": {"early_stop": True},
            **extra,
        }
    )


INCUMBENT = Trial(3, {"x": 0.5}, TrialStatus.COMPLETED, {"tps": 1000.0, "p95_ms": 4.0})


def _windows(tps: list[float], p95: float | list[float] = 3.0) -> list[dict[str, float]]:
    p95s = p95 if isinstance(p95, list) else [p95] * len(tps)
    return [{"tps": a, "p95_ms": b} for a, b in zip(tps, p95s, strict=True)]


def test_a_trial_clearly_worse_than_the_incumbent_is_stopped() -> None:
    windows = _windows([600, 610, 590, 605, 598, 602])
    reason = stop_reason(_spec(), windows, INCUMBENT, {"tps": (0.05**2, 20)})
    assert "tps cannot beat trial 3's 1000" in reason and "6 windows" in reason


def test_a_slow_warm_up_does_not_stop_a_trial_that_ends_ahead() -> None:
    """The first windows are half as fast (a cold cache); the later ones beat the
    incumbent: judged on the later half, the trial goes on (it would have won)."""
    windows = _windows([450, 500, 560, 1080, 1100, 1090, 1110, 1095])
    assert stop_reason(_spec(), windows, INCUMBENT, {"tps": (0.05**2, 20)}) == ""


def test_a_constraint_broken_by_far_stops_the_trial() -> None:
    windows = _windows([1500] * 6, p95=[21.0, 19.5, 22.0, 20.5, 21.5, 20.0])
    reason = stop_reason(_spec(), windows, INCUMBENT, {"p95_ms": (0.1**2, 10)})
    assert "p95_ms cannot meet p95_ms <= 5" in reason
    # without a measured run-to-run noise the windows of one run cannot tell
    assert stop_reason(_spec(), windows, INCUMBENT, {}) == ""


def test_a_latency_spike_while_warming_up_does_not_stop_a_trial_that_meets_the_bound() -> None:
    windows = _windows([1500] * 8, p95=[30.0, 25.0, 12.0, 4.1, 3.9, 4.2, 4.0, 4.1])
    assert stop_reason(_spec(), windows, INCUMBENT, {"p95_ms": (0.1**2, 10)}) == ""


def test_nothing_is_judged_before_min_windows_or_without_a_log_scale() -> None:
    noise = {"tps": (0.01, 20)}
    windows = _windows([100.0, 100.0, 100.0])
    assert stop_reason(_spec(), windows, INCUMBENT, noise) == ""  # 3 < min_windows = 4
    zero = _windows([0.0, 100.0, 100.0, 100.0, 100.0, 100.0])
    assert stop_reason(_spec(), zero, INCUMBENT, noise) == ""  # tps is not positive


def test_without_an_incumbent_only_constraints_stop() -> None:
    windows = _windows([10.0] * 6)
    assert stop_reason(_spec(), windows, None, {"tps": (0.01, 20)}) == ""


def _would_have_won(
    rng: random.Random, margin: float, window_cov: float, run_cov: float, windows: int
) -> tuple[list[dict[str, float]], float]:
    """One trial whose true value is the incumbent's times ``margin``; this run is off by
    the run-to-run noise, each window by the window noise."""
    run = 1000.0 * margin * math.exp(rng.gauss(0.0, run_cov))
    tps = [run * math.exp(rng.gauss(0.0, window_cov)) for _ in range(windows)]
    return _windows(tps), run


@pytest.mark.parametrize("confidence", [0.95, 0.99])
def test_trials_that_would_have_won_are_stopped_at_most_at_the_stated_rate(
    confidence: float,
) -> None:
    """400 trials 2 % better than the incumbent, 10 % window noise, 5 % run-to-run noise
    (known from 20 degrees of freedom): the rule may stop at most ``1 - confidence`` of them
    (a binomial allowance of three standard errors on top), judged at every window."""
    rng = random.Random(7)
    settings = StoppingSettings(early_stop=True, confidence=confidence)
    noise = {"tps": (0.05**2, 20), "p95_ms": (0.05**2, 20)}
    stopped = 0
    trials = 400
    for _ in range(trials):
        windows, _ = _would_have_won(rng, 1.02, 0.10, 0.05, 12)
        if any(stop_reason(_spec(), windows[:k], INCUMBENT, noise, settings) for k in range(4, 13)):
            stopped += 1
    allowed = (1 - confidence) * trials + 3 * math.sqrt(trials * confidence * (1 - confidence))
    assert stopped <= allowed, f"stopped {stopped} of {trials} trials that would have won"


def test_trials_far_behind_are_stopped_most_of_the_time() -> None:
    """The other side: 200 trials 40 % worse than the incumbent under the same noise are
    mostly stopped by their eighth window of twelve (the rule saves time, not only risk)."""
    rng = random.Random(8)
    noise = {"tps": (0.05**2, 20)}
    trials = [_would_have_won(rng, 0.6, 0.10, 0.05, 12)[0] for _ in range(200)]
    stopped = sum(
        any(stop_reason(_spec(), windows[:k], INCUMBENT, noise) for k in range(4, 9))
        for windows in trials
    )
    assert stopped >= 180


def test_the_bound_widens_with_the_run_to_run_noise() -> None:
    values = [100.0, 101.0, 99.0, 100.5, 99.5, 100.0]
    alone = bound(values, None, 0.99)
    noisy = bound(values, (0.1**2, 10), 0.99)
    assert alone is not None and noisy is not None
    assert noisy.low < alone.low < 100 < alone.high < noisy.high
    assert alone.windows == 3


def test_settings_name_the_field_and_keep_old_fingerprints() -> None:
    with pytest.raises(ValidationError, match=r"stopping\.confidence.*\[0\.9, 0\.9999\]"):
        StoppingSettings(confidence=0.5)
    with pytest.raises(ValidationError, match=r"stopping\.min_windows"):
        StoppingSettings(min_windows=2)
    with pytest.raises(ValidationError, match=r"stopping\.patience.*unknown setting"):
        _spec(stopping={"patience": 3})
    plain = _spec(stopping={})
    assert "stopping" not in plain.to_dict()
    stopping = _spec()
    assert stopping.to_dict()["stopping"]["early_stop"] is True
    assert StudySpec.from_dict(stopping.to_dict()).fingerprint() == stopping.fingerprint()
    assert plain.fingerprint() != stopping.fingerprint()


def test_an_early_stopped_trial_is_measured_and_final_but_never_feasible() -> None:
    from tuner.trial import is_feasible

    trial = Trial(4, {"x": 0.1}, TrialStatus.EARLY_STOPPED, {"tps": 500.0, "p95_ms": 3.0},
                  reason="stopped early", step=StepKind.SOBOL)  # fmt: skip
    assert trial.status.is_final and trial.status.measured
    assert not is_feasible(_spec(), trial)
    assert TrialStatus.ACTIVE.can_become(TrialStatus.EARLY_STOPPED)


# -- screening ---------------------------------------------------------------------------
SCREEN = _spec(stopping={"screen_windows": 3})


def _first(tps: float, p95: float = 3.0) -> dict[str, float]:
    return {"tps": tps, "p95_ms": p95}


def test_a_screen_lets_the_best_third_go_on_and_names_the_rank_of_the_others() -> None:
    others = [_first(v) for v in (900, 800, 700, 600, 500)]
    assert screen_reason(SCREEN, _first(950), others, None) == ""  # 1st of 6
    assert screen_reason(SCREEN, _first(850), others, None) == ""  # 2nd: the best 2 go on
    reason = screen_reason(SCREEN, _first(650), others, None)
    assert reason == (
        "screened out after 3 windows: tps 650 ranks 4 of 6 trials' first windows "
        "(the best 2 go on)"
    )
    broken = screen_reason(SCREEN, _first(990, p95=9.0), others, None)
    assert "ranks 6 of 6" in broken  # breaking the SLO ranks it last, however fast


def test_a_screen_waits_for_enough_trials_and_never_stops_one_ahead_of_the_best() -> None:
    assert screen_reason(SCREEN, _first(100), [_first(900), _first(800)], None) == ""
    others = [_first(v) for v in (990, 980, 970, 960, 950)]
    # the incumbent's first windows measured 600: a trial ahead of it goes on, whatever
    # the others' first windows said
    assert screen_reason(SCREEN, _first(610), others, _first(600)) == ""
    assert screen_reason(SCREEN, _first(590), others, _first(600)) != ""


def test_screening_never_stops_a_trial_that_would_have_become_the_best() -> None:
    """200 simulated studies of 20 trials: true values spread over 2x, 10 % window noise,
    5 % run-to-run noise, every trial warming up alike (its first window 30 % slow). A
    trial that would have become the best (its full measurement ahead of every earlier
    one's) is screened out after 3 of 12 windows in at most 5 % of the cases."""
    rng = random.Random(11)
    would_win = screened = 0
    for _ in range(200):
        firsts: list[dict[str, float]] = []
        best_full = -math.inf
        best_first: dict[str, float] | None = None
        for _ in range(20):
            true = rng.uniform(500, 1000) * math.exp(rng.gauss(0.0, 0.05))
            windows = [true * math.exp(rng.gauss(0.0, 0.10)) * (0.7 if i == 0 else 1.0)
                       for i in range(12)]  # fmt: skip
            first = _first(sum(windows[:3]) / 3)
            full = sum(windows) / 12
            out = screen_reason(SCREEN, first, firsts, best_first) != ""
            if full > best_full:
                would_win += 1
                screened += out
            firsts.append(first)
            if not out and full > best_full:
                best_full, best_first = full, first
    assert would_win > 500
    assert screened <= 0.05 * would_win, f"{screened} of {would_win} would-be best screened out"


def test_decide_screens_once_at_the_screen_window_and_the_default_never() -> None:
    from tuner.stopping import decide
    from tuner.trial import Measurement, MeasurementKind

    def windows(trial_id: int, values: list[float]) -> list[Measurement]:
        return [Measurement(_first(v), MeasurementKind.PROGRESS, round=i + 1,
                            trial_id=trial_id) for i, v in enumerate(values)]  # fmt: skip

    default = Trial(1, {"x": 0.0}, TrialStatus.COMPLETED, _first(1000), step=StepKind.DEFAULT)
    done = [Trial(i, {"x": i / 10}, TrialStatus.COMPLETED, _first(900 - 10 * i),
                  step=StepKind.SOBOL) for i in range(2, 6)]  # fmt: skip
    measured = [m for t in [default, *done] for m in windows(t.id, [t.metrics["tps"]] * 4)]
    slow = Trial(6, {"x": 0.9}, TrialStatus.ACTIVE, step=StepKind.GLOBAL)
    for count, stops in ((2, False), (3, True), (4, False)):
        seen = [*measured, *windows(6, [300.0] * count)]
        assert decide(SCREEN, slow, [default, *done, slow], seen).stop is stops, count
    first = Trial(1, {"x": 0.0}, TrialStatus.ACTIVE, step=StepKind.DEFAULT)
    assert not decide(SCREEN, first, [first], windows(1, [1.0] * 3)).stop
