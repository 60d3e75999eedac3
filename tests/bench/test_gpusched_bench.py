"""bench.gpusched: every method tunes on training traces (Tiresias's defaults first) and its
best configuration is judged on a held-out trace next to the baselines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpusched


@pytest.mark.slow
def test_main_tunes_every_method_and_judges_on_held_out_traces(tmp_path: Path) -> None:
    argv = ["--seeds", "1", "--budget", "12", "--max-jobs", "100", "--train", "103959",
            "--test", "2869ce", "--out", str(tmp_path)]  # fmt: skip
    assert gpusched.main(argv) == 0
    data = json.loads((tmp_path / "gpusched.json").read_text())
    assert (tmp_path / "gpusched.png").stat().st_size > 0
    assert {r["method"] for r in data["runs"]} == set(gpusched.METHODS)
    for run in data["runs"]:
        assert len(run["best"]) == 12
        assert run["best"][0] == pytest.approx(1.0)  # Tiresias's defaults, measured first
        assert all(b <= a for a, b in zip(run["best"], run["best"][1:], strict=False))
        assert run["config"] is not None
    held = data["held_out"]["2869ce"]["policies"]
    assert set(gpusched.BASELINES) <= set(held)
    assert {f"{m}:0" for m in gpusched.METHODS} <= set(held)
    # on this trace FIFO's head-of-line blocking costs more than Tiresias's queues
    assert held["FIFO"]["avg_jct_s"] > held["Tiresias (3250/7200/18000)"]["avg_jct_s"]
