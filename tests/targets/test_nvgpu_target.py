"""The NVIDIA GPU target against the fake NVML module (real GPUs: test_nvgpu_real_gpu.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from targets.hardware import fake_nvml
from targets.hardware.fake_nvml import FakeDevice
from targets.hardware.nvgpu import NvidiaGpuTarget
from targets.registry import build_target
from tuner.errors import TargetError, ValidationError
from tuner.trial import TrialStatus

PY = sys.executable
SLEEP = [PY, "-c", "import json, time; time.sleep(0.4); print(json.dumps(dict(requests=8)))"]


@pytest.fixture
def gpu() -> Iterator[FakeDevice]:
    (device,) = fake_nvml.configure([FakeDevice()])
    yield device
    fake_nvml.configure([])


def gpu_target(**options: Any) -> NvidiaGpuTarget:
    built = build_target(
        "nvgpu",
        {
            "nvml": "targets.hardware.fake_nvml",
            "command": SLEEP,
            "metrics": ["requests"],
            "settle_s": 0,
            **options,
        },
    )
    assert isinstance(built, NvidiaGpuTarget)
    return built


def test_knobs_are_read_from_the_device(gpu: FakeDevice) -> None:
    knobs = {k.name: k for k in gpu_target().describe_knobs()}
    assert set(knobs) == {"sm_mhz", "power_w"}  # one memory clock: no mem_mhz knob
    assert knobs["sm_mhz"].choices[0] == 345 and knobs["sm_mhz"].choices[-1] == 1980
    assert len(knobs["sm_mhz"].choices) == 110 and knobs["sm_mhz"].default == 1980
    assert knobs["power_w"].choices[:3] == (200, 225, 250)
    assert knobs["power_w"].choices[-1] == 700 and knobs["power_w"].default == 700
    thin = {k.name: k for k in gpu_target(sm_levels=5).describe_knobs()}["sm_mhz"]
    assert thin.choices == (345, 750, 1155, 1575, 1980)
    fake_nvml.configure([FakeDevice(mem_clocks=(405, 5001, 9501))])
    assert "mem_mhz" in {k.name for k in gpu_target().describe_knobs()}
    (h200,) = fake_nvml.configure([FakeDevice(mem_clocks=(2201, 3201), mem_locks=False)])
    assert "mem_mhz" not in {k.name for k in gpu_target().describe_knobs()}  # as an H200
    assert h200.locked_mem is None


def test_a_trial_locks_clocks_and_power_then_restores_them(gpu: FakeDevice) -> None:
    with gpu_target() as target:
        outcome = target.run_trial({"sm_mhz": 990, "power_w": 300})
        assert outcome.status is TrialStatus.COMPLETED, outcome.reason
        assert gpu.locked_sm is None and gpu.limit_mw == 700_000  # restored at once
        assert "SetGpuLockedClocks 990 990" in gpu.calls
        assert "SetPowerManagementLimit 300000" in gpu.calls
    metrics = outcome.metrics
    assert metrics["sm_mhz_seen"] == 990
    power = gpu.draw_w(990)
    assert metrics["gpu_power_w"] == pytest.approx(power, rel=0.1)
    assert power * 0.4 <= metrics["gpu_energy_j"] <= power * 5  # the run lasts >= 0.4 s
    assert metrics["gpu_energy_j_per_request"] == pytest.approx(metrics["gpu_energy_j"] / 8)


def test_the_default_configuration_is_the_gpu_as_it_comes() -> None:
    """The first trial measures what tuning is compared with: the clocks unlocked, not locked
    at the top, and the power limit that was in force (an administrator's 512.5 W here, not
    the device's default 700 W), put back to the milliwatt."""
    (gpu,) = fake_nvml.configure([FakeDevice(limit_mw=512_500, mem_clocks=(405, 5001, 9501))])
    try:
        target = gpu_target()
        knobs = {k.name: k for k in target.describe_knobs()}
        assert knobs["power_w"].default == 512 and 512 in knobs["power_w"].choices  # type: ignore[attr-defined]
        assert "unlocked" in knobs["sm_mhz"].description
        defaults = {name: knob.default for name, knob in knobs.items()}
        assert defaults == {"sm_mhz": 1980, "mem_mhz": 9501, "power_w": 512}
        with target:
            gpu.calls.clear()
            target.apply(defaults)  # type: ignore[arg-type]
            assert gpu.locked_sm is None and gpu.locked_mem is None
            assert gpu.limit_mw == 512_500
            assert not any(c.startswith(("SetGpuLocked", "SetMemoryLocked")) for c in gpu.calls)
            assert "ResetGpuLockedClocks" in gpu.calls and "ResetMemoryLockedClocks" in gpu.calls
            target.restore()
            outcome = target.run_trial({"sm_mhz": 1965, "mem_mhz": 5001, "power_w": 700})
            assert outcome.status is TrialStatus.COMPLETED, outcome.reason
            assert "SetGpuLockedClocks 1965 1965" in gpu.calls  # one level down is a lock
            assert "SetMemoryLockedClocks 5001 5001" in gpu.calls
        assert gpu.locked_sm is None and gpu.locked_mem is None and gpu.limit_mw == 512_500
        assert outcome.metrics["sm_mhz_seen"] == 1965
    finally:
        fake_nvml.configure([])


def test_the_guides_fake_gpu_config_runs_with_tuner_tune_as_it_is(tmp_path: Path) -> None:
    """docs/targets/nvgpu.md promises that a config naming the fake NVML module runs as it
    is: in a fresh process nothing has called configure(), so the fake gives one GPU."""
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "targets" / "nvgpu.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```toml\n(.*?)```", page, re.S) if '"gpu-fake"' in b]
    db = tmp_path / "t.db"
    config = tmp_path / "gpu-fake.toml"
    config.write_text(
        block.replace('db = "runs/tuner.db"', f"db = {str(db)!r}").replace(
            "trials = 4", "trials = 2"
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "TUNER_FAKE_GPUS"}
    env["PATH"] = f"{Path(PY).parent}{os.pathsep}{env.get('PATH', '')}"  # python3 with torch
    run = subprocess.run(
        [PY, "-m", "cli.main", "tune", str(config)],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    from server.storage import SQLiteStorage

    with SQLiteStorage(db) as storage:
        trials = storage.list_trials("gpu-fake")
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 2
    first = trials[0]
    assert first.config["sm_mhz"] == 1980 and first.metrics["sm_mhz_seen"] == 1980  # unlocked
    assert all(t.metrics["gpu_energy_j_per_request"] > 0 for t in trials)
    bad = subprocess.run(
        [PY, "-m", "cli.main", "tune", str(config)],
        cwd=root, env={**env, "TUNER_FAKE_GPUS": "lots"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert bad.returncode != 0 and "TUNER_FAKE_GPUS" in bad.stderr


def test_lower_clocks_use_less_energy_and_the_power_limit_caps_the_clock(gpu: FakeDevice) -> None:
    with gpu_target() as target:
        fast = target.run_trial({"sm_mhz": 1980, "power_w": 700}).metrics
        slow = target.run_trial({"sm_mhz": 1200, "power_w": 700}).metrics
        capped = target.run_trial({"sm_mhz": 1980, "power_w": 250}).metrics
    assert slow["gpu_energy_j"] < fast["gpu_energy_j"]
    assert capped["sm_mhz_seen"] < 1980 and gpu.draw_w(int(capped["sm_mhz_seen"])) <= 250


def test_without_an_energy_counter_power_is_sampled_and_integrated() -> None:
    (device,) = fake_nvml.configure([FakeDevice(energy_counter=False)])
    try:
        with gpu_target() as target:
            started = time.monotonic()
            metrics = target.run_trial({"sm_mhz": 1500}).metrics
            elapsed = time.monotonic() - started
    finally:
        fake_nvml.configure([])
    power = device.draw_w(1500)
    assert power * 0.35 <= metrics["gpu_energy_j"] <= power * elapsed * 1.05
    assert metrics["gpu_power_w"] == pytest.approx(power, rel=0.1)


def test_restored_after_a_failed_workload_and_at_close(gpu: FakeDevice) -> None:
    target = gpu_target(command=[PY, "-c", "raise SystemExit(5)"])
    with target:
        outcome = target.run_trial({"sm_mhz": 600, "power_w": 200})
        assert outcome.status is TrialStatus.FAILED and "exit status 5" in outcome.reason
        assert gpu.locked_sm is None and gpu.limit_mw == 700_000
        target.apply({"sm_mhz": 600, "power_w": 200})  # killed between apply and restore
        assert gpu.locked_sm == (600, 600)
    assert gpu.locked_sm is None and gpu.limit_mw == 700_000


def test_an_invalid_clock_is_infeasible_and_no_permission_says_root(gpu: FakeDevice) -> None:
    with gpu_target() as target:
        outcome = target.run_trial({"power_w": 900})  # outside the device's constraints
    assert outcome.status is TrialStatus.INFEASIBLE
    gpu.writable = False
    with gpu_target() as target:
        with pytest.raises(TargetError, match="needs root"):  # restore cannot reset either
            target.run_trial({"sm_mhz": 600})
        gpu.writable = True


def test_no_gpu_and_bad_options_are_clear_errors() -> None:
    fake_nvml.configure([])
    with pytest.raises(TargetError, match="NVML Shared Library Not Found"):
        gpu_target()
    fake_nvml.configure([FakeDevice()])
    try:
        with pytest.raises(ValidationError) as info:
            gpu_target(device=3)
        assert info.value.field == "target.device"
        with pytest.raises(ValidationError) as info:
            gpu_target(sm_levels=1)
        assert info.value.field == "target.sm_levels"
    finally:
        fake_nvml.configure([])


def test_the_gpu_example_config_mixes_device_and_workload_knobs(gpu: FakeDevice) -> None:
    import tomllib

    from runner.config import parse_config

    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "examples" / "gpu_inference.toml").read_text(encoding="utf-8"))
    data["target"]["nvml"] = "targets.hardware.fake_nvml"
    config = parse_config(data, {})
    space = config.spec.space
    assert space.names == ("sm_mhz", "power_w", "batch")
    assert len(space["sm_mhz"].choices) == 24  # type: ignore[attr-defined]
    assert space["power_w"].default == 700
    pareto = tomllib.loads((root / "examples" / "gpu_pareto.toml").read_text(encoding="utf-8"))
    pareto["target"]["nvml"] = "targets.hardware.fake_nvml"
    front = parse_config(pareto, {}).spec
    assert front.space == space and front.multi_objective
    assert [o.name for o in front.objectives] == ["gpu_energy_j_per_request", "p99_ms"]
    data["study"]["knobs"][0] = {"name": "sm_clock"}
    with pytest.raises(ValidationError) as info:
        parse_config(data, {})
    assert info.value.field == "study.knobs[0].name" and "sm_mhz" in str(info.value)


def test_several_gpus_get_a_knob_each_and_their_energy_adds_up() -> None:
    first, second = fake_nvml.configure([FakeDevice(), FakeDevice(name="Fake NVIDIA A100")])
    try:
        target = gpu_target(devices=[0, 1], knobs=["sm_mhz"])
        knobs = {k.name: k for k in target.describe_knobs()}
        assert set(knobs) == {"sm_mhz_0", "sm_mhz_1"}
        assert "GPU 1" in knobs["sm_mhz_1"].description
        metrics = target.describe_metrics()
        assert {"gpu_energy_j", "gpu_energy_j_0", "gpu_energy_j_1", "sm_mhz_seen_1"} <= set(metrics)
        with target:
            outcome = target.run_trial({"sm_mhz_0": 1980, "sm_mhz_1": 990})
            assert outcome.status is TrialStatus.COMPLETED, outcome.reason
            assert first.locked_sm is None and second.locked_sm is None  # both restored
        m = outcome.metrics
        assert (m["sm_mhz_seen_0"], m["sm_mhz_seen_1"]) == (1980, 990)
        assert m["gpu_energy_j"] == pytest.approx(m["gpu_energy_j_0"] + m["gpu_energy_j_1"])
        assert m["gpu_energy_j_1"] < m["gpu_energy_j_0"]  # the slower stage draws less
        assert "SetGpuLockedClocks 990 990" in second.calls
        assert not any("PowerManagementLimit 2" in c for c in first.calls)  # power untouched
    finally:
        fake_nvml.configure([])


def test_every_gpu_is_reset_even_when_one_cannot_be() -> None:
    first, second = fake_nvml.configure([FakeDevice(), FakeDevice()])
    try:
        target = gpu_target(devices=[0, 1])
        target.setup()
        target.apply({"sm_mhz_0": 600, "sm_mhz_1": 600})
        first.writable = False
        with pytest.raises(TargetError, match="needs root"):
            target.restore()
        assert second.locked_sm is None  # the second GPU was reset all the same
        first.writable = True
        target.close()
        assert first.locked_sm is None
    finally:
        fake_nvml.configure([])


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"devices": []}, "target.devices"),
        ({"devices": [0, 0]}, "target.devices"),
        ({"devices": [0, 5]}, "target.devices"),
        ({"devices": "0,1"}, "target.devices"),
        ({"knobs": ["sm_clock"]}, "target.knobs"),
        ({"knobs": []}, "target.knobs"),
    ],
)
def test_bad_device_lists_name_the_field(options: dict[str, Any], field: str) -> None:
    fake_nvml.configure([FakeDevice(), FakeDevice()])
    try:
        with pytest.raises(ValidationError) as info:
            gpu_target(**options)
        assert info.value.field == field
    finally:
        fake_nvml.configure([])


