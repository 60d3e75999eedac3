"""The LlamaTune designer: default first, then BO/Sobol in the embedding, projected back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from tuner.designer import BODesigner, Suggestion, make_designer
from tuner.designer.acquisition.criteria import OptimizerSettings
from tuner.designer.base import History
from tuner.designer.models.model import FitCache
from tuner.designer.steps.bo import _box_region
from tuner.designer.steps.embedded import EmbeddedDesigner, grown_level
from tuner.designer.strategy import (
    LOCAL,
    TREND,
    GlobalStep,
    LocalStep,
    trend_probe_open,
    trust_region_length,
)
from tuner.errors import StateError
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, TrialStatus

FAST = OptimizerSettings(num_restarts=2, raw_samples=64, maxiter=30)
# 20 knobs of which two matter: the many-knob situation LlamaTune is for
KNOBS: list[dict[str, Any]] = [
    {"name": f"k{i:02d}", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5}
    for i in range(18)
] + [
    {"name": "mode", "kind": "categorical", "choices": ["a", "b", "c"], "default": "a"},
    {"name": "off", "kind": "int", "low": 0, "high": 1000, "special_values": [0], "default": 0},
]


def make_spec(
    knobs: list[dict[str, Any]] | None = None,
    constraints: Sequence[str] = (),
    outcome: Sequence[str] = (),
    dims: int = 4,
    grow_after: int = 10,
    **designer: Any,
) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "llama",
            "knobs": knobs or KNOBS,
            "objectives": [{"name": "y", "goal": "maximize"}],
            "outcome_constraints": list(outcome),
            "parameter_constraints": list(constraints),
            "designer": {"initial_trials": 5, "seed": 3, **designer},
            "embedding": {"kind": "llamatune", "dims": dims, "grow_after": grow_after},
        }
    )


def y_of(config: dict[str, Any]) -> float:
    return (
        -((config["k00"] - 0.8) ** 2) - (config["k01"] - 0.2) ** 2 + 0.1 * (config["mode"] == "b")
    )


def completed(id_: int, s: Suggestion, **metrics: float) -> Trial:
    values = metrics or {"y": y_of(s.config)}
    return Trial(
        id_,
        s.config,
        TrialStatus.COMPLETED,
        values,
        source=s.step.value,
        step=s.step,
        embedded=s.embedded,
    )


def run(designer: EmbeddedDesigner, n: int, **extra: Any) -> list[Trial]:
    trials: list[Trial] = []
    for _ in range(n):
        (s,) = designer.suggest(1, trials, [])
        metrics = {"y": y_of(s.config), **{k: f(s.config) for k, f in extra.items()}}
        trials.append(completed(len(trials) + 1, s, **metrics))
    return trials


@pytest.fixture(scope="module")
def study_run() -> list[Trial]:
    return run(EmbeddedDesigner(make_spec(), settings=FAST), 14)


def test_make_designer_uses_the_embedding() -> None:
    assert isinstance(make_designer(make_spec()), EmbeddedDesigner)
    assert isinstance(make_designer(make_spec(algorithm="sobol")), EmbeddedDesigner)


def test_default_first_outside_the_embedding_then_projected_points(
    study_run: list[Trial],
) -> None:
    spec = make_spec()
    designer = EmbeddedDesigner(spec)
    first = study_run[0]
    assert first.step is StepKind.DEFAULT and first.embedded == ()
    assert first.config == spec.space.default_config()
    assert [t.step for t in study_run[1:6]] == [StepKind.SOBOL] * 5
    assert all(t.step.model_based for t in study_run[6:])
    for trial in study_run[1:]:
        assert len(trial.embedded) == 4 and all(-1.0 <= v <= 1.0 for v in trial.embedded)
        assert designer.embedding.bucketize(trial.embedded) == trial.embedded
        assert designer.embedding.project(trial.embedded) == trial.config


def test_bo_in_the_embedding_improves_on_the_initial_design(study_run: list[Trial]) -> None:
    initial = max(t.metrics["y"] for t in study_run[:6])
    assert max(t.metrics["y"] for t in study_run[6:]) > initial


def test_same_history_gives_the_same_suggestions_after_a_restart(
    study_run: list[Trial],
) -> None:
    history = study_run[:9]
    one = EmbeddedDesigner(make_spec(), settings=FAST).suggest(2, history, [])
    two = EmbeddedDesigner(make_spec(), settings=FAST).suggest(2, history, [])
    assert one == two and len(one) == 2


def test_pending_points_make_parallel_suggestions_differ(study_run: list[Trial]) -> None:
    designer = EmbeddedDesigner(make_spec(), settings=FAST)
    batch = designer.suggest(3, study_run[:8], [])
    assert len({s.embedded for s in batch}) == 3
    assert len({tuple(sorted(s.config.items())) for s in batch}) == 3
    pending = [Trial(100, batch[0].config, TrialStatus.ACTIVE, embedded=batch[0].embedded)]
    (alone,) = designer.suggest(1, study_run[:8], pending)
    assert alone.config != batch[0].config


def test_linear_constraints_on_the_original_knobs_hold_for_every_suggestion() -> None:
    spec = make_spec(constraints=["k00 + k01 <= 0.6", "k02 - k03 >= 0.1"])
    trials = run(EmbeddedDesigner(spec, settings=FAST), 9)
    for trial in trials[1:]:  # the default breaks the second one and is skipped
        assert trial.config["k00"] + trial.config["k01"] <= 0.6 + 1e-9
        assert trial.config["k02"] - trial.config["k03"] >= 0.1 - 1e-9
    assert trials[0].step is not StepKind.DEFAULT


def test_outcome_constraints_reach_the_inner_model() -> None:
    spec = make_spec(outcome=["cost <= 0.5"])
    designer = EmbeddedDesigner(spec, settings=FAST)
    assert designer.low_spec.outcome_constraints == spec.outcome_constraints
    trials = run(designer, 8, cost=lambda c: c["k02"])
    assert trials[-1].step.model_based


def test_trials_without_a_point_are_taken_but_not_modelled(study_run: list[Trial]) -> None:
    designer = EmbeddedDesigner(make_spec(), settings=FAST)
    imported = Trial(99, study_run[3].config, TrialStatus.COMPLETED, {"y": 5.0}, source="user")
    assert designer.low_trial(imported) is None
    assert designer.low_trial(study_run[3]) is not None
    suggestions = designer.suggest(2, [*study_run[:8], imported], [])
    assert all(s.config != imported.config for s in suggestions)


def test_choice_only_space_never_repeats_and_reports_exhaustion() -> None:
    bools = [{"name": f"b{i}", "kind": "bool", "default": False} for i in range(4)]
    designer = EmbeddedDesigner(make_spec(bools, dims=1, algorithm="sobol"))
    trials: list[Trial] = []
    seen = set()
    with pytest.raises(StateError, match="exhausted"):
        for _ in range(10):
            (s,) = designer.suggest(1, trials, [])
            key = tuple(sorted(s.config.items()))
            assert key not in seen
            seen.add(key)
            trials.append(completed(len(trials) + 1, s, y=0.0))
    # one coordinate drives 4 bools: the default plus the two sign patterns it can express
    assert len(seen) == 3


def test_points_projecting_onto_measured_configurations_teach_the_model() -> None:
    """Small integer knobs: whole runs of buckets share one projection. The designer must
    turn such repeats into known observations and ask again, not fall back to random."""
    ints = [{"name": f"n{i}", "kind": "int", "low": 0, "high": 6, "default": 0} for i in range(4)]
    spec = make_spec(ints, dims=2)
    designer = EmbeddedDesigner(spec, settings=FAST)
    trials: list[Trial] = []
    for _ in range(16):
        (s,) = designer.suggest(1, trials, [])
        value = -sum((int(v) - 4) ** 2 for v in s.config.values())
        trials.append(completed(len(trials) + 1, s, y=float(value)))
    keys = [tuple(sorted(t.config.items())) for t in trials]
    assert len(set(keys)) == len(keys)
    steps = [t.step for t in trials]
    assert sum(s.model_based for s in steps) >= 8, steps


# -- growing the embedding and the trust region ------------------------------------------


def trial_with(id_: int, y: float | None, status: TrialStatus = TrialStatus.COMPLETED) -> Trial:
    return Trial(id_, {}, status, {} if y is None else {"y": y})


def test_the_level_rises_after_grow_after_trials_without_progress() -> None:
    spec = make_spec(grow_after=3)  # maximize y; design: default + 5 points, counted as 6
    design = [trial_with(i, float(i)) for i in range(1, 7)]
    assert grown_level(spec, design, top=3) == 0
    stalled = [trial_with(i, 1.0) for i in range(7, 10)]
    assert grown_level(spec, design + stalled, top=3) == 1
    assert grown_level(spec, design + stalled[:2], top=3) == 0
    # a significant improvement restarts the count; a tiny one does not
    tiny = [trial_with(7, 1.0), trial_with(8, 6.0001), trial_with(9, 1.0)]
    assert grown_level(spec, design + tiny, top=3) == 1
    better = [trial_with(7, 1.0), trial_with(8, 9.0), trial_with(9, 1.0)]
    assert grown_level(spec, design + better, top=3) == 0
    # infeasible and failed-to-measure trials are no progress either; the level stops at top
    many = [trial_with(i, None, TrialStatus.INFEASIBLE) for i in range(7, 40)]
    assert grown_level(spec, design + many, top=2) == 2
    assert grown_level(make_spec(grow_after=0), design + many, top=2) == 0


def test_a_stalled_designer_grows_and_keeps_every_point_it_measured() -> None:
    spec = make_spec(dims=4, grow_after=2)  # 20 knobs: levels of 4, 8, 16, 20 coordinates
    designer = EmbeddedDesigner(spec, settings=FAST)
    trials: list[Trial] = []
    for _ in range(12):
        (s,) = designer.suggest(1, trials, [])
        trials.append(completed(len(trials) + 1, s, y=0.0))  # never any progress
    sizes = [len(t.embedded) for t in trials]
    assert sizes == [0] + [4] * 7 + [8, 8, 16, 16], sizes
    top = designer.stage(3)
    for trial in trials[1:]:
        low = designer.low_trial(trial, designer.stage(2))
        assert low is not None and len(low.embedded) == 16
        assert top.embedding.project(top.embedding.lift(trial.embedded)) == trial.config
    # the same history, a new designer (a restarted server): the same suggestion
    again = EmbeddedDesigner(spec, settings=FAST).suggest(1, trials, [])
    assert again == designer.suggest(1, trials, []) and len(again[0].embedded) == 20


def test_trust_region_halves_after_failures_and_starts_again() -> None:
    spec = make_spec()
    design = [trial_with(i, float(i)) for i in range(1, 4)]
    assert trust_region_length(spec, design, skip=3) == LOCAL.length
    fails = [trial_with(i, 0.0) for i in range(4, 4 + LOCAL.patience)]
    assert trust_region_length(spec, design + fails, skip=3) == LOCAL.length / 2
    assert trust_region_length(spec, design + fails[:-1], skip=3) == LOCAL.length
    # the design's own non-improvements count nothing
    assert trust_region_length(spec, design[::-1], skip=3) == LOCAL.length
    success = [trial_with(10, 50.0)]
    assert trust_region_length(spec, design + fails + success, skip=3) == LOCAL.length
    cycle = LOCAL.patience * (LOCAL.halvings + 1)
    long = [trial_with(i, 0.0) for i in range(4, 4 + cycle)]
    assert trust_region_length(spec, design + long[:-1], skip=3) == LOCAL.length / 2**LOCAL.halvings
    assert trust_region_length(spec, design + long, skip=3) == LOCAL.length


def test_trust_region_box_follows_the_lengthscales_and_stays_in_the_unit_box() -> None:
    box = _box_region([0.5, 0.5, 0.95], 0.4, [0.1, 1.0, 10.0])
    widths = [high - low for low, high in zip(box.lows, box.highs, strict=True)]
    assert widths[0] < widths[1] and box.lows[0] < 0.5 < box.highs[0]
    assert box.highs[2] == 1.0 and box.lows[2] == 0.0  # clipped at both ends
    plain = _box_region([0.5, 0.5], 0.4, None)
    assert plain.lows == pytest.approx((0.3, 0.3)) and plain.highs == pytest.approx((0.7, 0.7))


def test_half_of_the_inner_designers_steps_are_local() -> None:
    """After the design, every second model-based suggestion of the inner designer comes
    from the trust region: within its box around the best trial."""
    spec = make_spec()
    designer = EmbeddedDesigner(spec, settings=FAST)
    trials = run(designer, 6)  # default + 5 design points
    inner = designer.stage(0).inner
    assert isinstance(inner, BODesigner) and inner.trust_region
    low = [t for t in (designer.low_trial(t) for t in trials) if t is not None]
    history = History.build(inner.encoder, low, [])
    # the first model-based step is global, the second local: in one call or after the first
    assert [type(s) for s in inner.plan(history, 2)] == [GlobalStep, LocalStep]
    (first,) = inner.suggest(1, low, [])
    assert first.step is StepKind.GLOBAL
    done = replace(low[-1], id=100, config=first.config, step=first.step, metrics={"y": -9.0})
    assert [type(s) for s in inner.plan(History.build(inner.encoder, [*low, done], []), 1)] == [
        LocalStep
    ]
    (second,) = inner.suggest(1, [*low, done], [])
    best = max(low, key=lambda t: t.metrics["y"])
    center = inner.encoder.encode(best.config)
    point = inner.encoder.encode(second.config)
    assert second.step is StepKind.LOCAL
    assert all(
        abs(p - c) <= LOCAL.length / 2 * 4 + 1e-9 for p, c in zip(point, center, strict=True)
    )


def _scored(sources_values: list[tuple[StepKind, float | None]], goal: str = "maximize") -> bool:
    spec = make_spec() if goal == "maximize" else StudySpec.from_dict(
        {**make_spec().to_dict(), "objectives": [{"name": "y", "goal": goal}]}
    )  # fmt: skip
    trials = [
        Trial(i + 1, {}, TrialStatus.COMPLETED if v is not None else TrialStatus.INFEASIBLE,
              {"y": v} if v is not None else {}, step=src)
        for i, (src, v) in enumerate(sources_values)
    ]  # fmt: skip
    return trend_probe_open(spec, trials)


def test_the_trend_probe_goes_on_while_its_steps_beat_most_earlier_trials() -> None:
    """Six trend steps are scored before the probe is judged, then it stays open while they
    beat 40 % of the earlier trials on average (TrendStep.probe, TrendStep.keep)."""
    assert (TREND.probe, TREND.keep) == (6, 0.4)
    sobol, bo, fill = StepKind.SOBOL, StepKind.TREND, StepKind.FILL_IN
    design = [(sobol, float(v)) for v in (3, 1, 4, 1, 5, 9, 2, 6)]
    assert _scored(design)  # no model-based step yet: the probe is open
    good = [(bo, v) for v in (7.0, 8.0, 0.5, 10.0, 0.0, 0.2)]  # 7/8 8/9 0 11/11 0 1/13
    assert _scored(design + good)  # mean 0.47
    poor = [(bo, v) for v in (0.0, 1.5, 2.5, 20.0, 0.1, 0.3)]  # 0 3/9 5/10 11/11 1/12 2/13
    assert _scored(design + poor[:5])  # five scored steps: not judged yet
    assert not _scored(design + poor)  # mean 0.35 < 0.4: closed
    later = [(bo, 50.0), (fill, 60.0), (StepKind.LOCAL, 70.0)]
    assert not _scored(design + poor + later)  # once closed, closed: later steps were flat
    broken = [(bo, None)] * 4 + [(bo, 8.0), (bo, 9.5)]  # 0 0 0 0 7/8 9/9: mean 0.31
    assert not _scored(design + broken)  # a step that broke the system scores 0
    assert _scored(design + [(bo, 6.5)] * 4 + broken[4:])  # the same steps, measured
    assert _scored(design + good + [(fill, -5.0), (bo, 8.5)])  # fill-ins are not steps
    # minimize: beating a trial means a lower value
    mirror = [(s, -v) for s, v in design + good]
    assert _scored(mirror, goal="minimize")
    assert not _scored([(s, -v) for s, v in design + poor], goal="minimize")


def _narrow_run(n: int, cache: FitCache | None = None) -> tuple[EmbeddedDesigner, list[Trial]]:
    """``n`` trials of 6 knobs in 4 dimensions (a narrow embedding), maximizing the sum of the
    four float knobs: a landscape whose best lies on a face of the box."""
    knobs = [dict(k, name=f"n{i}") for i, k in enumerate(KNOBS[:4])] + KNOBS[18:]
    designer = EmbeddedDesigner(make_spec(knobs=knobs), cache, settings=FAST)
    trials: list[Trial] = []
    for _ in range(n):
        (s,) = designer.suggest(1, trials, [])
        score = sum(float(v) for k, v in s.config.items() if k.startswith("n"))
        trials.append(completed(len(trials) + 1, s, y=score))
    return designer, trials


def test_a_narrow_embedding_probes_a_trend_and_a_wide_one_does_not() -> None:
    """At most two knobs per coordinate (6 knobs in 4): the inner designer's first model-based
    steps fit GPs with a linear prior mean (cached under their own scope) and are global even
    on a trust region's turn; a wide embedding (20 knobs in 4) never probes."""
    cache = FitCache()
    narrow, trials = _narrow_run(9, cache)  # default, 5 design points, 3 model-based
    wide = EmbeddedDesigner(make_spec(), settings=FAST)
    inner = narrow.stage(0).inner
    assert isinstance(inner, BODesigner) and inner.trend_probe
    assert not wide.stage(0).inner.trend_probe  # type: ignore[attr-defined]
    assert [t.step for t in trials[6:]] == [StepKind.TREND] * 3
    assert cache.get(("llama:trend", "y"), 4) is not None and cache.get(("llama", "y"), 4) is None
    low = [t for t in (narrow.low_trial(t) for t in trials) if t is not None]
    history = History.build(inner.encoder, low, [])
    assert inner.plan(history, 2) == [TREND, TREND]  # global even on a trust region's turn
    closed = [*low[:5], *(replace(t, metrics={"y": -1.0}) for t in low[5:])]
    closed += [replace(low[-1], id=100 + i, metrics={"y": -1.0}) for i in range(4)]
    assert [type(s) for s in inner.plan(History.build(inner.encoder, closed, []), 2)] == [
        LocalStep,  # 9 model steps so far: the next is odd
        GlobalStep,
    ]


def test_trend_steps_are_global_until_a_random_fill_in() -> None:
    """A trend step is global until the history holds a fill-in (plateaus): then every second
    step is a Thompson step in the trust region, still on the trend's mean."""
    narrow, trials = _narrow_run(7)  # default, 5 design points, 1 model-based
    inner = narrow.stage(0).inner
    assert isinstance(inner, BODesigner)
    low = [t for t in (narrow.low_trial(t) for t in trials) if t is not None]
    assert inner.plan(History.build(inner.encoder, low, []), 1) == [TREND]  # odd, but global
    fill = replace(low[-1], id=20, step=StepKind.FILL_IN, metrics={"y": -5.0})
    again = replace(low[-1], id=21, step=StepKind.TREND, metrics={"y": -6.0})
    filled = [*low, fill, again]  # the next model step is odd again, and a fill-in exists
    assert inner.plan(History.build(inner.encoder, filled, []), 2) == [
        LocalStep(trend_mean=True),
        TREND,
    ]
    (made,) = inner.suggest(1, filled, [])
    assert made.step is StepKind.LOCAL
