"""Smoke tests of the latency benchmark: its spaces, goals, and a tiny run with every peer.

No timing is asserted (speed is what ``python -m bench.latency`` reports); the tests check
the spaces' shapes and that a run writes well-formed results, with a reason wherever a peer
has no number.
"""

from __future__ import annotations

import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench import latency, latency_peers, latency_spaces
from bench.latency_report import Cell, PeerTimes, cells_from_json, goal_checks, to_json
from tuner.encoding import UnitBoxEncoder

_PROBED: dict[tuple[str, str], dict[str, str | None] | str] = {}


def _probe_once(peer: str, python: str) -> dict[str, str | None]:
    """``latency_peers.probe``, run once per peer and interpreter in a test session: each
    probe is a child that imports the peer's library (Ax: seconds), and what it finds does
    not change during the session. The first call probes every peer at once (the children
    are independent; the test only waits for them)."""
    if (peer, python) not in _PROBED:
        others = [p for p in latency_peers.PEERS if p != peer and (p, python) not in _PROBED]
        peers = [peer, *others]
        with ThreadPoolExecutor(len(peers)) as pool:
            answers = pool.map(_probe, peers, [python] * len(peers))
            _PROBED.update({(p, python): a for p, a in zip(peers, answers, strict=True)})
    found = _PROBED[peer, python]
    if isinstance(found, str):
        raise latency_peers.PeerUnavailable(found)
    return dict(found)


def _probe(peer: str, python: str) -> dict[str, str | None] | str:
    """The peer's versions, or why it is unavailable."""
    try:
        return latency_peers.probe(peer, python)
    except latency_peers.PeerUnavailable as err:
        return str(err)


def _available(peer: str) -> bool:
    try:
        _probe_once(peer, sys.executable)
    except latency_peers.PeerUnavailable:
        return False
    return True


