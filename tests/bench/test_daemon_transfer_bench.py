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
    text = daemon_transfer.config_text(tmp_path, 3, "none", 6, 0.5)
    data = tomllib.loads(text)
    assert data["daemon"]["transfer"] is False and data["daemon"]["max_rounds"] == 2
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
