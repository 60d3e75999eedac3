"""``bench.daemon_transfer``: its scores and table from rounds' p99 values, and the run's
config made from ``examples/daemon_cpu.toml`` (a real daemon run is the benchmark itself)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bench import daemon_transfer
from runner.config import parse_config


def test_the_scores_follow_round_twos_gain_to_round_ones() -> None:
    round1 = [("default", 30.0), ("sobol", 60.0), ("sobol", 15.0)]  # G1 = 2
    round2 = [("default", 40.0), ("transfer", 25.0), ("sobol", 50.0), ("global", 20.0)]
    got = daemon_transfer.scores(round1, round2, 4)
    assert got["g1"] == 2.0 and got["gains2"] == [1.0, 1.6, 1.6, 2.0]
    assert got["reach"] == 4 and got["final2"] == 2.0
    assert daemon_transfer.scores(round1, round2[:3], 3)["reach"] == 4  # not reached: trials + 1
    runs = [
        {"seed": s, "arm": arm, "g1": 2.0, "reach": reach, "final2": 2.0}
        for s, (a, b) in enumerate([(2, 5), (3, 5)])
        for arm, reach in (("transfer", a), ("none", b))
    ]
    text = daemon_transfer.table(runs)
    assert "| transfer | 2 | 2.00 | 2.5 (2.0-3.0) | 2.00 |" in text
    assert "paired over 2 seeds: 2.5" in text


def test_each_run_is_the_example_with_its_own_files_seed_and_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = daemon_transfer.config_text(tmp_path, 3, "none", 6, 0.5, windows=3)
    data = tomllib.loads(text)
    assert data["daemon"]["transfer"] is False and data["daemon"]["max_rounds"] == 2
    assert data["daemon"]["windows_per_trial"] == 3
    assert data["study"]["designer"]["seed"] == 3 and data["session"]["trials"] == 6
    assert str(tmp_path / "load.txt") in data["target"]["command"]
    config = parse_config(data, {})
    assert config.daemon is not None and not config.daemon.transfer
    on = tomllib.loads(daemon_transfer.config_text(tmp_path, 0, "transfer", 6, 0.5))
    assert on["daemon"]["transfer"] is True
    edited = tmp_path / "edited.toml"  # an example edited past what the bench expects
    edited.write_text(daemon_transfer.EXAMPLE.read_text().replace("interval_s = 1.0", ""))
    monkeypatch.setattr(daemon_transfer, "EXAMPLE", edited)
    with pytest.raises(ValueError, match=r"changed: 'interval_s = 1\.0'"):
        daemon_transfer.config_text(tmp_path, 0, "none", 6, 0.5)


CONFIG = """
[study]
name = "d"
objectives = [{ name = "p99_ms", goal = "minimize" }]

[[study.knobs]]
name = "x"
kind = "ordinal"
choices = [2, 4, 8]
default = 8

[target]
kind = "command"
command = [
    "python3", "-c", "import json, sys; print(json.dumps(dict(p99_ms=float(sys.argv[1]))))", "{x}",
]
metrics = ["p99_ms"]
"""


def test_round_ones_gain_is_confirmed_by_interleaved_rounds_of_a_real_target(
    tmp_path: Path,
) -> None:
    """``G1`` is measured again, the applied configuration against the default in rounds on
    the config's own target (here a command printing p99 = x): 8 ms over 2 ms is 4x."""
    config = tmp_path / "d.toml"
    config.write_text(CONFIG)
    trials = [
        {"id": 1, "config": {"x": 8}, "status": "COMPLETED", "source": "default",
         "metrics": {"p99_ms": 8.0}},
        {"id": 2, "config": {"x": 4}, "status": "COMPLETED", "source": "sobol",
         "metrics": {"p99_ms": 4.0}},
        {"id": 3, "config": {"x": 2}, "status": "COMPLETED", "source": "global",
         "metrics": {"p99_ms": 3.0}},
    ]  # fmt: skip
    ratio, low, high = daemon_transfer.confirm_round1(config, trials, {"x": 2}, 3)
    assert ratio == pytest.approx(4.0) and low <= ratio <= high
    assert daemon_transfer.confirm_round1(config, trials, {"x": 8}, 3) == (1.0, 1.0, 1.0)
    config.write_text(CONFIG.replace('"python3", "-c"', '"false", "-c"'))
    with pytest.raises(RuntimeError, match="no confirmed ratio"):
        daemon_transfer.confirm_round1(config, trials, {"x": 2}, 2)
    got = daemon_transfer.scores([("default", 8.0), ("global", 3.0)], [("default", 6.0),
                                 ("global", 2.0)], 1, ratio)  # fmt: skip
    assert got["g1"] == pytest.approx(4.0) and got["reach"] == 2  # 3x < confirmed 4x