@pytest.fixture
def probe_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of ``bench.latency`` probes its peers through the same cache (it probes every
    peer it is given, as ``_available`` did just before)."""
    monkeypatch.setattr(latency, "probe", _probe_once)


def test_mixed_shape_follows_the_mysql_knob_sets() -> None:
    sysbench = latency_spaces.mixed_shape(20)
    assert sysbench.choices == (2, 3, 2) and sysbench.d == 20
    mysql100 = latency_spaces.mixed_shape(100)
    assert len(mysql100.choices) == 54
    assert [mysql100.choices.count(n) for n in (2, 3, 6)] == [44, 9, 1]
    assert mysql100.small_int == 12 and mysql100.wide_int + mysql100.floats == 34
    for d in (1, 3, 6, 16, 37, 100, 250):
        shape = latency_spaces.mixed_shape(d)
        assert shape.d == d and len(shape.choices) >= 1


@pytest.mark.parametrize("kind", latency_spaces.KINDS)
def test_history_is_valid_and_seeded(kind: str) -> None:
    spec = latency_spaces.spec(kind, 16)
    configs, values = latency_spaces.history(kind, 16, 5, seed=3)
    for config in configs:
        spec.space.validate_config(config)
    assert (configs, values) == latency_spaces.history(kind, 16, 5, seed=3)
    assert all(math.isfinite(v) for v in values)
    encoder = UnitBoxEncoder(spec.space)
    # the categorical kernel and the local search on a mixed space, as for MySQL
    if latency_spaces.base_kind(kind) == "mixed":
        assert len(encoder.cat_dims) == 2 and len(encoder.discrete_dims) == 4
    else:
        assert not encoder.cat_dims and not encoder.discrete_dims


@pytest.mark.parametrize("base", ["box", "mixed"])
def test_a_constrained_space_is_the_same_space_and_history_under_one_bound(base: str) -> None:
    kind = base + latency_spaces.CONSTRAINED_SUFFIX
    assert latency_spaces.constrained(kind) and not latency_spaces.constrained(base)
    spec = latency_spaces.spec(kind, 16)
    assert spec.space == latency_spaces.spec(base, 16).space
    (constraint,) = spec.outcome_constraints
    assert str(constraint) == f"c <= {latency_spaces.CONSTRAINT_BOUND}"
    assert not latency_spaces.spec(base, 16).outcome_constraints
    configs, values = latency_spaces.history(kind, 16, 200, seed=3)
    assert (configs, values) == latency_spaces.history(base, 16, 200, seed=3)
    bound = latency_spaces.constraint_values(kind, 16, configs, seed=3)
    assert bound == latency_spaces.constraint_values(kind, 16, configs, seed=3)
    feasible = sum(c <= latency_spaces.CONSTRAINT_BOUND for c in bound) / len(bound)
    assert 0.2 < feasible < 0.6  # the bound is active: neither every point nor none
    assert latency_spaces.describe(kind, 16).endswith(", c <= 0.45")
    with pytest.raises(ValueError, match="space kind must be one of"):
        latency_spaces.spec("box+x", 16)


def test_goals_count_a_capped_peer_as_slower_only_below_the_cap() -> None:
    fast = Cell("box", 16, 100, ours=[0.2, 0.25, 0.3])
    fast.peers["optuna"] = PeerTimes(seconds=[0.5, 0.6, 0.7])
    fast.peers["ax"] = PeerTimes(capped=60.0, note="capped")
    slow = Cell("mixed", 16, 100, ours=[90.0])
    slow.peers["optuna"] = PeerTimes(seconds=[1.0])
    slow.peers["ax"] = PeerTimes(capped=60.0, note="capped")
    checks = {c["goal"]: c for c in goal_checks([fast, slow])}
    assert checks["ours median <= 0.3 s at d=16, n=100, box"]["passed"] is True
    assert checks["ours median <= 0.3 s at d=16, n=100, mixed"]["passed"] is False
    assert checks["ours median <= 1.5 s at d=16, n=1000, box"]["passed"] is None
    optuna = checks["ours faster than optuna in every measured cell"]
    assert optuna["passed"] is False and optuna["ours_not_faster"] == ["mixed d=16 n=100"]
    ax = checks["ours faster than ax in every measured cell"]
    assert ax["passed"] is True and ax["undecided_capped"] == ["mixed d=16 n=100"]
    data = json.loads(json.dumps(to_json([fast, slow], {})))  # inf never reaches the file
    assert data["cells"][0]["peers"]["ax"]["median_s"] is None
    assert cells_from_json(data)[1].peers["ax"].capped == 60.0


@pytest.mark.slow
def test_tiny_run_is_well_formed(tmp_path, probe_once) -> None:
    peers = [p for p in latency_peers.PEERS if _available(p)]
    args = ["--cells", "box:2:8,mixed+c:3:8", "--reps", "2", "--peers", ",".join(peers)]
    assert latency.main([*args, "--out", str(tmp_path), "--tag", "t"]) == 0
    data = json.loads((tmp_path / "latency-t.json").read_text())
    cells = [(c["kind"], c["d"], c["n"]) for c in data["cells"]]
    assert cells == [("box", 2, 8), ("mixed+c", 3, 8)]
    if "skopt" in peers:  # scikit-optimize takes no outcome constraint: a reason, no number
        assert data["cells"][1]["peers"]["skopt"]["note"] == "n/a: no outcome constraints"
    for cell in data["cells"]:
        assert len(cell["ours"]) == 2 and cell["ours_median_s"] > 0
        assert set(cell["ours_sources"]) <= {"global", "fill-in", "fallback"}
        assert set(cell["peers"]) == set(peers)
        for name, peer in cell["peers"].items():
            assert len(peer["seconds"]) == 2 or peer["note"], name  # a number or a reason
            if name == "ax":
                assert set(peer["kinds"]) == {"MBM"}  # the model's step, not the center
    assert data["meta"]["spaces"]["mixed+c-d3"].startswith("1 cat")
    assert {g["passed"] for g in data["goals"] if "kind" in g} == {None}  # sizes not run
    assert latency.main(["--report", str(tmp_path / "latency-t.json"), "--markdown"]) == 0


@pytest.mark.parametrize("peer", latency_peers.CONSTRAINED_PEERS)
def test_constrained_peers_are_told_the_same_bound(peer: str) -> None:
    if not _available(peer):
        pytest.skip(f"{peer} is not installed")
    kind, d, n = "box+c", 3, 6
    configs, values = latency_spaces.history(kind, d, n, seed=0)
    bound = latency_spaces.constraint_values(kind, d, configs, seed=0)
    metric, limit = latency_spaces.CONSTRAINT_METRIC, latency_spaces.CONSTRAINT_BOUND
    message = {
        "knobs": latency_spaces.knobs(kind, d),
        "configs": configs[:-1],
        "values": values[:-1],
        "seed": 0,
        "constraint": {"metric": metric, "bound": limit, "values": bound[:-1]},
    }
    child = latency_peers._PEER_CLASSES[peer](message)
    child.step(configs[-1], values[-1], bound[-1])
    if peer == "optuna":  # Optuna's convention: feasible when <= 0
        told = [t.constraints[metric] for t in child.study.trials if t.constraints]
        assert told == pytest.approx([c - limit for c in bound])
    else:
        (constraint,) = child.client._experiment.optimization_config.outcome_constraints
        assert constraint.metric_names == [metric] and constraint.bound == limit
        assert constraint.op.name == "LEQ"
        data = child.client._experiment.lookup_data().df
        told = data[data["metric_name"] == metric].sort_values("trial_index")["mean"]
        assert list(told) == pytest.approx(bound)


@pytest.mark.slow
def test_a_capped_peer_is_skipped_at_larger_n(tmp_path, probe_once) -> None:
    if not _available("skopt"):
        pytest.skip("scikit-optimize is not installed")
    # past skopt's 10 initial points each step fits a GP (milliseconds): always over the cap;
    # before them a step can answer within 0.1 ms, and a run there was once not capped
    cells = "box:2:14,box:2:15"
    args = ["--cells", cells, "--reps", "1", "--peers", "skopt", "--cap", "0.0001"]
    assert latency.main([*args, "--out", str(tmp_path)]) == 0
    first, second = json.loads((tmp_path / "latency.json").read_text())["cells"]
    assert first["peers"]["skopt"]["capped"] is not None, first["peers"]["skopt"]["note"]
    assert first["peers"]["skopt"]["note"].startswith("capped")
    assert second["peers"]["skopt"]["note"] == "skipped: capped at n=14"
    assert second["peers"]["skopt"]["seconds"] == []


def test_a_cell_times_a_step_that_fits_again_and_the_mean_over_a_cycle() -> None:
    """From 200 observations on our steps keep the hyperparameters between fits, so the cell
    also times one step that fits (its cache fitted ``refit_interval(n)`` trials before) and
    averages a cycle; below 200 every step fits."""
    none = latency.PeerSettings(python={}, unavailable={})
    cell = latency.time_cell("box", 2, 200, 2, none)
    assert cell.refit_every == 20 and len(cell.ours) == 2
    assert cell.ours_refit is not None and cell.ours_refit > 0
    mean = cell.ours_mean
    assert mean == pytest.approx((19 * cell.ours_median + cell.ours_refit) / 20)
    (back,) = cells_from_json(json.loads(json.dumps(to_json([cell], {}))))
    assert (back.ours_refit, back.refit_every, back.ours_mean) == (cell.ours_refit, 20, mean)
    small = latency.time_cell("box", 2, 30, 1, none)  # every step fits: nothing more to time
    assert small.refit_every == 1 and small.ours_refit is None and small.ours_mean is None
