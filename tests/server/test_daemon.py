"""``tuner daemon`` end to end: a real subprocess tuning examples/daemon_service.py (a real
program whose best setting depends on a load file the tests change), real BoTorch fits, a
real SQLite file, and SIGKILL/SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.config import load_config, parse_config
from server.storage import SQLiteStorage
from targets.host.signals import SIGTERM_EXIT_STATUS
from tuner.errors import ValidationError
from tuner.trial import StepKind, TrialStatus

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def write_config(tmp_path: Path, trials: int = 6, **daemon: Any) -> Path:
    """examples/daemon.toml with short windows, files under ``tmp_path``."""
    text = (ROOT / "examples" / "daemon.toml").read_text(encoding="utf-8")
    text = text.replace(
        '"python3", "examples/daemon_service.py"',
        f"{json.dumps(PY)}, {json.dumps(str(ROOT / 'examples/daemon_service.py'))}",
    )
    text = text.replace('"runs/load.txt", "--seconds", "0.5"',
                        f'{json.dumps(str(tmp_path / "load.txt"))}, "--seconds", "0.02", '
                        f'"--log", {json.dumps(str(tmp_path / "calls.txt"))}')  # fmt: skip
    text = text.replace("trials = 12 ", f"trials = {trials} ")
    text = text.replace('db = "runs/tuner.db"', f"db = {json.dumps(str(tmp_path / 'tuner.db'))}")
    head, _ = text.split("[daemon]")
    settings = {
        "state": str(tmp_path / "state.json"),
        "log": str(tmp_path / "events.log"),
        "windows_per_trial": 2,
        "watch": ["requests_per_s"],
        "drift": 0.25,
        "drift_windows": 2,
        "baseline_windows": 2,
        "interval_s": 0.0,
        **daemon,
    }
    lines = [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    path = tmp_path / "daemon.toml"
    path.write_text(head + "[daemon]\n" + "\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "load.txt").write_text("1.0\n")
    return path


def start(config: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PY, "-m", "cli.main", "daemon", str(config), *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def events(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "events.log"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def wait_for(
    tmp_path: Path,
    proc: subprocess.Popen[str],
    done: Callable[[list[dict[str, Any]]], bool],
    timeout: float = 240.0,
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = events(tmp_path)
        if done(seen):
            return seen
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"daemon exited {proc.returncode}: {err[-2000:]}; {seen[-3:]}")
        time.sleep(0.1)
    proc.kill()
    proc.communicate()
    raise AssertionError(f"timed out; last events {events(tmp_path)[-3:]}")


def names(seen: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in seen]


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


@pytest.mark.slow
def test_tunes_applies_watches_and_retunes_when_the_load_drifts(tmp_path: Path) -> None:
    config = write_config(tmp_path, max_windows=9)
    proc = start(config)
    wait_for(tmp_path, proc, lambda seen: "baseline" in names(seen))
    (tmp_path / "load.txt").write_text("0.6\n")  # the request rate falls by 40 %
    code, out, err = finish(proc)
    assert code == 0, err
    seen = events(tmp_path)
    assert [json.loads(line) for line in out.splitlines()] == seen  # stdout carries them too
    order = names(seen)
    assert order[0] == "start" and order[-1] == "stop"
    assert seen[-1]["reason"] == "limit reached"
    drift = order.index("drift")
    assert order.index("baseline") < drift < order.index("round")
    assert seen[drift]["change"]["requests_per_s"] == pytest.approx(0.4)
    assert seen[order.index("round")]["reason"] == "drift"
    applied = [e for e in seen if e["event"] == "applied"]
    assert [e["round"] for e in applied] == [1, 2]
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["round"] == 2 and state["phase"] == "watching" and state["windows"] == 9
    assert state["applied"] == applied[-1]["config"]
    with SQLiteStorage(tmp_path / "tuner.db", read_only=True) as storage:
        for study in ("daemon-example.r1", "daemon-example.r2"):
            trials = storage.list_trials(study)
            assert len(trials) == 6 and trials[0].step is StepKind.DEFAULT
            assert all(t.status is TrialStatus.COMPLETED for t in trials)
        second = storage.list_trials("daemon-example.r2")
        learns = storage.get_study("daemon-example.r2").spec.transfer_from
    assert all(t.metrics["requests_per_s"] == 600.0 for t in second)  # measured at the new load
    # the second round learns from the first: its design starts from the configuration the
    # first applied (unless that is the default, which every round measures first)
    assert [s.study for s in learns] == ["daemon-example.r1"]
    if applied[0]["config"] != second[0].config:
        assert second[1].step is StepKind.TRANSFER and second[1].config == applied[0]["config"]


@pytest.mark.slow
def test_a_round_without_a_feasible_trial_watches_the_default_configuration(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, trials=2, max_windows=1)
    text = config.read_text(encoding="utf-8").replace('"p99_ms <= 20"', '"p99_ms <= 0.001"')
    config.write_text(text, encoding="utf-8")
    code, _, err = finish(start(config))
    assert code == 0, err  # the watch window ran: the workload got the knobs' values
    seen = events(tmp_path)
    applied = next(e for e in seen if e["event"] == "applied")
    assert applied["config"] == {"workers": 4, "cache_mb": 64}
    assert "kept the default configuration" in applied["note"]
    window = names(seen).index("window")  # measured on it, and it breaks the SLO too
    assert names(seen)[window + 1 : window + 3] == ["slo_breach", "rollback"]
    assert seen[-1]["event"] == "stop" and seen[-1]["reason"] == "limit reached"


@pytest.mark.slow
def test_a_trial_that_breaks_the_slo_stops_after_one_window_and_rolls_back(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, trials=8, windows_per_trial=3, max_windows=1)
    (tmp_path / "load.txt").write_text("1.0\n")
    code, _, err = finish(start(config))
    assert code == 0, err
    seen = events(tmp_path)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    trials = [e for e in seen if e["event"] == "trial"]
    assert len(trials) == 8
    breached = [t for t in trials if t["metrics"]["p99_ms"] > 20]
    kept = [t for t in trials if t["metrics"]["p99_ms"] <= 20]
    assert breached and kept, "the design should hold both kinds (seeded)"
    windows = {}
    for t in trials:
        key = f"{t['config']['workers']} {t['config']['cache_mb']} 1.0"
        windows[t["trial"]] = calls.count(key)
    assert all(windows[t["trial"]] == 1 for t in breached)  # stopped after the first window
    applied = next(e for e in seen if e["event"] == "applied")
    for t in kept:  # every window measured (and the applied one once more, watching)
        assert windows[t["trial"]] == 3 + (t["config"] == applied["config"])
    order = names(seen)
    for t in breached:
        at = seen.index(t)
        assert order[at - 2 : at] == ["slo_breach", "rollback"]
        assert seen[at - 2]["window"] == 1 and "p99_ms <= 20" in seen[at - 2]["constraint"]
        assert seen[at - 1]["seconds"] < 1.0
    assert applied["config"] in [t["config"] for t in kept]


@pytest.mark.slow
def test_a_killed_daemon_resumes_watching_the_configuration_it_applied(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    proc = start(config)
    seen = wait_for(tmp_path, proc, lambda s: names(s).count("window") >= 3)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    applied = next(e for e in seen if e["event"] == "applied")
    with SQLiteStorage(tmp_path / "tuner.db", read_only=True) as storage:
        before = len(storage.list_trials("daemon-example.r1"))
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["phase"] == "watching" and state["baseline"] is not None
    windows = state["windows"]
    code, _, err = finish(start(config, "--max-windows", str(windows + 3)))
    assert code == 0, err
    after = events(tmp_path)[len(seen) :]
    resumed = [e for e in after if e["event"] in ("resume", "applied", "start", "round")]
    assert [e["event"] for e in resumed[:2]] == ["resume", "applied"]
    assert resumed[0]["phase"] == "watching" and resumed[0]["windows"] >= windows
    assert resumed[1]["config"] == applied["config"]
    assert not any(e["event"] in ("start", "round", "trial") for e in after)
    with SQLiteStorage(tmp_path / "tuner.db", read_only=True) as storage:
        assert len(storage.list_trials("daemon-example.r1")) == before == 6
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["windows"] == windows + 3 and state["baseline"] is not None


@pytest.mark.slow
def test_sigterm_restores_the_target_and_logs_the_stop(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    marker = tmp_path / "restored.txt"
    text = config.read_text().replace(
        "timeout_s = 30",
        f'timeout_s = 30\nrestore = [{json.dumps(PY)}, "-c", '
        f"\"open({str(marker)!r}, 'a').write('x')\"]",
    )
    config.write_text(text)
    proc = start(config)
    wait_for(tmp_path, proc, lambda s: "baseline" in names(s))
    before = marker.read_text().count("x")
    proc.send_signal(signal.SIGTERM)
    code, _, _ = finish(proc)
    assert code == SIGTERM_EXIT_STATUS
    last = events(tmp_path)[-1]
    assert last["event"] == "stop" and "signal" in last["reason"] and last["phase"] == "watching"
    assert marker.read_text().count("x") > before  # restored on the way out


@pytest.mark.slow
def test_ctrl_c_restores_the_target_logs_interrupted_and_exits_130(tmp_path: Path) -> None:
    """SIGINT, what Ctrl-C sends, while the round's best is applied: the daemon ends as
    ``tune`` does (130, the study saved), its stop event says it was interrupted, and the
    target is restored."""
    config = write_config(tmp_path)
    marker = tmp_path / "restored.txt"
    text = config.read_text().replace(
        "timeout_s = 30",
        f'timeout_s = 30\nrestore = [{json.dumps(PY)}, "-c", '
        f"\"open({str(marker)!r}, 'a').write('x')\"]",
    )
    config.write_text(text)
    # Python turns SIGINT into KeyboardInterrupt only where it is not ignored at start-up
    # (a test runner's worker may ignore it): set its own handler back, as in a terminal
    probe = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"from cli.main import main; sys.exit(main(['daemon', {str(config)!r}]))"
    )
    proc = subprocess.Popen(
        [PY, "-c", probe], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    wait_for(tmp_path, proc, lambda s: "applied" in names(s))
    before = marker.read_text().count("x") if marker.exists() else 0
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130, err
    assert "Traceback" not in err and "interrupted; the study is saved" in err
    last = events(tmp_path)[-1]
    assert last["event"] == "stop" and last["reason"] == "interrupted", last
    assert last["phase"] == "watching"
    assert marker.read_text().count("x") > before  # restored on the way out


def test_daemon_settings_are_validated_naming_the_field(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    loaded = load_config(config)
    assert loaded.daemon is not None and loaded.daemon.windows_per_trial == 2
    import tomllib

    base = tomllib.loads(config.read_text())
    for key, value, field in [
        ("drift_windows", 0, "daemon.drift_windows"),
        ("watch", ["qps"], "daemon.watch[0]"),
        ("watch", "p99_ms", "daemon.watch"),
        ("interval", 1, "daemon.interval"),
        ("drift", -1, "daemon.drift"),
        ("transfer", "yes", "daemon.transfer"),
    ]:
        data = json.loads(json.dumps(base))
        data["daemon"][key] = value
        with pytest.raises(ValidationError) as info:
            parse_config(data, {})
        assert info.value.field == field, (key, value)
    data = json.loads(json.dumps(base))
    data["study"]["objectives"].append({"name": "p99_ms", "goal": "minimize"})
    data["study"]["outcome_constraints"] = []
    with pytest.raises(ValidationError, match="Pareto front") as info:
        parse_config(data, {})
    assert info.value.field == "study.objectives"


def test_the_example_config_and_service_unit_are_valid() -> None:
    config = load_config(ROOT / "examples" / "daemon.toml")
    assert config.daemon is not None
    assert config.daemon.watch == ("requests_per_s", "power_w")
    unit = (ROOT / "examples" / "tuner-daemon.service").read_text()
    assert "ExecStart=/opt/tuner/.venv/bin/tuner daemon examples/daemon.toml" in unit
    assert "KillSignal=SIGTERM" in unit and "Restart=on-failure" in unit


@pytest.mark.slow
def test_the_gpu_example_tunes_applies_and_restores_a_simulated_gpu(tmp_path: Path) -> None:
    """examples/daemon_gpu.toml end to end on the fake NVML, the workload on the CPU in open
    loop at the rate in its load file; the GPU's clocks and power limit are back after."""
    from cli.main import main
    from targets.hardware import fake_nvml
    from targets.hardware.fake_nvml import FakeDevice

    text = (ROOT / "examples" / "daemon_gpu.toml").read_text(encoding="utf-8")
    replacements = {
        '"python3"': json.dumps(PY),
        '"encoder"': '"cnn"',
        '"runs/gpu-load.txt"': json.dumps(str(tmp_path / "load.txt")),
        '"--seconds", "3", "--warmup-s", "0.5"': '"--seconds", "0.3", "--warmup-s", "0"',
        '"--device", "cuda"': '"--device", "cpu"',
        "device = 0\n": 'device = 0\nnvml = "targets.hardware.fake_nvml"\n'
        + f"workdir = {json.dumps(str(ROOT))}\n",
        "settle_s = 0.5": "settle_s = 0",
        "trials = 8 ": "trials = 3 ",
        "initial_trials = 4": "initial_trials = 2",
        'db = "runs/tuner.db"': f"db = {json.dumps(str(tmp_path / 'tuner.db'))}",
        '"runs/daemon-gpu.daemon.json"': json.dumps(str(tmp_path / "state.json")),
        '"runs/daemon-gpu.log"': json.dumps(str(tmp_path / "events.log")),
        "baseline_windows = 3": "baseline_windows = 1",
        "interval_s = 1.0": "interval_s = 0",
        '"p99_ms <= 10"': '"p99_ms <= 1000"',  # a CPU serves the small model within it
    }
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    config = tmp_path / "daemon_gpu.toml"
    config.write_text(text, encoding="utf-8")
    (tmp_path / "load.txt").write_text("20\n")
    (device,) = fake_nvml.configure([FakeDevice()])
    try:
        assert main(["daemon", str(config), "--max-windows", "2"]) == 0
    finally:
        fake_nvml.configure([])
    assert device.locked_sm is None and device.limit_mw == device.default_limit_mw
    events = [json.loads(line) for line in (tmp_path / "events.log").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds.count("trial") == 3 and "applied" in kinds and kinds[-1] == "stop"
    with SQLiteStorage(tmp_path / "tuner.db", read_only=True) as storage:
        trials = storage.list_trials("daemon-gpu.r1")
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 3, [t.reason for t in trials]
    assert all(t.metrics["offered_per_s"] == 20.0 for t in trials)  # the load file's rate
    assert all(t.metrics["gpu_energy_j_per_request"] > 0 for t in trials)
