"""Ranking measured configurations by the objective GP: its posterior mean, its outlier test."""

from __future__ import annotations

import math

from tuner.designer.models.posterior_best import (
    MAX_FITTED,
    fitted,
    outliers,
    posterior_means,
    rank_by_posterior,
    rank_screened,
)
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

SPEC = StudySpec.from_dict(
    {
        "name": "p",
        "knobs": [{"name": "x", "kind": "float", "low": 0.0, "high": 1.0}],
        "objectives": [{"name": "tps", "goal": "maximize"}],
    }
)


def trial(id_: int, x: float, tps: float, repeats: int = 1, spread: float = 0.0) -> Trial:
    return Trial(
        id_, {"x": x}, TrialStatus.COMPLETED, {"tps": tps}, repeats=repeats,
        spread={"tps": spread} if repeats > 1 else {},
    )  # fmt: skip


def history() -> list[Trial]:
    """A flat system near 100 with a rise toward x = 0.8 (measured three times there) and
    one lucky single measurement at x = 0.5 whose neighbours measured the plain 100."""
    values = {0.0: 99.0, 0.1: 101.0, 0.2: 100.0, 0.3: 98.0, 0.4: 100.0, 0.45: 101.0,
              0.55: 99.0, 0.65: 104.0, 0.7: 110.0, 0.9: 112.0, 1.0: 101.0}  # fmt: skip
    trials = [trial(i + 1, x, v) for i, (x, v) in enumerate(values.items())]
    return [*trials, trial(20, 0.5, 140.0), trial(21, 0.8, 121.0, repeats=3, spread=2.0)]


def test_a_lucky_single_measurement_ranks_below_a_well_measured_configuration() -> None:
    trials = history()
    lucky, steady = trials[-2], trials[-1]
    assert lucky.metrics["tps"] > steady.metrics["tps"]
    means = posterior_means(SPEC, trials)
    assert means is not None
    assert means[lucky.id] < lucky.metrics["tps"] - 10  # shrunk toward its neighbours
    assert max(means, key=means.__getitem__) == steady.id
    assert rank_by_posterior(SPEC, trials, [lucky, steady])[0] is steady


def test_too_few_trials_rank_by_their_measured_means() -> None:
    trials = [trial(1, 0.1, 100.0), trial(2, 0.5, 140.0), trial(3, 0.8, 120.0)]
    assert posterior_means(SPEC, trials) is None
    assert [t.id for t in rank_by_posterior(SPEC, trials, trials)] == [2, 3, 1]
    minimize = StudySpec.from_dict({**SPEC.to_dict(), "objectives": [
        {"name": "tps", "goal": "minimize"}]}, knobs=SPEC.space.knobs)  # fmt: skip
    assert [t.id for t in rank_by_posterior(minimize, trials, trials)] == [1, 3, 2]


def test_a_long_study_is_ranked_by_a_gp_on_its_best_and_a_spread_of_the_rest() -> None:
    """Beyond MAX_FITTED trials the fit takes the best half and an even spread of the
    others; every measured trial is still ranked, and the best stays first."""
    n = MAX_FITTED * 3
    trials = [trial(i + 1, i / n, 100.0 + 30.0 * math.sin(7.0 * i / n)) for i in range(n)]
    chosen = fitted(SPEC, trials)
    assert len(chosen) == MAX_FITTED and len({t.id for t in chosen}) == MAX_FITTED
    assert [t.id for t in chosen] == sorted(t.id for t in chosen)
    by_value = sorted(trials, key=lambda t: -t.metrics["tps"])
    assert {t.id for t in by_value[: MAX_FITTED // 2]} <= {t.id for t in chosen}
    rest = [t.id for t in chosen if t.id not in {u.id for u in by_value[: MAX_FITTED // 2]}]
    assert rest[0] < n // 10 and rest[-1] > n - n // 10  # spread over the whole study
    assert fitted(SPEC, trials[:MAX_FITTED]) == tuple(trials[:MAX_FITTED])
    means = posterior_means(SPEC, trials)
    assert means is not None and len(means) == n
    best = max(means, key=means.__getitem__)
    assert abs(trials[best - 1].metrics["tps"] - by_value[0].metrics["tps"]) < 1.0


def test_a_lone_lucky_sample_is_set_aside_and_the_rest_keep_their_measured_order() -> None:
    """The spike at x = 0.5 (140 among neighbours at 100) is an outlier; the steady rise to
    x = 0.8, measured three times, is never one; the best left is the best measured."""
    trials = history()
    lucky, steady = trials[-2], trials[-1]
    assert outliers(SPEC, trials) == {lucky.id}
    ranking = rank_screened(SPEC, trials, trials)
    assert ranking[0] is steady and ranking[-1] is lucky
    rest = [t.metrics["tps"] for t in ranking[:-1]]
    assert rest == sorted(rest, reverse=True)
    minimize = StudySpec.from_dict({**SPEC.to_dict(), "objectives": [
        {"name": "tps", "goal": "minimize"}]}, knobs=SPEC.space.knobs)  # fmt: skip
    assert lucky.id not in outliers(minimize, trials)  # too high is not lucky when minimizing


def test_a_smooth_surface_without_noise_has_no_outliers() -> None:
    """On a deterministic smooth surface the best measurement stays the best."""
    trials = [trial(i + 1, i / 19, 100.0 + 30.0 * math.sin(3.0 * i / 19)) for i in range(20)]
    assert outliers(SPEC, trials) == set()
    best = max(trials, key=lambda t: t.metrics["tps"])
    assert rank_screened(SPEC, trials, trials)[0] is best


def test_too_few_trials_have_no_outlier_test() -> None:
    trials = [trial(1, 0.1, 100.0), trial(2, 0.5, 140.0), trial(3, 0.8, 120.0)]
    assert outliers(SPEC, trials) == set()
    assert [t.id for t in rank_screened(SPEC, trials, trials)] == [2, 3, 1]
