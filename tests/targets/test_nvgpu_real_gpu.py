"""The NVIDIA GPU target on a real GPU: clocks and power limit set, read back and restored.

Marked ``gpu``; each test is skipped, with the reason, where there is no NVIDIA GPU or no
root. A locked clock cannot be read through NVML and an idle GPU sits at its lowest clock, so
every check runs a load (``targets.hardware.nvgpu_probe.sm_clock_under_load``): while a lock at
``f`` is set the SM clock under load stays at or below ``f``; after the restore it rises well above.
The power limit is read back directly. Each exit path is checked: a completed trial, a
workload that fails, one that runs past its timeout, and a session stopped by SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from targets.hardware.nvgpu import NvidiaGpuTarget
from targets.registry import build_target
from tuner.trial import TrialStatus

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
LOCK_SLACK_MHZ = 30  # a locked clock reads at most this much above the lock under load
RESTORED_MHZ = 250  # after the restore, the clock under load is at least this much higher


def _real_gpu() -> str | None:
    """Why the real-GPU tests cannot run here, or None when they can."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:
        return f"no NVIDIA GPU here ({type(exc).__name__}: {exc})"
    if count == 0:
        return "NVML found no GPU"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "setting GPU clocks needs root"
    return None


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_real_gpu() is not None, reason=str(_real_gpu())),
]


def _target(command: list[str], **options: Any) -> NvidiaGpuTarget:
    target = build_target(
        "nvgpu",
        {
            "command": command,
            "metrics": ["requests"],
            "workdir": str(ROOT),
            "settle_s": 0.5,
            **options,
        },
    )
    assert isinstance(target, NvidiaGpuTarget)
    return target


