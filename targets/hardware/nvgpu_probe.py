"""What an NVIDIA GPU's SM clock really does under load: the check that clocks were restored.

NVML has no getter for a locked clock, and an idle GPU drops to its lowest clock whether or
not a lock is set, so reading the clock of an idle GPU proves nothing. ``sm_clock_under_load``
runs a matrix-product load on the GPU for a moment and returns the median SM clock NVML
reports while it runs: with a lock at ``f`` MHz it stays at or below ``f``; without one it
rises towards the boost clock (less what the power limit or heat take). The real-GPU tests
and ``bench/gpu_device.py`` use it before and after a restore.
"""

from __future__ import annotations

import statistics
import threading
import time
from types import ModuleType
from typing import Any

SAMPLE_S = 0.02
WARMUP_S = 0.15


def sm_clock_under_load(
    nvml: ModuleType, handle: Any, seconds: float = 0.8, device: str = "cuda"
) -> float:
    """The median SM clock (MHz) while a bf16 matrix-product load runs for ``seconds``."""
    import torch

    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        time.sleep(WARMUP_S)
        while not done.wait(SAMPLE_S):
            samples.append(int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))

    thread = threading.Thread(target=sample, name="sm-clock-sample", daemon=True)
    thread.start()
    end = time.monotonic() + max(seconds, WARMUP_S + 5 * SAMPLE_S)
    try:
        while time.monotonic() < end:
            for _ in range(16):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize(device)
    finally:
        done.set()
        thread.join()
    if not samples:
        raise RuntimeError("no SM clock sample was read while the load ran")
    return float(statistics.median(samples))
