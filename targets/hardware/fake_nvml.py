"""A stand-in for ``pynvml`` (``nvidia-ml-py``) where no NVIDIA GPU is present.

It implements the subset the ``nvgpu`` target calls, with pynvml's names, constants, units
(MHz, mW, mJ) and error classes (``NVMLError`` with ``.value``, one subclass per code), over
simulated devices whose state the tests can inspect::

    from targets.hardware import fake_nvml
    fake_nvml.configure([fake_nvml.FakeDevice()])       # one H100-like device
    build_target("nvgpu", {"nvml": "targets.hardware.fake_nvml", ...})

The simulated power draw under load grows with the SM clock (``idle_w + dynamic_w *
(clock / max)^3``); a power limit below that draw lowers the effective clock, as the
hardware's power capping does. The energy counter integrates that draw over wall time since
``configure``, so a trial's energy depends on its clocks, its limit and its duration.
Devices can lack the energy counter, lack memory-clock locking (pre-Ampere), or refuse
changes (not root), to exercise the adapter's fallbacks and errors.

A process that never calls ``configure`` (``tuner tune`` on a config with ``nvml =
"targets.hardware.fake_nvml"``) gets ``TUNER_FAKE_GPUS`` default devices at ``nvmlInit``
(one when unset), so a session can be tried end to end without a GPU; ``configure([])``
simulates a machine without one.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_LIBRARY_NOT_FOUND = 12


class NVMLError(Exception):
    """pynvml's error: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(_MESSAGES.get(value, f"NVML error {value}"))


class NVMLError_Uninitialized(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_UNINITIALIZED)


class NVMLError_InvalidArgument(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_INVALID_ARGUMENT)


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_NoPermission(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NO_PERMISSION)


_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
}


def _h100_clocks() -> tuple[int, ...]:
    return tuple(range(1980, 344, -15))  # 1980 .. 345 MHz in 15 MHz steps, highest first


@dataclass
class FakeDevice:
    """One simulated GPU (defaults: an H100 SXM-like part)."""

    name: str = "Fake NVIDIA H100"
    mem_clocks: tuple[int, ...] = (2619,)
    sm_clocks: tuple[int, ...] = field(default_factory=_h100_clocks)
    power_limits_mw: tuple[int, int] = (200_000, 700_000)
    default_limit_mw: int = 700_000
    idle_w: float = 70.0
    dynamic_w: float = 560.0
    energy_counter: bool = True
    mem_locks: bool = True
    writable: bool = True
    # state
    locked_sm: tuple[int, int] | None = None
    locked_mem: tuple[int, int] | None = None
    limit_mw: int = 0
    energy_mj: float = 0.0
    calls: list[str] = field(default_factory=list)
    _at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.limit_mw = self.limit_mw or self.default_limit_mw

    def draw_w(self, clock: int) -> float:
        return self.idle_w + self.dynamic_w * (clock / max(self.sm_clocks)) ** 3

    def sm_clock(self) -> int:
        """The effective SM clock: the locked one, lowered until the draw fits the limit."""
        high = self.locked_sm[1] if self.locked_sm else max(self.sm_clocks)
        for clock in sorted(self.sm_clocks, reverse=True):
            if clock <= high and self.draw_w(clock) <= self.limit_mw / 1000:
                return clock
        return min(self.sm_clocks)

    def advance(self) -> None:
        now = time.monotonic()
        self.energy_mj += self.draw_w(self.sm_clock()) * (now - self._at) * 1000
        self._at = now


_lock = threading.Lock()
_devices: list[FakeDevice] = []
_initialized = False
_configured = False


def configure(devices: list[FakeDevice]) -> list[FakeDevice]:
    """Replace the simulated devices (and forget any nvmlInit); returns them."""
    global _initialized, _configured
    with _lock:
        _devices[:] = devices
        _initialized = False
        _configured = True
    return devices


def devices() -> list[FakeDevice]:
    return list(_devices)


def nvmlInit() -> None:
    global _initialized
    if not _configured:
        count = os.environ.get("TUNER_FAKE_GPUS", "1")
        if not count.isdigit() or not 0 < int(count) <= 64:
            raise ValueError(f"TUNER_FAKE_GPUS: got {count!r}, expected a count in [1, 64]")
        configure([FakeDevice() for _ in range(int(count))])
    if not _devices:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    _initialized = True


