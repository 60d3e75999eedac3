"""The pipeline-parallel training workload (real PyTorch training on the CPU), and the
EnvPipe-style study end to end on two simulated GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from torch import nn

from cli.main import main
from runner.config import parse_config
from server.storage import SQLiteStorage
from targets.hardware import fake_nvml
from targets.hardware.fake_nvml import FakeDevice
from targets.workloads.pipeline import CLASSES, build_stages, train
from tuner.trial import StepKind, TrialStatus

ROOT = Path(__file__).resolve().parents[2]
RUN = [sys.executable, "-m", "targets.workloads.pipeline", "--seconds", "0.3", "--warmup-s", "0"]


def test_stages_hold_their_blocks_and_the_last_one_the_head() -> None:
    cpu = torch.device("cpu")
    stages = build_stages([3, 1], 16, [cpu, cpu])
    linears = [[m for m in s if isinstance(m, nn.Linear)] for s in stages]
    assert [len(x) for x in linears] == [3, 2]  # 3 blocks; 1 block + the head
    assert linears[1][-1].out_features == CLASSES


def test_training_lowers_the_loss_on_its_fixed_batch() -> None:
    cpu = torch.device("cpu")
    stages = build_stages([1, 1], 32, [cpu, cpu])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the program runs (--threads 1): no contention on busy CPUs
    try:
        first = train(stages, [cpu, cpu], 32, 64, 4, seconds=0.01, warmup_s=0, lr=0.2)
        later = train(stages, [cpu, cpu], 32, 64, 4, seconds=1.0, warmup_s=0, lr=0.2)
    finally:
        torch.set_num_threads(threads)
    assert later["steps"] >= 5
    assert later["loss"] < 0.5 * first["loss"]
    assert later["samples"] == later["requests"] == 64 * later["steps"]
    assert later["samples_per_s"] == pytest.approx(later["samples"] / later["seconds"])
    assert 0 < later["step_ms_p50"] <= later["step_ms_p99"]


def test_the_program_prints_one_json_line_and_rejects_bad_arguments() -> None:
    done = subprocess.run(
        [*RUN, "--devices", "cpu,cpu,cpu", "--layers", "1,2,1", "--width", "64"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    assert metrics["devices"] == ["cpu"] * 3 and metrics["layers"] == [1, 2, 1]
    assert metrics["steps"] >= 1
    bad = subprocess.run(
        [*RUN, "--devices", "cpu", "--layers", "1,1", "--microbatches", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "1 devices for 2 stages" in bad.stderr and "microbatches" in bad.stderr


def test_the_envpipe_example_has_a_clock_per_gpu_and_a_relative_bound() -> None:
    fake_nvml.configure([FakeDevice() for _ in range(4)])
    try:
        data = tomllib.loads((ROOT / "examples" / "envpipe.toml").read_text(encoding="utf-8"))
        data["target"]["nvml"] = "targets.hardware.fake_nvml"
        spec = parse_config(data, {}).spec
    finally:
        fake_nvml.configure([])
    assert spec.space.names == ("sm_mhz_0", "sm_mhz_1", "sm_mhz_2", "sm_mhz_3")
    assert [str(c) for c in spec.outcome_constraints] == ["samples_per_s >= 0.99 * default"]


@pytest.mark.slow
def test_an_envpipe_session_on_two_simulated_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (ROOT / "examples" / "envpipe.toml").read_text(encoding="utf-8")
    text = text.replace(
        "devices = [0, 1, 2, 3]", 'devices = [0, 1]\nnvml = "targets.hardware.fake_nvml"'
    )
    text = text.replace('"cuda:0,cuda:1,cuda:2,cuda:3"', '"cpu,cpu"').replace('"8,8,4,2"', '"2,1"')
    text = text.replace('"4096"', '"64"').replace('"512"', '"64"').replace('"python3"', "PY")
    text = text.replace(
        '"--seconds", "10", "--warmup-s", "3"', '"--seconds", "0.4", "--warmup-s", "0"'
    )
    text = text.replace("PY", json.dumps(sys.executable)).replace("settle_s = 1.0", "settle_s = 0")
    config = tmp_path / "envpipe.toml"
    config.write_text(text, encoding="utf-8")
    db = tmp_path / "tuner.db"
    devices = fake_nvml.configure([FakeDevice(), FakeDevice()])
    try:
        args = [
            "tune",
            str(config),
            "--trials",
            "4",
            "--db",
            str(db),
            "--plot",
            str(tmp_path / "p.png"),
            # one measurement per trial and no confirmation: this checks the EnvPipe study
            # (the protocol has its own tests), and each metric's identities hold per run
            "--max-repeats", "0", "--control-every", "0", "--confirm", "0",
        ]  # fmt: skip
        assert main(args) == 0
    finally:
        fake_nvml.configure([])
    assert all(d.locked_sm is None for d in devices)  # both GPUs restored
    with SQLiteStorage(db, read_only=True) as storage:
        trials = storage.list_trials("envpipe")
    assert len(trials) == 4 and trials[0].step is StepKind.DEFAULT
    assert all(t.status is TrialStatus.COMPLETED for t in trials), [t.reason for t in trials]
    default = trials[0].metrics
    assert default["sm_mhz_seen_0"] == default["sm_mhz_seen_1"] == 1980
    for t in trials:
        m = t.metrics
        assert m["gpu_energy_j"] == pytest.approx(m["gpu_energy_j_0"] + m["gpu_energy_j_1"])
        assert m["gpu_energy_j_per_request"] == pytest.approx(m["gpu_energy_j"] / m["requests"])
    flat = " ".join(capsys.readouterr().out.split())
    # the summary judges the trials by the bound resolved against the default's measured
    # throughput, and names it (6 digits); on a loaded machine all 3 other trials may miss it
    # ("only the default is feasible"), or the best may be feasible but slower than the default
    # ("no trial beat the default"), the one line that does not repeat the bound
    bound = f"samples_per_s >= {0.99 * default['samples_per_s']:.6g}"
    assert bound in flat or "no trial beat the default" in flat, flat
