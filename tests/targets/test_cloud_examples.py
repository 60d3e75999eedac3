"""The cloud examples run for real with ``tuner tune``: the replay of the modelled runs of
``examples/cloud_runs.csv`` and the launcher driving ``examples/cloud_local.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cli.main import main
from runner.config import load_config
from server.storage import SQLiteStorage
from targets.cloud.target import CloudLaunchTarget, CloudReplayTarget
from tuner.trial import TrialStatus

ROOT = Path(__file__).resolve().parents[2]


def test_the_cloud_examples_are_valid_and_search_the_69_deployments() -> None:
    replay = load_config(ROOT / "examples" / "cloud_replay.toml")
    launch = load_config(ROOT / "examples" / "cloud_launch.toml")
    assert isinstance(replay.target, CloudReplayTarget)
    assert isinstance(launch.target, CloudLaunchTarget)
    for config in (replay, launch):
        assert len(config.spec.candidates) == 69
        assert config.spec.space.names == ("family", "size", "nodes")


def test_tune_picks_a_deployment_that_meets_the_deadline_from_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the example's table path is relative to the checkout
    db = tmp_path / "tuner.db"
    args = ["tune", "examples/cloud_replay.toml", "--trials", "12", "--db", str(db)]
    assert main([*args, "--plot", str(tmp_path / "p.png")]) == 0
    with SQLiteStorage(db, read_only=True) as storage:
        trials = storage.list_trials("cloud-terasort")
        spec = storage.get_study("cloud-terasort").spec
    assert len(trials) == 12 and len(spec.candidates) == 69
    allowed = {tuple(c.values()) for c in spec.candidates}
    assert all(tuple(t.config.values()) in allowed for t in trials)
    assert len({tuple(t.config.values()) for t in trials}) == 12
    met = [t for t in trials if t.status is TrialStatus.COMPLETED and t.metrics["runtime_s"] <= 600]
    assert met  # a deployment within the 10-minute deadline was found


@pytest.mark.slow
def test_tune_launches_each_deployment_through_the_users_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (ROOT / "examples" / "cloud_launch.toml").read_text(encoding="utf-8")
    config = tmp_path / "cloud_launch.toml"
    config.write_text(text.replace('"python3"', f'"{sys.executable}"'), encoding="utf-8")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "tuner.db"
    assert main(["tune", str(config), "--trials", "4", "--db", str(db)]) == 0
    with SQLiteStorage(db, read_only=True) as storage:
        trials = storage.list_trials("cloud-local-wordcount")
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 4
    for trial in trials:
        assert trial.metrics["distinct_words"] == 5000
        price = {"c4": 0.1, "m4": 0.1, "r4": 0.133}[str(trial.config["family"])]
        price *= {"large": 1, "xlarge": 2, "2xlarge": 4}[str(trial.config["size"])]
        expected = price * int(trial.config["nodes"]) * trial.metrics["runtime_s"] / 3600
        assert trial.metrics["cost_usd"] == pytest.approx(expected, rel=0.01)
