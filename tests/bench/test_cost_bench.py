"""bench.cost: the arms on the real SQLite target, the measured seconds read from each
session's database, the redeploy, and the paired summary."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sqlite3
import tomllib
from pathlib import Path
from typing import Any

import pytest

from bench import cost, noise


def cell(level: str, seconds: dict[str, float], gains: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {"level": level, "seed": 0, "redeploy": {}}
    for arm, measured in seconds.items():
        out[arm] = {"measured_s": measured, "wall_s": measured + 10, "stopped": 2,
                    "reported": gains[arm]}  # fmt: skip
        out["redeploy"][arm] = {"gain": gains[arm]}
    return out


def test_the_summary_pairs_each_arm_with_the_full_protocol_seed_by_seed() -> None:
    cells = [
        cell("quiet", {"full": 100.0, "stop": 50.0}, {"full": 4.0, "stop": 4.0}),
        cell("quiet", {"full": 200.0, "stop": 100.0}, {"full": 5.0, "stop": 4.5}),
        cell("moderate", {"full": 100.0, "stop": 80.0}, {"full": 4.0, "stop": 4.0}),
    ]
    rows = {(r["level"], r["arm"]): r for r in cost.summarize(cells, ["full", "stop"])}
    quiet = rows["quiet", "stop"]
    assert quiet["seeds"] == 2 and quiet["time_ratio"][0] == pytest.approx(2.0)
    assert quiet["gain_ratio"][0] == pytest.approx(math.sqrt(0.9))
    assert quiet["full"]["measured_s"] == 150.0 and quiet["stop"]["redeployed"] == 4.25
    assert rows["moderate", "stop"]["time_ratio"] is None  # one seed: no interval


def test_measured_seconds_count_windows_warm_ups_and_whole_control_runs(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE studies (id INTEGER, name TEXT)")
        conn.execute("CREATE TABLE measurements (study_id INTEGER, trial_id INTEGER, kind TEXT)")
        conn.execute("INSERT INTO studies VALUES (1, 's')")
        rows = [(1, 1, "repeat"), (1, 1, "control"), (1, 1, "confirm"), (1, 2, "repeat")]
        rows += [(1, 2, "progress")] * 4 + [(1, 3, "repeat")]
        conn.executemany("INSERT INTO measurements VALUES (?, ?, ?)", rows)
        conn.commit()
    # trial 1: 3 runs (warm-up each), 3 whole windows; trial 2: 4 of 10 windows; trial 3
    # reported none: its whole window
    expected = 5 * 0.5 + 3 * 2.0 + 4 * 0.2 + 2.0
    assert cost.measured_seconds(db, "s", 0.5, 2.0, 0.2) == pytest.approx(expected)
    assert cost.window_seconds("sqlite", 2.0) == 0.2
    assert (
        cost.window_seconds("postgres", 10.0) == 1.0 and cost.window_seconds("postgres", 4) == 1.0
    )


@pytest.mark.slow
def test_a_tiny_run_measures_both_arms_and_redeploys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = noise.SYSTEMS["sqlite"]
    data = tomllib.loads(system.example.read_text(encoding="utf-8"))
    data["session"].update(confirm=2, confirm_select=1, confirm_top=2)
    example = tmp_path / "example" / system.example.name
    example.parent.mkdir()
    example.write_text(noise.to_toml(data), encoding="utf-8")
    monkeypatch.setitem(noise.SYSTEMS, "sqlite", dataclasses.replace(system, example=example))
    code = cost.main(
        ["--seeds", "1", "--levels", "quiet", "--arms", "full,stop", "--trials", "10",
         "--measure-s", "0.1", "--warmup-s", "0.02", "--db-mb", "1", "--redeploy", "2",
         "--out", str(tmp_path / "out")]
    )  # fmt: skip
    assert code == 0
    [done] = json.loads((tmp_path / "out" / "cells.json").read_text())["cells"]
    assert done["order"] == ["full", "stop"]
    assert done["full"]["stopped"] == 0 and done["full"]["trials"] == 10
    assert done["stop"]["measured_s"] <= done["full"]["measured_s"] * 1.5
    assert set(done["redeploy"]) >= {"full", "stop"}
    assert (tmp_path / "out" / "cost.png").exists()


def test_the_trials_part_sets_the_controls_and_the_confirmation_aside() -> None:
    session = {"measured_s": 100.0, "runs": 53, "trials": 30}  # 23 whole runs beside
    assert cost.trial_seconds(session, 0.5, 3.0) == pytest.approx(100.0 - 23 * 3.5)
    cells = [cell("quiet", {"full": 200.0, "stop": 150.0}, {"full": 4.0, "stop": 4.0})
             for _ in range(2)]  # fmt: skip
    for c in cells:
        for arm in ("full", "stop"):
            c[arm].update(runs=40, trials=30)  # 10 whole runs of 3.5 s: 35 s
    [row] = cost.summarize(cells, ["full", "stop"], 0.5, 3.0)
    assert row["trial_ratio"][0] == pytest.approx(165 / 115)
    assert row["time_ratio"][0] == pytest.approx(200 / 150)
