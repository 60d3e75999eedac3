"""NVIDIA GPU clocks and power limit as knobs, through NVML, with the energy of a workload.

Knobs, read from the device (``nvmlDeviceGetSupported*Clocks``, the power-limit
constraints): ``sm_mhz`` (the supported graphics clocks at the highest memory clock, as
ordinal levels; ``sm_levels = N`` keeps N of them evenly spread), ``mem_mhz`` (only where the
device lists more than one memory clock) and ``power_w`` (``power_step_w`` steps between the
limits, plus the default limit). Every knob defaults to the device's default, so the first
trial measures the GPU as it comes::

    [target]
    kind = "nvgpu"
    command = ["python3", "-m", "targets.inference", "--batch", "{batch}", "--device", "cuda"]
    metrics = ["requests", "requests_per_s", "p99_ms"]
    device = 0
    settle_s = 1.5      # after the clocks change, before the workload starts

Each trial locks the SM clock (``nvmlDeviceSetGpuLockedClocks(f, f)``), the memory clock
(``SetMemoryLockedClocks``, Ampere and later) and sets the power limit, reads them back,
waits ``settle_s``, runs the workload command as the command target does, and reports
``gpu_energy_j`` (the total-energy counter where the GPU has one, Volta and later; otherwise
power sampled every 50 ms and integrated), ``gpu_power_w``, ``sm_mhz_seen`` (the mean SM
clock while it ran: lower than asked when the power limit or heat caps it) and
``gpu_energy_j_per_request`` when the workload reports ``requests``. A power limit that does
not read back, or a clock NVML refuses as invalid, makes the trial INFEASIBLE. Restore resets
the locked clocks and puts the original power limit back, after every trial and at close,
on every exit path (with ``terminate_on_sigterm``, SIGTERM too).

NVML's setters need root; without it the trial fails with a message that says so. The NVML
module is imported when the target is built (``nvml = "pynvml"``, from ``nvidia-ml-py``);
``nvml = "targets.fake_nvml"`` selects the simulated GPU that the tests use.
"""

from __future__ import annotations

import importlib
import time
from types import ModuleType
from typing import Any, ClassVar

from targets.base import option_int, option_number
from targets.command import CommandTarget
from targets.device import DeviceTarget, SampledPower
from tuner.errors import ConfigRejected, TargetError, ValidationError
from tuner.space import Config, Knob, OrdinalKnob

KNOBS = ("sm_mhz", "mem_mhz", "power_w")
POWER_SAMPLE_S = 0.05


