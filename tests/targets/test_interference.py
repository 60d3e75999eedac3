"""The background load generator: it really loads the machine, and it never outlives its owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from targets.host.interference import Interference
from tuner.errors import ValidationError

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def test_each_load_runs_until_stopped(tmp_path: Path) -> None:
    load = Interference(cpu=1, duty=0.5, memory_mb=32, disk_mb_s=4, workdir=tmp_path)
    with load:
        cpu, memory, disk = load.pids
        assert load.disk_file is not None and load.disk_file.parent == tmp_path
        before = _cpu_seconds(cpu)
        size = load.disk_file.stat().st_size
        time.sleep(1.0)
        assert _cpu_seconds(cpu) - before > 0.05  # it spins (half of each period)
        assert _resident_mb(memory) >= 32
        assert load.disk_file.stat().st_size > size  # it writes
        disk_file = load.disk_file
    assert load.pids == [] and _gone_within([cpu, memory, disk], 5.0)
    assert not disk_file.exists() and list(tmp_path.iterdir()) == []
    load.stop()  # idempotent


SCRIPT = """
import sys, time
from targets.host.interference import Interference
load = Interference(cpu=1, memory_mb=8)
load.start()
print(*load.pids, flush=True)
time.sleep(600)
"""


def test_the_load_dies_with_its_owner_even_after_sigkill() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    try:
        assert owner.stdout is not None
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert _gone_within(pids, 10.0)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"cpu": -1}, "interference.cpu"),
        ({"cpu": 1, "duty": 0}, "interference.duty"),
        ({"memory_mb": 1.5}, "interference.memory_mb"),
        ({"disk_mb_s": -2}, "interference.disk_mb_s"),
    ],
)
def test_bad_levels_name_the_field(options: dict[str, float], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        Interference(**options)  # type: ignore[arg-type]
    assert info.value.field == field
