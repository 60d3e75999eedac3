"""The Jetson target against a fake sysfs/debugfs tree, with a real workload subprocess that
reports the clocks it ran under."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import targets.hardware.jetson as jetson
from targets.hardware.fake_sysfs import ORIN_EMC_KHZ, ORIN_GPU_HZ, make_jetson_tree
from targets.hardware.jetson import DEVFREQ, EMC, JetsonTarget
from targets.registry import build_target
from tuner.errors import ValidationError
from tuner.trial import TrialStatus

PY = sys.executable
GPU = "17000000.ga10b"
WORKLOAD = textwrap.dedent(
    """
    import json, os, sys, time
    root = os.environ["ROOT"]
    node = os.path.join(root, "class/devfreq/17000000.ga10b")
    emc = os.path.join(root, "kernel/debug/bpmp/debug/clk/emc")
    read = lambda path: int(open(path).read())
    time.sleep(0.3)
    print(json.dumps({
        "gpu_min": read(os.path.join(node, "min_freq")),
        "gpu_max": read(os.path.join(node, "max_freq")),
        "emc_hz": read(os.path.join(emc, "rate")),
        "emc_locked": read(os.path.join(emc, "mrq_rate_locked")),
        "requests": 4,
    }))
    """
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "w.py").write_text(WORKLOAD, encoding="utf-8")
    return make_jetson_tree(tmp_path / "sys")


def jetson_target(root: Path, **options: Any) -> JetsonTarget:
    built = build_target(
        "jetson",
        {
            "sysfs": str(root),
            "command": [PY, str(root.parent / "w.py")],
            "metrics": ["gpu_min", "gpu_max", "emc_hz", "emc_locked", "requests"],
            "env": {"ROOT": str(root)},
            **options,
        },
    )
    assert isinstance(built, JetsonTarget)
    return built


def devfreq(root: Path) -> tuple[int, int]:
    node = root / DEVFREQ / GPU
    return int((node / "min_freq").read_text()), int((node / "max_freq").read_text())


def emc_state(root: Path) -> tuple[int, int]:
    return int((root / EMC / "rate").read_text()), int((root / EMC / "mrq_rate_locked").read_text())


def test_knobs_rails_and_metrics_are_read_from_the_device(root: Path) -> None:
    target = jetson_target(root)
    knobs = {k.name: k for k in target.describe_knobs()}
    assert knobs["gpu_hz"].choices == ORIN_GPU_HZ and knobs["gpu_hz"].default == 918_000_000
    assert knobs["emc_khz"].choices == ORIN_EMC_KHZ
    assert [r.label for r in target.rails] == ["VDD_IN"]  # the board input rail by default
    assert {"energy_j", "power_w", "energy_j_per_request"} <= set(target.describe_metrics())
    no_emc = make_jetson_tree(root.parent / "plain", emc_khz=None)
    assert {k.name for k in jetson_target(no_emc).describe_knobs()} == {"gpu_hz"}


def test_a_debugfs_this_user_cannot_enter_leaves_the_emc_clock_out(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without root, debugfs is closed (root ignores permissions, so the test says so)."""
    real = Path.exists

    def closed(path: Path, *args: Any, **kwargs: Any) -> bool:
        if "debug" in path.parts:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", closed)
    assert {k.name for k in jetson_target(root).describe_knobs()} == {"gpu_hz"}


@pytest.mark.parametrize("mode", ["pin", "floor"])
def test_a_trial_sets_clocks_measures_energy_and_restores(root: Path, mode: str) -> None:
    before = (devfreq(root), emc_state(root))
    with jetson_target(root, gpu_mode=mode) as target:
        outcome = target.run_trial({"gpu_hz": 510_000_000, "emc_khz": 665_600})
        assert outcome.status is TrialStatus.COMPLETED, outcome.reason
        assert (devfreq(root), emc_state(root)) == before
    m = outcome.metrics
    assert m["gpu_min"] == 510_000_000
    assert m["gpu_max"] == (510_000_000 if mode == "pin" else 918_000_000)
    assert (m["emc_hz"], m["emc_locked"]) == (665_600_000, 1)
    assert m["power_w"] == pytest.approx(10.0, rel=0.05)  # VDD_IN: 5 V x 2 A
    assert 10.0 * 0.3 <= m["energy_j"] <= 10.0 * 5
    assert m["energy_j_per_request"] == pytest.approx(m["energy_j"] / 4)


def test_devfreq_limits_are_written_in_a_safe_order(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = jetson_target(root)
    real = target.write

    def kernel_write(path: Path, text: str) -> None:
        if path.name in ("min_freq", "max_freq"):
            low, high = devfreq(root)
            low, high = (int(text), high) if path.name == "min_freq" else (low, int(text))
            if low > high:
                raise jetson.TargetError(f"EINVAL: {path.name} = {text}: min {low} > max {high}")
        real(path, text)

    target.write = kernel_write
    with target:
        for hz in (306_000_000, 918_000_000, 612_000_000, 408_000_000):
            outcome = target.run_trial({"gpu_hz": hz})
            assert outcome.status is TrialStatus.COMPLETED, outcome.reason
            assert outcome.metrics["gpu_min"] == outcome.metrics["gpu_max"] == hz


def test_an_emc_rate_bpmp_rounds_is_infeasible(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = jetson_target(root)
    real = target.write

    def bpmp_write(path: Path, text: str) -> None:
        if path.name == "rate":  # BPMP keeps the nearest rate it supports: 2133 MHz
            text = "2133000000"
        real(path, text)

    target.write = bpmp_write
    with target:
        outcome = target.run_trial({"emc_khz": 3_199_000})
    assert outcome.status is TrialStatus.INFEASIBLE
    assert "EMC rate 3199000 kHz not taken by BPMP (reads 2133000000 Hz)" in outcome.reason
    assert emc_state(root)[1] == 0  # unlocked again


def test_rails_are_selectable_and_unknown_ones_are_named(root: Path) -> None:
    target = jetson_target(root, rails=["VDD_IN", "VDD_CPU_GPU_CV"])
    assert [r.label for r in target.rails] == ["VDD_IN", "VDD_CPU_GPU_CV"]
    with pytest.raises(ValidationError) as info:
        jetson_target(root, rails=["NC"])
    assert info.value.field == "target.rails.NC" and "VDD_IN" in str(info.value)


def test_not_a_jetson_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="no Jetson GPU devfreq node"):
        jetson_target(tmp_path)