def _low(target: NvidiaGpuTarget) -> tuple[int, int | None]:
    """A low SM clock (about a third of the range) and the lowest power limit."""
    knobs = {k.name: k for k in target.describe_knobs()}
    sm = knobs["sm_mhz"].choices  # type: ignore[attr-defined]
    power = knobs["power_w"].choices if "power_w" in knobs else (None,)  # type: ignore[attr-defined]
    return int(sm[len(sm) // 3]), power[0]


def _clock(target: NvidiaGpuTarget) -> float:
    from targets.hardware.nvgpu_probe import sm_clock_under_load

    return sm_clock_under_load(target.nvml, target.handle)


@pytest.fixture
def unlocked() -> Iterator[float]:
    """The SM clock under load with nothing locked, measured before the test."""
    target = _target([PY, "-c", "pass"])
    target.reset_device()
    yield _clock(target)
    target.reset_device()


def _assert_restored(target: NvidiaGpuTarget, locked: int, power_mw: int) -> float:
    import pynvml

    assert pynvml.nvmlDeviceGetPowerManagementLimit(target.handle) == power_mw
    after = _clock(target)
    assert after >= locked + RESTORED_MHZ, f"SM clock {after} MHz under load, lock was {locked}"
    return after


def test_a_completed_trial_locks_the_clock_then_restores_it(unlocked: float) -> None:
    import pynvml

    target = _target(
        [
            PY,
            "-m",
            "targets.workloads.inference",
            "--batch",
            "512",
            "--seconds",
            "2",
            "--device",
            "cuda",
        ],
        metrics=["requests", "requests_per_s", "p99_ms"],
    )
    sm, power = _low(target)
    before = pynvml.nvmlDeviceGetPowerManagementLimit(target.handle)
    config: dict[str, Any] = {"sm_mhz": sm} | ({"power_w": power} if power else {})
    with target:
        outcome = target.run_trial(config)
        top = target.run_trial({})
    assert outcome.status is TrialStatus.COMPLETED, outcome.reason
    assert top.status is TrialStatus.COMPLETED, top.reason
    m, t = outcome.metrics, top.metrics
    assert m["sm_mhz_seen"] <= sm + LOCK_SLACK_MHZ
    assert m["gpu_power_w"] < t["gpu_power_w"]
    assert m["requests_per_s"] < t["requests_per_s"]
    after = _assert_restored(target, sm, before)
    print(
        f"real GPU {target.name}: unlocked {unlocked:.0f} MHz under load; trial at {sm} MHz "
        f"/ {power} W saw {m['sm_mhz_seen']:.0f} MHz, {m['gpu_power_w']:.0f} W, "
        f"{m['requests_per_s']:.0f} req/s, {m['gpu_energy_j_per_request'] * 1000:.3f} mJ/req; "
        f"default clocks {t['sm_mhz_seen']:.0f} MHz, {t['gpu_power_w']:.0f} W, "
        f"{t['requests_per_s']:.0f} req/s, {t['gpu_energy_j_per_request'] * 1000:.3f} mJ/req; "
        f"restored {after:.0f} MHz"
    )


def _lock_then(seen: Path, tail: str) -> list[str]:
    """A workload that writes the SM clock it saw under load to ``seen``, then runs ``tail``."""
    script = (
        "import json, pynvml, sys\n"
        "from targets.hardware.nvgpu_probe import sm_clock_under_load\n"
        "pynvml.nvmlInit()\n"
        "seen = sm_clock_under_load(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))\n"
        f"open({str(seen)!r}, 'w').write(json.dumps(seen))\n"
        f"{tail}\n"
    )
    return [PY, "-c", script]


@pytest.mark.parametrize(
    ("case", "tail", "status"),
    [
        ("failure", "sys.exit(3)", TrialStatus.FAILED),
        ("timeout", "import time; time.sleep(60)", TrialStatus.TIMED_OUT),
    ],
)
def test_the_clock_is_restored_when_the_workload_fails_or_times_out(
    unlocked: float, case: str, tail: str, status: TrialStatus, tmp_path: Path
) -> None:
    import pynvml

    seen = tmp_path / "seen.json"
    target = _target(_lock_then(seen, tail), timeout_s=12)
    sm, power = _low(target)
    before = pynvml.nvmlDeviceGetPowerManagementLimit(target.handle)
    config: dict[str, Any] = {"sm_mhz": sm} | ({"power_w": power} if power else {})
    with target:
        outcome = target.run_trial(config)
    assert outcome.status is status, outcome.reason
    during = json.loads(seen.read_text())
    assert during <= sm + LOCK_SLACK_MHZ
    after = _assert_restored(target, sm, before)
    print(f"{case}: {during:.0f} MHz during (lock {sm}), {after:.0f} after, {unlocked:.0f} free")


def test_the_clock_is_restored_when_the_session_gets_sigterm(
    unlocked: float, tmp_path: Path
) -> None:
    import pynvml

    target = _target([PY, "-c", "pass"])
    sm, power = _low(target)
    before = pynvml.nvmlDeviceGetPowerManagementLimit(target.handle)
    session = textwrap.dedent(
        f"""
        import sys
        from targets.registry import build_target
        from targets.host.signals import terminate_on_sigterm
        command = [sys.executable, "-c", "import time; time.sleep(60)"]
        target = build_target("nvgpu", dict(command=command, metrics=["requests"], settle_s=0))
        config = dict(sm_mhz={sm}) | ({{"power_w": {power}}} if {power!r} else {{}})
        with terminate_on_sigterm(), target:
            print("applying", flush=True)
            target.run_trial(config)
        """
    )
    with subprocess.Popen(
        [PY, "-c", session], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "applying"
            time.sleep(1.5)  # the lock is set and the workload sleeps
            during = _clock(target)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 128 + signal.SIGTERM
        finally:
            process.kill()
    assert during <= sm + LOCK_SLACK_MHZ
    after = _assert_restored(target, sm, before)
    print(f"SIGTERM: {during:.0f} MHz during (lock {sm}), {after:.0f} after, {unlocked:.0f} free")


def test_the_default_configuration_leaves_the_clock_unlocked(unlocked: float) -> None:
    """The top SM level is the GPU as it comes: applied after a lock, it lifts the lock (the
    clock under load rises to where it runs unlocked) and keeps the power limit in force."""
    import pynvml

    target = _target([PY, "-c", "pass"])
    knobs = {k.name: k for k in target.describe_knobs()}
    defaults: dict[str, Any] = {name: knob.default for name, knob in knobs.items()}
    sm, _ = _low(target)
    before = pynvml.nvmlDeviceGetPowerManagementLimit(target.handle)
    with target:
        target.apply({"sm_mhz": sm})
        locked = _clock(target)
        target.apply(defaults)  # no restore between: the defaults alone must unlock
        as_it_comes = _clock(target)
        assert pynvml.nvmlDeviceGetPowerManagementLimit(target.handle) == before
    assert locked <= sm + LOCK_SLACK_MHZ
    assert as_it_comes >= sm + RESTORED_MHZ
    assert as_it_comes >= unlocked - 2 * LOCK_SLACK_MHZ, (as_it_comes, unlocked)
    _assert_restored(target, sm, before)
    print(f"defaults: {as_it_comes:.0f} MHz under load (unlocked {unlocked:.0f}, lock {sm} gave "
          f"{locked:.0f}); power limit {before / 1000:g} W kept")  # fmt: skip
