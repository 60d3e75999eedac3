"""The privileged helper over a real Unix socket: the cpufreq and nvgpu targets writing
through it (fake sysfs tree, fake NVML in this process), and everything it must refuse."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from targets.hardware import fake_nvml
from targets.hardware.fake_nvml import FakeDevice
from targets.hardware.fake_sysfs import make_cpufreq_tree
from targets.hardware.helper import HelperClient, HelperServer, Policy
from targets.registry import build_target
from tuner.errors import ConfigRejected, TargetError, ValidationError
from tuner.trial import TrialStatus

PY = sys.executable
CPUFREQ = Path("devices") / "system" / "cpu" / "cpufreq"
SLEEP = [PY, "-c", "import json; print(json.dumps(dict(requests=4)))"]


class Running:
    def __init__(self, socket_path: Path, roots: list[Path]) -> None:
        self.path = socket_path
        self.records: list[dict[str, Any]] = []
        self.server = HelperServer(socket_path, Policy(roots, set(), fake_nvml))
        self.server.log = self._log  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _log(self, uid: int, request: Any, reply: dict[str, Any]) -> None:
        self.records.append({"uid": uid, "request": request, "reply": reply})

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_cpufreq_tree(tmp_path / "sys")


@pytest.fixture
def helper(tmp_path: Path, tree: Path) -> Iterator[Running]:
    running = Running(tmp_path / "helper.sock", [tree])
    yield running
    running.stop()


def test_the_cpufreq_target_writes_only_through_the_helper(
    helper: Running, tree: Path, tmp_path: Path
) -> None:
    target = build_target(
        "cpufreq",
        {"sysfs": str(tree), "command": SLEEP, "metrics": ["requests"], "helper": str(helper.path)},
    )
    policy = tree / CPUFREQ / "policy0"
    with target:
        outcome = target.run_trial({"cpu_khz": 1_200_000})
    assert outcome.status is TrialStatus.COMPLETED, outcome.reason
    writes = [r["request"] for r in helper.records if r["request"]["op"] == "write"]
    assert {Path(w["path"]).name for w in writes} == {"scaling_min_freq", "scaling_max_freq"}
    assert {"path": str(policy / "scaling_max_freq"), "value": "1200000", "op": "write"} in writes
    assert all(r["reply"] == {"ok": True} for r in helper.records)
    assert (policy / "scaling_max_freq").read_text().strip() == "2800000"  # restored, by it too


def test_gpu_setters_go_through_the_helper_and_invalid_values_are_infeasible(
    helper: Running,
) -> None:
    (device,) = fake_nvml.configure([FakeDevice()])
    try:
        options = {
            "nvml": "targets.hardware.fake_nvml", "command": SLEEP, "metrics": ["requests"],
            "settle_s": 0, "helper": str(helper.path),
        }  # fmt: skip
        with build_target("nvgpu", options) as target:
            ok = target.run_trial({"sm_mhz": 990, "power_w": 300})
            bad = target.run_trial({"power_w": 900})  # outside the device's limits
        assert ok.status is TrialStatus.COMPLETED, ok.reason
        assert "SetGpuLockedClocks 990 990" in device.calls
        assert device.locked_sm is None and device.limit_mw == 700_000
        assert bad.status is TrialStatus.INFEASIBLE
        calls = [r["request"]["call"] for r in helper.records if r["request"]["op"] == "nvml"]
        assert "nvmlDeviceSetGpuLockedClocks" in calls and "nvmlDeviceResetGpuLockedClocks" in calls
    finally:
        fake_nvml.configure([])


def test_the_helper_refuses_what_it_was_not_started_for(
    helper: Running, tree: Path, tmp_path: Path
) -> None:
    client = HelperClient(helper.path)
    policy = tree / CPUFREQ / "policy0"
    outside = tmp_path / "elsewhere" / "scaling_max_freq"
    outside.parent.mkdir()
    outside.write_text("1\n")
    link = policy / "escape"
    link.symlink_to(outside.parent)
    cases = [
        (lambda: client.write(outside, "5", "x"), "outside the allowed roots"),
        (lambda: client.write(link / "scaling_max_freq", "5", "x"), "outside the allowed roots"),
        (lambda: client.write(policy / ".." / ".." / "x" / "rate", "5", "x"), "does not exist"),
        (lambda: client.write(policy / "scaling_governor", "5", "x"), "not a writable attribute"),
        (lambda: client.write(policy / "scaling_max_freq", "1; reboot", "x"), "decimal integer"),
        (lambda: client.nvml("nvmlDeviceSetPersistenceMode", 0, 1), "not an allowed NVML call"),
        (lambda: client.nvml("nvmlDeviceSetGpuLockedClocks", 0, 990), "takes 2 integers"),
        (lambda: client.nvml("nvmlDeviceSetGpuLockedClocks", 99, 1, 1), "GPU index"),
    ]
    for call, fragment in cases:
        with pytest.raises(TargetError, match="privileged helper refused") as info:
            call()
        assert fragment in str(info.value)
    assert outside.read_text() == "1\n"
    assert (policy / "scaling_max_freq").read_text().strip() == "2800000"
    assert client.ping()["uid"] == os.getuid()


def test_peers_of_other_users_are_refused(helper: Running) -> None:
    helper.server.policy.allowed_uids = {os.getuid() + 12345}
    with pytest.raises(TargetError, match=f"uid {os.getuid()} is not allowed"):
        HelperClient(helper.path).ping()


def test_an_unreachable_helper_says_how_to_start_it(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match=r"python -m targets\.hardware\.helper --socket"):
        HelperClient(tmp_path / "none.sock").ping()
    with pytest.raises(ValidationError) as info:
        root = str(make_cpufreq_tree(tmp_path / "s"))
        options = {"sysfs": root, "command": SLEEP, "metrics": ["requests"], "helper": 5}
        build_target("cpufreq", options)
    assert info.value.field == "target.helper"


def test_rejected_values_become_config_rejected(helper: Running) -> None:
    fake_nvml.configure([FakeDevice()])
    fake_nvml.nvmlInit()  # as the helper program does at start
    try:
        with pytest.raises(ConfigRejected):
            HelperClient(helper.path).nvml("nvmlDeviceSetPowerManagementLimit", 0, 9_000_000)
    finally:
        fake_nvml.configure([])


def test_the_helper_program_serves_until_sigterm(tmp_path: Path, tree: Path) -> None:
    sock = tmp_path / "h.sock"
    proc = subprocess.Popen(
        [PY, "-m", "targets.hardware.helper", "--socket", str(sock), "--root", str(tree)],
        cwd=Path(__file__).resolve().parents[2],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        client = HelperClient(sock)
        assert client.ping()["ok"]
        client.write(tree / CPUFREQ / "policy0" / "scaling_min_freq", "1200000", "x")
        assert (tree / CPUFREQ / "policy0" / "scaling_min_freq").read_text() == "1200000"
        with pytest.raises(TargetError, match="started without --nvml"):
            client.nvml("nvmlDeviceResetGpuLockedClocks", 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert not sock.exists()
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert logged[0]["event"] == "listening"
    assert any(r.get("request", {}) and r["request"].get("op") == "write" for r in logged[1:])
