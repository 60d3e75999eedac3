"""The SM clock set per pipeline stage, in time, on one GPU.

EnvPipe (Choi et al., USENIX ATC 2023) lowers the SM clock of the GPUs whose pipeline stages
have slack; on one GPU all stages share one clock, so a stage-wise choice only shows if the
clock follows the stages as they run, as Perseus (Chung et al., SOSP 2024) does with a
frequency schedule per pipeline instruction. ``StageClocks`` does that for a
``torch.nn.Module`` per stage: hooks before each stage's forward and before its backward
(on the gradient of its output) wait for the GPU to finish the work queued so far
(``sync``: the switch must land between two stages' kernels, not when the host queues
them) and lock the SM clock at the stage's level through the ``nvgpu`` target
(``NvidiaGpuTarget.lock_sm``; the top level unlocks).
A stage whose clock is already set costs nothing; ``switches`` and ``switch_s`` (the
seconds spent in NVML calls) say what the schedule cost. The waits are the larger price of
switching in time: they stop the host from queuing the next stage ahead, which is why
``bench.gpu_device stages`` measures the switching cost first, against the same job without
hooks::

    clocks = StageClocks(target.lock_sm, [1980, 1200, 1980, 1200], torch.cuda.synchronize)
    with clocks.installed(stages):
        train(stages, ...)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any


class StageClocks:
    """Lock the SM clock at ``schedule[i]`` MHz while stage ``i`` runs (module doc).

    Args:
        lock: Sets the clock now, in MHz (``NvidiaGpuTarget.lock_sm``).
        schedule: One clock per stage.
        sync: Waits for the device's queued work (``torch.cuda.synchronize``); on a CPU
            nothing is queued, so a no-op will do.
        current: The clock set before the first stage runs (None: unknown, set it).
    """

    def __init__(
        self,
        lock: Callable[[int], None],
        schedule: Sequence[int],
        sync: Callable[[], None] = lambda: None,
        current: int | None = None,
    ) -> None:
        if not schedule or any(int(mhz) <= 0 for mhz in schedule):
            raise ValueError(f"schedule: one positive clock (MHz) per stage, got {schedule!r}")
        self.lock, self.schedule, self.sync = lock, [int(m) for m in schedule], sync
        self.current = current
        self.switches = 0
        self.switch_s = 0.0
        self.entered = 0
        #: Seconds each stage ran between two switches (the time from one switch to the
        #: next, after the wait, is the previous stage's): a profile of the job when every
        #: stage boundary switches.
        self.stage_s = [0.0] * len(self.schedule)
        self._since: tuple[int, float] | None = None

    def enter(self, stage: int) -> None:
        """Stage ``stage`` starts: wait for the queued work, then set its clock if it is
        not set already."""
        self.entered += 1
        want = self.schedule[stage]
        if want == self.current:
            return
        self.sync()
        started = time.perf_counter()
        if self._since is not None:
            before, since = self._since
            self.stage_s[before] += started - since
        self.lock(want)
        ended = time.perf_counter()
        self.switch_s += ended - started
        self.switches += 1
        self.current = want
        self._since = (stage, ended)

    @contextmanager
    def installed(self, stages: Sequence[Any]) -> Iterator[StageClocks]:
        """Hooks on each stage's forward and backward for the duration; the clock the
        schedule set last stays (the caller's restore resets it)."""
        if len(stages) != len(self.schedule):
            raise ValueError(f"{len(stages)} stages for a schedule of {len(self.schedule)}")
        handles = []
        for i, stage in enumerate(stages):
            handles.append(stage.register_forward_pre_hook(self._forward(i)))
            handles.append(stage.register_forward_hook(self._backward(i)))
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _forward(self, stage: int) -> Callable[..., None]:
        def hook(module: Any, inputs: Any) -> None:
            self.enter(stage)

        return hook

    def _backward(self, stage: int) -> Callable[..., None]:
        """After the stage's forward: a hook on its output's gradient, which autograd
        computes just before the stage's own backward starts."""

        def entered(grad: Any) -> None:
            self.enter(stage)

        def hook(module: Any, inputs: Any, output: Any) -> None:
            if getattr(output, "requires_grad", False):
                output.register_hook(entered)

        return hook