def nvmlShutdown() -> None:
    global _initialized
    _initialized = False


def _device(handle: FakeDevice, call: str) -> FakeDevice:
    if not _initialized:
        raise NVMLError_Uninitialized()
    handle.advance()
    handle.calls.append(call)
    return handle


def _writable(handle: FakeDevice, call: str) -> FakeDevice:
    device = _device(handle, call)
    if not device.writable:
        raise NVMLError_NoPermission()
    return device


def nvmlDeviceGetCount() -> int:
    if not _initialized:
        raise NVMLError_Uninitialized()
    return len(_devices)


def nvmlDeviceGetHandleByIndex(index: int) -> FakeDevice:
    if not _initialized:
        raise NVMLError_Uninitialized()
    if not 0 <= index < len(_devices):
        raise NVMLError_InvalidArgument()
    return _devices[index]


def nvmlDeviceGetName(handle: FakeDevice) -> str:
    return _device(handle, "GetName").name


def nvmlDeviceGetSupportedMemoryClocks(handle: FakeDevice) -> list[int]:
    return list(_device(handle, "GetSupportedMemoryClocks").mem_clocks)


def nvmlDeviceGetSupportedGraphicsClocks(handle: FakeDevice, mem: int) -> list[int]:
    device = _device(handle, "GetSupportedGraphicsClocks")
    if mem not in device.mem_clocks:
        raise NVMLError_InvalidArgument()
    return list(device.sm_clocks)


def nvmlDeviceGetPowerManagementLimitConstraints(handle: FakeDevice) -> list[int]:
    return list(_device(handle, "GetPowerManagementLimitConstraints").power_limits_mw)


def nvmlDeviceGetPowerManagementLimit(handle: FakeDevice) -> int:
    return _device(handle, "GetPowerManagementLimit").limit_mw


def nvmlDeviceGetPowerManagementDefaultLimit(handle: FakeDevice) -> int:
    return _device(handle, "GetPowerManagementDefaultLimit").default_limit_mw


def nvmlDeviceSetPowerManagementLimit(handle: FakeDevice, limit_mw: int) -> None:
    device = _writable(handle, f"SetPowerManagementLimit {limit_mw}")
    low, high = device.power_limits_mw
    if not low <= limit_mw <= high:
        raise NVMLError_InvalidArgument()
    device.limit_mw = int(limit_mw)


def nvmlDeviceSetGpuLockedClocks(handle: FakeDevice, low: int, high: int) -> None:
    device = _writable(handle, f"SetGpuLockedClocks {low} {high}")
    if low > high:
        raise NVMLError_InvalidArgument()
    device.locked_sm = (int(low), int(high))


def nvmlDeviceResetGpuLockedClocks(handle: FakeDevice) -> None:
    _writable(handle, "ResetGpuLockedClocks").locked_sm = None


def nvmlDeviceSetMemoryLockedClocks(handle: FakeDevice, low: int, high: int) -> None:
    device = _writable(handle, f"SetMemoryLockedClocks {low} {high}")
    if not device.mem_locks:
        raise NVMLError_NotSupported()
    device.locked_mem = (int(low), int(high))


def nvmlDeviceResetMemoryLockedClocks(handle: FakeDevice) -> None:
    device = _writable(handle, "ResetMemoryLockedClocks")
    if not device.mem_locks:
        raise NVMLError_NotSupported()
    device.locked_mem = None


def nvmlDeviceGetClockInfo(handle: FakeDevice, clock_type: int) -> int:
    device = _device(handle, "GetClockInfo")
    if clock_type == NVML_CLOCK_MEM:
        return device.locked_mem[1] if device.locked_mem else max(device.mem_clocks)
    return device.sm_clock()


def nvmlDeviceGetTotalEnergyConsumption(handle: FakeDevice) -> int:
    device = _device(handle, "GetTotalEnergyConsumption")
    if not device.energy_counter:
        raise NVMLError_NotSupported()
    return int(device.energy_mj)


def nvmlDeviceGetPowerUsage(handle: FakeDevice) -> int:
    device = _device(handle, "GetPowerUsage")
    return int(device.draw_w(device.sm_clock()) * 1000)