def _windowed(start: str, end: str) -> list[str]:
    """A workload that idles 0.6 s (start-up, warm-up), then times 0.4 s and says when."""
    return [
        PY,
        "-c",
        "import json, time; time.sleep(0.6); a = time.monotonic(); time.sleep(0.4); "
        f"b = time.monotonic(); print(json.dumps(dict(requests=8, window_start_s={start}, "
        f"window_end_s={end})))",
    ]


def test_a_workload_that_reports_its_timed_window_is_metered_over_it_alone(
    gpu: FakeDevice,
) -> None:
    with gpu_target(command=_windowed("a", "b")) as target:
        timed = target.run_trial({"sm_mhz": 1980, "power_w": 700}).metrics
    with gpu_target(command=_windowed("0", "1")) as target:  # not within the run: whole run
        whole = target.run_trial({"sm_mhz": 1980, "power_w": 700}).metrics
    draw = gpu.draw_w(1980)
    assert timed["gpu_energy_j"] == pytest.approx(draw * 0.4, rel=0.2)
    assert timed["gpu_power_w"] == pytest.approx(draw, rel=0.1)
    assert timed["gpu_energy_j_per_request"] == pytest.approx(timed["gpu_energy_j"] / 8)
    assert whole["gpu_energy_j"] >= draw * 0.95  # start-up, idling and the window
