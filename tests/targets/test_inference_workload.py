"""The inference workload as a real subprocess, alone and metered by the cpufreq target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from targets.hardware.fake_sysfs import add_rapl_zone, make_cpufreq_tree
from targets.registry import build_target
from targets.workloads.inference import percentile
from tuner.trial import TrialStatus

ROOT = Path(__file__).resolve().parents[2]
RUN = [
    sys.executable,
    "-m",
    "targets.workloads.inference",
    "--seconds",
    "0.3",
    "--warmup-s",
    "0.05",
]


@pytest.mark.parametrize("model", ["encoder", "cnn"])
def test_the_workload_reports_consistent_metrics(model: str) -> None:
    done = subprocess.run(
        [*RUN, "--model", model, "--batch", "3", "--threads", "1", "--device", "cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    assert metrics["device"] == "cpu"
    assert metrics["requests"] == 3 * metrics["batches"] >= 3
    assert metrics["seconds"] >= 0.3
    assert metrics["requests_per_s"] == pytest.approx(metrics["requests"] / metrics["seconds"])
    assert 0 < metrics["p50_ms"] <= metrics["p99_ms"]


def test_bad_arguments_exit_2() -> None:
    done = subprocess.run([*RUN, "--batch", "0"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "batch" in done.stderr


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (
        50.0,
        99.0,
        100.0,
    )
    assert percentile([7.0], 99) == 7.0


def test_cpufreq_target_adds_energy_per_request(tmp_path: Path) -> None:
    root = make_cpufreq_tree(tmp_path / "sys")
    add_rapl_zone(root, "package-0", energy_uj=0)  # the fake counter does not move: 0 J
    options = {
        "sysfs": str(root),
        "command": [*RUN, "--model", "cnn", "--batch", "{batch}", "--threads", "1"],
        "metrics": ["requests", "requests_per_s", "p99_ms"],
        "workdir": str(ROOT),
    }
    with build_target("cpufreq", options) as target:
        assert "energy_j_per_request" in target.describe_metrics()
        outcome = target.run_trial({"cpu_khz": 1_600_000, "batch": 2})
    assert outcome.status is TrialStatus.COMPLETED, outcome.reason
    assert outcome.metrics["energy_j_per_request"] == 0.0 and outcome.metrics["requests"] >= 2


def _open_loop(*args: str) -> dict[str, float]:
    done = subprocess.run(
        [*RUN, "--model", "cnn", "--batch", "8", "--device", "cpu", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_open_loop_serves_poisson_arrivals_at_the_rate_asked(tmp_path: Path) -> None:
    rate_file = tmp_path / "rate.txt"
    rate_file.write_text("40\n")
    metrics = _open_loop("--rate-file", str(rate_file), "--seconds", "1.5")
    assert metrics["offered_per_s"] == 40.0
    arrivals = metrics["requests"] + metrics["unserved"]
    assert 30 <= arrivals <= 90  # Poisson with mean 60 (sd 7.7)
    assert metrics["requests"] >= 0.9 * arrivals  # about 5 ms a batch: the device keeps up
    assert metrics["requests_per_s"] == pytest.approx(metrics["requests"] / metrics["seconds"])
    assert metrics["batches"] <= metrics["requests"]  # a batch takes what has arrived
    assert 0 < metrics["p50_ms"] <= metrics["p99_ms"]


def test_over_capacity_the_queue_shows_in_p99_and_unserved_requests() -> None:
    metrics = _open_loop("--rate", "100000", "--seconds", "0.5")
    assert metrics["unserved"] > metrics["requests"] > 0
    assert metrics["requests_per_s"] < 0.1 * metrics["offered_per_s"]
    assert metrics["p99_ms"] >= 0.4 * 1000 * 0.5  # the requests waiting at the window's end


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--rate", "-3"], "rate"),
        (["--rate", "1e9", "--seconds", "1"], "rate x seconds"),
        (["--rate-file", "/nonexistent/rate.txt"], "rate-file"),
    ],
)
def test_bad_open_loop_arguments_exit_2_naming_them(args: list[str], named: str) -> None:
    done = subprocess.run([*RUN, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and named in done.stderr


def test_a_rate_file_without_a_number_is_named(tmp_path: Path) -> None:
    rate_file = tmp_path / "rate.txt"
    rate_file.write_text("fast\n")
    done = subprocess.run(
        [*RUN, "--rate-file", str(rate_file)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "expected a request rate" in done.stderr


def test_progress_lines_are_the_windows_of_a_command_target() -> None:
    """``--progress-every 2``: a line per two timed batches, which a command target with the
    documented pattern reports as windows; the JSON line stays the trial's metrics."""
    options = {
        "command": [*RUN, "--model", "cnn", "--batch", "2", "--device", "cpu",
                    "--progress-every", "2"],
        "metrics": ["requests_per_s", "p99_ms"],
        "progress": r"requests_per_s=(?P<requests_per_s>[0-9.e+]+) p99_ms=(?P<p99_ms>[0-9.e+]+)",
        "workdir": str(ROOT),
    }  # fmt: skip
    heard: list[dict[str, float]] = []
    with build_target("command", options) as target:
        outcome = target.run_trial({}, lambda window: heard.append(window) or "")
    assert outcome.status is TrialStatus.COMPLETED, outcome.reason
    assert heard and all(w["requests_per_s"] > 0 and w["p99_ms"] > 0 for w in heard)
    assert set(outcome.metrics) >= {"requests_per_s", "p99_ms", "batches"}
    assert len(heard) == int(outcome.metrics["batches"]) // 2
