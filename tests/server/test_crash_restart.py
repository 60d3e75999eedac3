"""A server killed with SIGKILL mid-study restarts on the same file and continues the study.

Runs the real ``tuner serve`` in a subprocess on 127.0.0.1 (port 0, read back from its log),
drives it with the Python client, kills it without warning, starts it again on the same
database and checks that completed trials are intact and that the ACTIVE trial goes back to
the client it was handed to.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.client import TunerClient
from server.storage import SQLiteStorage
from tuner.study import StudySpec
from tuner.trial import TrialStatus

SPEC = StudySpec.from_dict(
    {
        "name": "crash",
        "knobs": [
            {"name": "x", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5},
            {"name": "mode", "kind": "categorical", "choices": ["a", "b", "c"], "default": "a"},
        ],
        "objectives": [{"name": "y", "goal": "minimize"}],
        "designer": {"algorithm": "sobol", "seed": 3},
    }
)
_ADDRESS = re.compile(r"tuner serving \S+ on (\S+:\d+)")


class ServerProcess:
    """``tuner serve`` in a subprocess; ``address`` is read from its startup log line."""

    def __init__(self, db: Path, log: Path) -> None:
        self.log = log
        self._out = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--db", str(db), "--port", "0"],
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        self.address = self._wait_for_address()

    def _wait_for_address(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            matches = _ADDRESS.findall(self.log.read_text(errors="replace"))
            if matches:
                return str(matches[-1])
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited early:\n{self.log.read_text()}")
            time.sleep(0.1)
        raise AssertionError(f"server did not start:\n{self.log.read_text()}")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._out.close()

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self._out.close()
        return code


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "studies.db"


def test_sigkill_mid_study_then_restart_continues(db: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    first = ServerProcess(db, log)
    assert first.address.startswith("127.0.0.1:"), "tuner serve binds loopback by default"
    try:
        with TunerClient(first.address) as client:
            client.wait_ready(30)
            client.create_study(SPEC)
            done = []
            for i in range(4):
                (trial,) = client.suggest_trials("crash", 1, client_id="worker-1")
                done.append(client.complete_trial("crash", trial.id, {"y": float(i)}))
            (active,) = client.suggest_trials("crash", 1, client_id="worker-1")
            (other,) = client.suggest_trials("crash", 1, client_id="worker-2")
    finally:
        first.kill()
    assert first.proc.returncode == -signal.SIGKILL

    second = ServerProcess(db, tmp_path / "server-2.log")
    try:
        with TunerClient(second.address) as client:
            client.wait_ready(30)
            _, created = client.create_study(SPEC)
            assert not created
            trials = {t.id: t for t in client.list_trials("crash")}
            for before in done:
                after = trials[before.id]
                assert after.status is TrialStatus.COMPLETED
                assert after.metrics == before.metrics
                assert after.config == before.config
            (again,) = client.suggest_trials("crash", 1, client_id="worker-1")
            assert (again.id, again.config) == (active.id, active.config)
            (again2,) = client.suggest_trials("crash", 1, client_id="worker-2")
            assert again2.id == other.id
            client.complete_trial("crash", again.id, {"y": -1.0})
            (fresh,) = client.suggest_trials("crash", 1, client_id="worker-1")
            assert fresh.id not in trials
            assert client.get_best_trial("crash").id == again.id
    finally:
        assert second.terminate() == 0

    with SQLiteStorage(db, read_only=True) as storage:
        assert storage.integrity_check() == "ok"
        assert len(storage.list_trials("crash", [TrialStatus.COMPLETED])) == 5


def test_sigterm_shuts_down_gracefully_and_keeps_data(db: Path, tmp_path: Path) -> None:
    server = ServerProcess(db, tmp_path / "server.log")
    with TunerClient(server.address) as client:
        client.wait_ready(30)
        client.create_study(SPEC)
        (trial,) = client.suggest_trials("crash", 1, client_id="w")
        client.complete_trial("crash", trial.id, {"y": 1.0})
    assert server.terminate() == 0
    assert "shutting down" in (tmp_path / "server.log").read_text()
    with SQLiteStorage(db, read_only=True) as storage:
        assert storage.get_trial("crash", trial.id).metrics == {"y": 1.0}