class NvidiaGpuTarget(DeviceTarget):
    """SM clock, memory clock and power limit of one NVIDIA GPU (see the module doc)."""

    kind: ClassVar[str] = "nvgpu"
    energy_prefix: ClassVar[str] = "gpu_"
    energy_source = "the GPU (NVML)"

    def __init__(
        self,
        *,
        command: Any = None,
        metrics: Any = None,
        device: Any = 0,
        settle_s: Any = 1.5,
        sm_levels: Any = None,
        power_step_w: Any = 25,
        timeout_s: Any = 600.0,
        env: Any = None,
        workdir: Any = None,
        nvml: Any = "pynvml",
    ) -> None:
        super().__init__(
            CommandTarget(
                command=command, metrics=metrics, timeout_s=timeout_s, env=env, workdir=workdir
            )
        )
        self.index = option_int("device", device, 0, 63)
        self.settle_s = option_number("settle_s", settle_s, 0.0, 600.0)
        self.sm_levels = None if sm_levels is None else option_int("sm_levels", sm_levels, 2, 1000)
        self.power_step_w = option_int("power_step_w", power_step_w, 1, 1000)
        if not isinstance(nvml, str):
            raise ValidationError("target.nvml", f"got {nvml!r}", "a module name such as pynvml")
        try:
            self.nvml: ModuleType = importlib.import_module(nvml)
        except ImportError as exc:
            raise TargetError(
                f"cannot import {nvml}: {exc} (pip install nvidia-ml-py for pynvml)"
            ) from exc
        self._call("nvmlInit")
        count = self._call("nvmlDeviceGetCount")
        if self.index >= count:
            raise ValidationError("target.device", f"no GPU {self.index}", f"0..{count - 1}")
        self.handle = self._call("nvmlDeviceGetHandleByIndex", self.index)
        self.name = str(self._call("nvmlDeviceGetName", self.handle))
        self.mem_clocks = tuple(
            sorted(self._call("nvmlDeviceGetSupportedMemoryClocks", self.handle))
        )
        top_mem = self.mem_clocks[-1]
        self.sm_clocks = tuple(
            sorted(set(self._call("nvmlDeviceGetSupportedGraphicsClocks", self.handle, top_mem)))
        )
        low_mw, high_mw = self._call("nvmlDeviceGetPowerManagementLimitConstraints", self.handle)
        self.power_range_w = (low_mw // 1000, high_mw // 1000)
        self.default_power_w = (
            self._call("nvmlDeviceGetPowerManagementDefaultLimit", self.handle) // 1000
        )
        self.original_power_mw = int(self._call("nvmlDeviceGetPowerManagementLimit", self.handle))
        self._meter: _NvmlMeter | None = None

    # -- NVML calls ---------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> Any:
        """``nvml.<name>(*args)``, NVML errors turned into target errors."""
        try:
            return getattr(self.nvml, name)(*args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == getattr(self.nvml, "NVML_ERROR_NO_PERMISSION", 4):
                raise TargetError(
                    f"{name}: {exc} (changing GPU clocks and power needs root)"
                ) from exc
            if code == getattr(self.nvml, "NVML_ERROR_INVALID_ARGUMENT", 2):
                raise ConfigRejected(f"{name}{args[1:]!r}: {exc}") from exc
            raise TargetError(f"{name}: {exc}") from exc

    # -- the adapter ------------------------------------------------------------------
    def describe_knobs(self) -> tuple[Knob, ...]:
        sm = self.sm_clocks
        if self.sm_levels is not None and self.sm_levels < len(sm):
            step = (len(sm) - 1) / (self.sm_levels - 1)
            sm = tuple(sorted({sm[round(i * step)] for i in range(self.sm_levels)}))
        knobs: list[Knob] = [
            OrdinalKnob(
                "sm_mhz",
                choices=sm,
                default=sm[-1],
                unit="MHz",
                description=f"locked SM clock of {self.name}",
            )
        ]
        if len(self.mem_clocks) > 1:
            knobs.append(
                OrdinalKnob(
                    "mem_mhz",
                    choices=self.mem_clocks,
                    default=self.mem_clocks[-1],
                    unit="MHz",
                    description="locked memory clock",
                )
            )
        low, high = self.power_range_w
        if high > low:
            watts = set(range(low, high + 1, self.power_step_w)) | {high, self.default_power_w}
            levels = tuple(sorted(w for w in watts if low <= w <= high))
            knobs.append(
                OrdinalKnob(
                    "power_w",
                    choices=levels,
                    default=self.default_power_w,
                    unit="W",
                    description="power limit",
                )
            )
        return tuple(knobs)

    def set_device(self, config: Config) -> None:
        if "sm_mhz" in config:
            sm = int(config["sm_mhz"])  # type: ignore[arg-type]
            self._call("nvmlDeviceSetGpuLockedClocks", self.handle, sm, sm)
        if "mem_mhz" in config:
            mem = int(config["mem_mhz"])  # type: ignore[arg-type]
            self._call("nvmlDeviceSetMemoryLockedClocks", self.handle, mem, mem)
        if "power_w" in config:
            watts = int(config["power_w"])  # type: ignore[arg-type]
            self._call("nvmlDeviceSetPowerManagementLimit", self.handle, watts * 1000)
            got = int(self._call("nvmlDeviceGetPowerManagementLimit", self.handle))
            if got != watts * 1000:
                raise ConfigRejected(
                    f"power limit {watts} W did not take effect (reads {got / 1000:g} W)"
                )
        if self.settle_s:
            time.sleep(self.settle_s)

    def reset_device(self) -> None:
        self._call("nvmlDeviceResetGpuLockedClocks", self.handle)
        if len(self.mem_clocks) > 1:
            try:
                self._call("nvmlDeviceResetMemoryLockedClocks", self.handle)
            except TargetError as exc:
                if "Not Supported" not in str(exc):
                    raise
        self._call("nvmlDeviceSetPowerManagementLimit", self.handle, self.original_power_mw)

    def energy_meter(self) -> _NvmlMeter:
        self._meter = _NvmlMeter(self)
        return self._meter

    def device_metrics(self) -> dict[str, str]:
        return {"sm_mhz_seen": "mean SM clock while the workload ran, MHz"}

    def device_measurements(self) -> dict[str, float]:
        return {"sm_mhz_seen": self._meter.mean_clock() if self._meter else 0.0}


class _NvmlMeter:
    """The total-energy counter (Volta and later), else sampled power; SM clock samples."""

    def __init__(self, target: NvidiaGpuTarget) -> None:
        self.nvml, self.handle = target.nvml, target.handle
        self.clocks: list[int] = []
        self.power = SampledPower(self._watts, POWER_SAMPLE_S)
        self._counter: float | None = None

    def start(self) -> None:
        self.clocks = []
        self._counter = self._energy_mj()
        self.power.start()

    def stop(self) -> float:
        sampled = self.power.stop()
        after = self._energy_mj()
        if self._counter is None or after is None:
            return sampled
        return (after - self._counter) / 1000

    def mean_clock(self) -> float:
        return sum(self.clocks) / len(self.clocks) if self.clocks else 0.0

    def _energy_mj(self) -> float | None:
        try:
            return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except self.nvml.NVMLError:
            return None  # before Volta: integrate sampled power instead

    def _watts(self) -> float | None:
        try:
            watts = self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000
            self.clocks.append(
                int(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
            )
        except self.nvml.NVMLError:
            return None
        return float(watts)
