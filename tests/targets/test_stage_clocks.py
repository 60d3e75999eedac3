"""targets.hardware.stage_clocks on the simulated GPU: the clock follows the stages of a real
(CPU) training step, forward in order and backward in reverse, and restore resets it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from bench import gpu_device
from targets.hardware import fake_nvml
from targets.hardware.fake_nvml import FakeDevice
from targets.hardware.stage_clocks import StageClocks
from targets.workloads.pipeline import build_stages, train

CPU = torch.device("cpu")


@pytest.fixture
def gpu() -> Iterator[FakeDevice]:
    (device,) = fake_nvml.configure([FakeDevice()])
    yield device
    fake_nvml.configure([])


def test_each_stage_runs_at_its_clock_forward_and_backward_and_restore_unlocks(
    gpu: FakeDevice,
) -> None:
    target = gpu_device.gpu_target("targets.hardware.fake_nvml")
    top = max(gpu.sm_clocks)
    low = sorted(gpu.sm_clocks)[len(gpu.sm_clocks) // 2]
    kinds = ["gemm", "memory", "gemm", "memory"]
    stages = build_stages([1, 1, 1, 1], 16, [CPU] * 4, kinds=kinds)
    seen: list[int | None] = []  # the device's lock after every switch, as NVML holds it

    def lock(mhz: int) -> None:
        target.lock_sm(mhz)
        seen.append(None if gpu.locked_sm is None else gpu.locked_sm[1])

    clocks = StageClocks(lock, gpu_device.schedule(kinds, top, low), current=top)
    with target:
        with clocks.installed(stages):
            got = train(stages, [CPU] * 4, 16, 8, 2, seconds=0.001, warmup_s=0)
        steps = int(got["steps"])
        # per micro-batch: forward 0 (top, already set) 1 low 2 top 3 low, backward 3 (low,
        # set) 2 top 1 low 0 top: six switches, alternating, the top level unlocked
        assert seen == [low, None] * 3 * 2 * steps
        assert clocks.switches == len(seen) and clocks.entered == 8 * 2 * steps
        assert all(s > 0 for s in clocks.stage_s)
        train(stages, [CPU] * 4, 16, 8, 2, seconds=0.001, warmup_s=0)  # hooks removed
        assert clocks.switches == len(seen)
        lock(low)
    assert gpu.locked_sm is None  # restore unlocked the clock the schedule left


def test_a_schedule_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="one positive clock"):
        StageClocks(lambda mhz: None, [])
    with pytest.raises(ValueError, match="one positive clock"):
        StageClocks(lambda mhz: None, [1980, 0])
    clocks = StageClocks(lambda mhz: None, [1980, 1200, 1980])
    two = build_stages([1, 1], 8, [CPU, CPU])
    with pytest.raises(ValueError, match="2 stages for a schedule of 3"), clocks.installed(two):
        pass


def test_memory_stages_are_layer_norms_and_an_unknown_kind_is_named() -> None:
    gemm, memory = build_stages([1, 1], 8, [CPU, CPU], kinds=["gemm", "memory"])
    assert isinstance(gemm[0], torch.nn.Linear) and isinstance(memory[0], torch.nn.LayerNorm)
    with pytest.raises(ValueError, match=r"stage 1: kind 'conv' \(allowed: gemm, memory\)"):
        build_stages([1, 1], 8, [CPU, CPU], kinds=["gemm", "conv"])
