"""bench.gpu_device's sweep on the simulated GPU: the order it measures in, and the reset."""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import gpu_device
from targets import grid
from targets.hardware import fake_nvml
from targets.hardware.fake_nvml import FakeDevice


@pytest.fixture
def gpu() -> Iterator[FakeDevice]:
    (device,) = fake_nvml.configure([FakeDevice()])
    yield device
    fake_nvml.configure([])


def test_the_sweep_measures_controls_between_cells_and_leaves_the_clocks_reset(
    gpu: FakeDevice, tmp_path: Path
) -> None:
    target = gpu_device.gpu_target("targets.hardware.fake_nvml")
    levels = {name: values[:2] for name, values in gpu_device.sweep_levels(target).items()}
    default = gpu_device.default_cell(target, list(levels))
    seen: list[tuple[int, int]] = []

    def run(cell: dict[str, int]) -> dict[str, float]:
        # as the device is set: the top SM level is the clock unlocked, the others a lock
        sm = gpu.locked_sm[1] if gpu.locked_sm else max(gpu.sm_clocks)
        assert (gpu.locked_sm is None) == (sm == max(gpu.sm_clocks))
        seen.append((sm, gpu.limit_mw // 1000))
        return {"requests": float(cell["batch"])}

    args = argparse.Namespace(budget_s=60.0, settle_s=0.0, control_every=3)
    cells = grid.cells(levels)
    table, log = tmp_path / "sweep.csv", tmp_path / "sweep.jsonl"
    # Stop after two passes: the budget is spent by the 2 x (cells + controls) measurements.
    per_pass = len(grid.measuring_order(cells, default, 0, args.control_every))
    calls = 0

    def two_passes(cell: dict[str, int]) -> dict[str, float]:
        nonlocal calls
        calls += 1
        if calls == 2 * per_pass:
            args.budget_s = 0.0
        return run(cell)

    gpu_device.run_grid(target, cells, default, ["requests"], table, log, args, two_passes)

    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 2 * per_pass
    for number in (0, 1):
        got = [{k: r[k] for k in levels} for r in rows if r["pass"] == number]
        assert got == grid.measuring_order(cells, default, number, args.control_every)
    assert all(r["status"] == "COMPLETED" for r in rows)
    with table.open() as handle:
        assert [float(r["requests"]) for r in csv.DictReader(handle)] == [r["batch"] for r in rows]
    # every measurement ran with its cell's clock and limit; the device is back at its defaults
    assert seen == [(r["sm_mhz"], r["power_w"]) for r in rows]
    assert gpu.locked_sm is None and gpu.limit_mw == gpu.default_limit_mw


def test_the_stage_clock_phase_measures_the_switching_cost_then_the_cells(
    gpu: FakeDevice, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["stages", "--nvml", "targets.hardware.fake_nvml", "--device", "cpu",
            "--out", str(tmp_path), "--width", "16", "--layers", "1,1,1,1", "--batch", "16",
            "--microbatches", "2", "--seconds", "0.02", "--warmup-s", "0", "--settle-s", "0",
            "--budget-s", "4", "--switch-calls", "4", "--switch-rounds", "2"]  # fmt: skip
    assert gpu_device.main(argv) == 0
    cost = json.loads((tmp_path / "stage-switch.json").read_text())
    assert cost["nvml_lock_ms"]["n"] == 4 and set(cost["step_ms_median"]) == {
        "none",
        "wait",
        "switch",
    }
    assert all(r["switches"] > 0 for r in cost["rounds"]["switch"])
    assert sum(cost["stage_share"].values()) == pytest.approx(1.0)
    rows = [json.loads(line) for line in (tmp_path / "stages-log.jsonl").read_text().splitlines()]
    top = max(gpu.sm_clocks)
    assert rows[0]["sm_mhz"] == rows[0]["sm_mhz_memory"] == top  # the unlocked default first
    assert all(r["status"] == "COMPLETED" for r in rows)
    split = [r for r in rows if r["sm_mhz"] != r["sm_mhz_memory"]]
    assert split and all(r["switches"] > 0 and r["sm_mhz_memory"] < r["sm_mhz"] for r in split)
    assert gpu.locked_sm is None and gpu.limit_mw == gpu.default_limit_mw
    # the report chooses on the first pass and judges on the later ones
    from bench import gpu_report

    assert gpu_report.main(["--stages", str(tmp_path), "--markdown"]) == 0
    shown = capsys.readouterr().out
    assert "best fixed clock" in shown and "best per stage" in shown and "switching cost" in shown
