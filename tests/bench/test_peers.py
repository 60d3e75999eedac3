"""The peer runners of ``bench/peers/`` on two small hand-made problems.

Each available peer must return a well-formed ``MethodRun``: one configuration, measurement
and reported best per evaluation, only valid configurations (only candidates on a candidate
list), reported configurations that were measured and feasible, and the same
configurations for the same seed. Peers whose library or environment is missing are skipped
with the reason ``available()`` gives.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import replace
from typing import Any

import pytest

from bench.contract import Measurement, MethodRun, SuiteProblem
from bench.peers import RUNNERS
from bench.peers._common import BadValues, Judge, Tracker, config_key, space_of
from tuner.space import Config

BUDGET = 6
# Fewer evaluations than candidates: with six of six every peer would have to find the last
# unmeasured candidate, and Optuna's GP sampler takes seconds per repeated proposal.
CANDIDATE_BUDGET = 4
MODEL_BUDGET = 12  # past every peer's initial design (10 points at most)
# Ax's default initialization is 5 Sobol points, and each of its BO steps on the mixed space
# takes tens of seconds on a busy 2-core machine: two steps past it are enough.
MODEL_BUDGETS = {"ax": 7}
LEVEL = {"a": 0.0, "b": 0.5, "c": 1.0}


def _mixed_true(config: Config) -> float | None:
    x, n, mode = float(config["x"]), int(config["n"]), str(config["mode"])
    if x > 5.0 and mode == "c":
        return None  # breaks the system
    if n > 48:
        return None  # breaks the constraint load <= 0.75
    value = math.log10(x) ** 2 + (n - 20) ** 2 / 400 + LEVEL[mode]
    return value + 0.2 * bool(config["flag"]) + 0.1 * (int(config["page"]) // 8)


def _mixed_measure(config: Config, rng: random.Random) -> Measurement:
    if rng.random() < 0.1:
        return Measurement("failed")
    if float(config["x"]) > 5.0 and config["mode"] == "c":
        return Measurement("infeasible")
    value = math.log10(float(config["x"])) ** 2 + (int(config["n"]) - 20) ** 2 / 400
    value += LEVEL[str(config["mode"])] + 0.2 * bool(config["flag"])
    value += 0.1 * (int(config["page"]) // 8)
    return Measurement("completed", {"f": value, "load": int(config["n"]) / 64})


MIXED = SuiteProblem(
    name="test:mixed",
    family="hdbo",
    half="develop",
    knobs=(
        {"name": "x", "kind": "float", "low": 0.01, "high": 10.0, "log": True},
        {"name": "n", "kind": "int", "low": 1, "high": 64, "log": True},
        {"name": "mode", "kind": "categorical", "choices": ["a", "b", "c"]},
        {"name": "flag", "kind": "bool"},
        {"name": "page", "kind": "ordinal", "choices": [4, 8, 16, 32]},
    ),
    objective="f",
    goal="minimize",
    constraints=("load <= 0.75",),
    budget=BUDGET,
    measure=_mixed_measure,
    true_value=_mixed_true,
)

_DEPLOYMENTS: tuple[Config, ...] = (
    {"family": "c4", "size": "large", "nodes": 4},
    {"family": "c4", "size": "large", "nodes": 8},
    {"family": "c4", "size": "xlarge", "nodes": 4},
    {"family": "m4", "size": "large", "nodes": 8},
    {"family": "m4", "size": "xlarge", "nodes": 4},
    {"family": "m4", "size": "xlarge", "nodes": 16},
)
_RUNTIME = {i: 100.0 / (1 + i) for i in range(len(_DEPLOYMENTS))}


def _cloud_index(config: Config) -> int:
    return next(i for i, c in enumerate(_DEPLOYMENTS) if config_key(c) == config_key(config))


def _cloud_measure(config: Config, rng: random.Random) -> Measurement:
    index = _cloud_index(config)
    if index == 5:
        return Measurement("infeasible")
    return Measurement("completed", {"runtime_s": _RUNTIME[index], "cost_usd": index * 1.0})


CLOUD = SuiteProblem(
    name="test:cloud",
    family="cloud",
    half="develop",
    knobs=(
        {"name": "family", "kind": "categorical", "choices": ["c4", "m4"]},
        {"name": "size", "kind": "categorical", "choices": ["large", "xlarge"]},
        {"name": "nodes", "kind": "int", "low": 4, "high": 16},
    ),
    objective="runtime_s",
    goal="minimize",
    constraints=("cost_usd <= 3.5",),
    budget=BUDGET,
    measure=_cloud_measure,
    true_value=lambda c: None if _cloud_index(c) >= 4 else _RUNTIME[_cloud_index(c)],
    candidates=_DEPLOYMENTS,
)


def _runner(name: str) -> Any:
    module = RUNNERS[name]
    reason = module.available()
    if reason is not None:
        pytest.skip(f"{name}: {reason}")
    return module


PEERS = [name for name in RUNNERS if name != "ours"]


#: Methods whose budget is measured time (``bench/peers/ours_stop.py``): a stopped trial
#: costs less than a measurement, so they may measure more configurations than the budget.
BY_TIME = {"ours-stop", "ours-screen"}


def _check(run: MethodRun, problem: SuiteProblem, name: str, seed: int, budget: int) -> None:
    assert (run.method, run.problem, run.seed) == (name, problem.name, seed)
    assert len(run.configs) == len(run.measurements) and len(run.reported) == budget
    assert len(run.configs) >= budget if name in BY_TIME else len(run.configs) == budget
    space, judge = space_of(problem), Judge(problem)
    for config in run.configs:
        assert space.validate_config(config) == config
    if problem.candidates:
        allowed = {config_key(c) for c in problem.candidates}
        assert all(config_key(c) in allowed for c in run.configs)
    feasible = {
        config_key(c)
        for c, m in zip(run.configs, run.measurements, strict=True)
        if judge.feasible(m)
    }
    for i, reported in enumerate(run.reported):
        if reported is not None:
            ran = run.configs if name in BY_TIME else run.configs[: i + 1]
            measured_so_far = {config_key(c) for c in ran}
            assert config_key(reported) in measured_so_far
            assert config_key(reported) in feasible
    assert run.seconds >= 0


@pytest.mark.parametrize(
    ("problem", "budget"), [(MIXED, BUDGET), (CLOUD, CANDIDATE_BUDGET)], ids=["mixed", "candidates"]
)
@pytest.mark.parametrize("name", PEERS)
def test_peer_run_is_well_formed_and_seeded(name: str, problem: SuiteProblem, budget: int) -> None:
    module = _runner(name)
    ticks: list[int] = []
    first = module.run(problem, 1, budget, on_eval=lambda: ticks.append(1))
    _check(first, problem, name, 1, budget)
    assert len(ticks) == len(first.configs)
    again = module.run(problem, 1, budget)
    assert again.configs == first.configs


@pytest.mark.slow
@pytest.mark.parametrize("name", PEERS)
def test_peer_runs_past_its_initial_design(name: str) -> None:
    """Model-based steps with a constraint, infeasible points and failed measurements."""
    module = _runner(name)
    budget = MODEL_BUDGETS.get(name, MODEL_BUDGET)
    _check(module.run(MIXED, 2, budget), MIXED, name, 2, budget)


def test_registry_names_every_peer() -> None:
    assert {"random", "skopt", "optuna-tpe", "optuna-gp", "ax", "mlos"} <= set(RUNNERS)
    for name, module in RUNNERS.items():
        assert name == module.NAME


def test_judge_reads_constraints_and_statuses() -> None:
    judge = Judge(MIXED)
    ok = Measurement("completed", {"f": 1.0, "load": 0.5})
    over = Measurement("completed", {"f": 0.5, "load": 0.9})
    assert judge.feasible(ok) and not judge.feasible(over)
    assert judge.violations(over) == pytest.approx([0.15])
    assert judge.value(Measurement("failed")) is None
    assert not judge.feasible(Measurement("completed", {"f": 1.0}))  # constrained metric missing


def test_relative_constraint_is_refused() -> None:
    problem = SuiteProblem(**{**MIXED.__dict__, "constraints": ("load <= default",)})
    with pytest.raises(ValueError, match="relative constraint"):
        Judge(problem)


def test_bad_values_wait_for_the_first_value_then_tell_the_worst() -> None:
    bad = BadValues(Judge(MIXED))
    assert bad.add("p0", Measurement("infeasible")) == []
    assert bad.add("p1", Measurement("completed", {"f": 2.0, "load": 0.1})) == [
        ("p0", 2.0),
        ("p1", 2.0),
    ]
    assert bad.add("p2", Measurement("completed", {"f": 1.0, "load": 0.1})) == [("p2", 1.0)]
    assert bad.add("p3", Measurement("completed", {"f": 0.5, "load": 0.9})) == [("p3", 2.0)]
    assert bad.add("p4", Measurement("failed")) == [("p4", 2.0)]


def test_tracker_answers_repeated_candidates_without_budget() -> None:
    tracker = Tracker("t", CLOUD, 0, 3)
    _, new = tracker.propose(dict(_DEPLOYMENTS[0]))
    again, new_again = tracker.propose(dict(_DEPLOYMENTS[0]))
    assert new and not new_again and again.status == "completed"
    assert len(tracker.configs) == 1 and tracker.notes["repeats"] == 1
    with pytest.raises(ValueError, match="non-candidate"):
        tracker.propose({"family": "c4", "size": "xlarge", "nodes": 16})
    tracker.fill()
    assert len(tracker.configs) == 3 and len({config_key(c) for c in tracker.configs}) == 3


def test_tracker_reports_the_best_feasible_measurement() -> None:
    tracker = Tracker("t", CLOUD, 0, 6)
    for config in _DEPLOYMENTS:
        tracker.measure(dict(config))
    # runtime falls with the index; cost <= 3.5 allows 0..3; 5 is infeasible
    assert tracker.reported[3] == _DEPLOYMENTS[3]
    assert tracker.reported[4] == tracker.reported[5] == _DEPLOYMENTS[3]


def _numeric_value(config: Config) -> float:
    value = (float(config["ratio"]) - 0.3) ** 2 + abs(math.log10(int(config["size"])) - 4)
    return value + 0.1 * ["a", "b", "c"].index(str(config["mode"])) + 1e-20 * int(config["huge"])


NUMERIC = SuiteProblem(
    name="test:numeric",
    family="db",
    half="develop",
    knobs=(
        {"name": "ratio", "kind": "float", "low": 0.0, "high": 1.0},
        {"name": "size", "kind": "int", "low": 16, "high": 1_000_000, "log": True},
        {"name": "mode", "kind": "categorical", "choices": ["a", "b", "c"]},
        {"name": "huge", "kind": "int", "low": 4096, "high": 2**63 - 1},
        {"name": "buffers", "kind": "int", "low": -1, "high": 4096, "special_values": [-1]},
    ),
    objective="f",
    goal="minimize",
    constraints=(),
    budget=MODEL_BUDGET,
    measure=lambda config, rng: Measurement("completed", {"f": _numeric_value(config)}),
    true_value=_numeric_value,
    embed_dims=3,
)


@pytest.mark.slow
def test_mlos_registers_suggestions_of_an_all_numeric_embedded_space() -> None:
    """mlos-core's LlamaTune adapter hands out a float Series for a space of numbers only
    (categorical knobs go as value indices) and then refused to register it; an int knob up
    to 2**63 - 1 (the most a knob may hold: the wire format's sint64) does not fit
    ConfigSpace's Integer (``bench/mlos_peer.py``)."""
    module = _runner("mlos")
    run = module.run(NUMERIC, 0, MODEL_BUDGET)
    _check(run, NUMERIC, "mlos", 0, MODEL_BUDGET)
    assert all(isinstance(c["huge"], int) and 4096 <= c["huge"] < 2**63 for c in run.configs)
    again = module.run(NUMERIC, 0, MODEL_BUDGET)  # the child's string hashing is seeded too
    assert again.configs == run.configs


def _noisy_measure(config: Config, rng: random.Random) -> Measurement:
    x = float(config["x"])
    return Measurement("completed", {"y": (1.0 + 4.0 * x * (1 - x)) * math.exp(rng.gauss(0, 0.1))})


NOISY = SuiteProblem(
    name="test:noisy",
    family="hdbo",
    half="develop",
    knobs=({"name": "x", "kind": "float", "low": 0.0, "high": 1.0},),
    objective="y",
    goal="maximize",
    constraints=(),
    budget=40,
    measure=_noisy_measure,
    true_value=lambda c: 1.0 + 4.0 * float(c["x"]) * (1 - float(c["x"])),
)


def test_ours_protocol_spends_the_budget_and_reports_the_confirmed_best() -> None:
    run = RUNNERS["ours-protocol"].run(NOISY, 3, 40)
    _check(run, NOISY, "ours-protocol", 3, 40)
    notes = run.notes
    # 5 confirmation rounds of the 3 best at least (no default: no selection rounds), the
    # rest of the budget to the search, one measurement per trial (the shipped protocol)
    assert notes["confirm_rounds"] >= 5 and notes["repeated"] == 0
    assert (
        40 - 3 * notes["confirm_rounds"] - 2 <= notes["trials"] <= 40 - 3 * notes["confirm_rounds"]
    )
    final = run.reported[-1]
    assert final is not None
    last = run.configs[-3 * notes["confirm_rounds"] :]
    assert sum(config_key(c) == config_key(final) for c in last) >= notes["confirm_rounds"]


def test_ours_full_is_ours_without_the_embedding() -> None:
    """``ours-full`` on an embedded problem makes exactly ``ours``'s choices on the same
    problem without ``embed_dims``, and not those of the embedded run."""
    embedded_problem = replace(MIXED, embed_dims=2)
    full = RUNNERS["ours-full"].run(embedded_problem, 0, MODEL_BUDGET)
    _check(full, embedded_problem, "ours-full", 0, MODEL_BUDGET)
    plain = RUNNERS["ours"].run(MIXED, 0, MODEL_BUDGET)
    embedded = RUNNERS["ours"].run(embedded_problem, 0, MODEL_BUDGET)
    assert full.configs == plain.configs != embedded.configs


def test_ours_stop_splits_a_measurement_into_windows_whose_mean_it_is() -> None:
    import random

    from bench.peers import ours_stop

    windows = ours_stop.windows_of({"tps": 100.0, "zero": 0.0}, 0.15, random.Random(1))
    assert len(windows) == ours_stop.WINDOWS
    logs = [math.log(w["tps"]) for w in windows]
    assert math.exp(sum(logs) / len(logs)) == pytest.approx(100.0)
    assert max(w["tps"] for w in windows) > 105 and all(w["zero"] == 0.0 for w in windows)
    assert ours_stop.window_cov(dataclasses.replace(MIXED, name="db:x~cov15")) == 0.15
    assert ours_stop.window_cov(MIXED) == ours_stop.QUIET_COV


def test_ours_stop_reports_by_measured_time() -> None:
    from bench.peers import ours_stop
    from tuner.study import StudySpec
    from tuner.trial import Trial, TrialStatus

    spec = StudySpec.from_dict(
        {"name": "t", "knobs": [{"name": "x", "kind": "float", "low": 0, "high": 1}],
         "objectives": [{"name": "y", "goal": "maximize"}]}
    )  # fmt: skip
    trials = [
        Trial(1, {"x": 0.1}, TrialStatus.COMPLETED, {"y": 1.0}),
        Trial(2, {"x": 0.2}, TrialStatus.EARLY_STOPPED, {"y": 0.5}),
        Trial(3, {"x": 0.3}, TrialStatus.COMPLETED, {"y": 2.0}),
    ]
    spent = [1.0, 1.4, 2.4]  # the stopped trial ran 4 of its 10 windows
    reported = ours_stop.reported_by_time(spec, trials, spent, 3)
    assert reported == [{"x": 0.1}, {"x": 0.1}, {"x": 0.3}]
