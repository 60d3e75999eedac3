"""NVIDIA GPU clocks and power limit as knobs, through NVML, with the energy of a workload.

Knobs, read from the device (``nvmlDeviceGetSupported*Clocks``, the power-limit
constraints): ``sm_mhz`` (the supported graphics clocks at the highest memory clock, as
ordinal levels; ``sm_levels = N`` keeps N of them evenly spread), ``mem_mhz`` (only where the
device lists more than one memory clock and takes a memory-clock lock: an H200 lists two
but answers "Not Supported", so it has no ``mem_mhz``) and ``power_w`` (``power_step_w``
steps between the limits, plus the device's default limit and the limit in force when the
target was built). Every knob's default is the GPU as it comes, so the first trial measures
what the tuning is compared against: the top clock level leaves that clock *unlocked* (the
driver boosts it up to the top clock as power and heat allow) and the default ``power_w`` is
the limit that was in force::

    [target]
    kind = "nvgpu"
    command = ["python3", "-m", "targets.workloads.inference",
               "--batch", "{batch}", "--device", "cuda"]
    metrics = ["requests", "requests_per_s", "p99_ms"]
    device = 0
    settle_s = 1.5      # after the clocks change, before the workload starts

Each trial locks the SM clock at a lower level (``nvmlDeviceSetGpuLockedClocks(f, f)``; the
top level resets the lock instead), likewise the memory clock (``SetMemoryLockedClocks``,
Ampere and later) and sets the power limit, reads it back,
waits ``settle_s``, runs the workload command as the command target does, and reports
``gpu_energy_j`` (the total-energy counter where the GPU has one, Volta and later; otherwise
power sampled every 50 ms and integrated), ``gpu_power_w``, ``sm_mhz_seen`` (the mean SM
clock while it ran: lower than asked when the power limit or heat caps it) and
``gpu_energy_j_per_request`` when the workload reports ``requests``. A power limit that does
not read back, or a clock NVML refuses as invalid, makes the trial INFEASIBLE. Restore resets
the locked clocks and puts the original power limit back, after every trial and at close,
on every exit path (with ``terminate_on_sigterm``, SIGTERM too). NVML has no getter for a
clock lock, so a lock set before the session (``nvidia-smi -lgc``) is not seen: the top level
and the restore leave the clocks unlocked.

With ``devices = [0, 1, 2, 3]`` (instead of ``device``) the target drives several GPUs at
once, as a pipeline-parallel job needs (EnvPipe lowers the SM clock of the stages that have
slack): each GPU gets its own knobs, suffixed with its index (``sm_mhz_0``, ``sm_mhz_1``,
...), ``gpu_energy_j`` is the sum over the GPUs and ``gpu_energy_j_<i>`` and
``sm_mhz_seen_<i>`` are reported per GPU. ``knobs = ["sm_mhz"]`` keeps only the listed
kinds of knob (of ``sm_mhz``, ``mem_mhz``, ``power_w``). Restore resets every GPU even when
one of them fails, then reports the first failure.

NVML's setters need root; without it the trial fails with a message that says so.
``helper = "/run/tuner/helper.sock"`` sends them to the privileged helper
(``targets/hardware/helper.py``, started as root with ``--nvml pynvml``) so the tuner runs
unprivileged, while reading clocks and energy stays in-process. The NVML module is imported
when the target is built (``nvml = "pynvml"``, from ``nvidia-ml-py``);
``nvml = "targets.hardware.fake_nvml"`` selects the simulated GPU that the tests use.
"""

from __future__ import annotations

import importlib
import time
from types import ModuleType
from typing import Any, ClassVar

from targets.base import option_int, option_number
from targets.command.target import CommandTarget
from targets.hardware.device import DeviceTarget, EnergyMeter, EnergyTrace, SampledPower
from targets.hardware.helper import option_helper
from tuner.errors import ConfigRejected, TargetError, ValidationError
from tuner.extras import install_hint
from tuner.space import Config, Knob, OrdinalKnob

KNOBS = ("sm_mhz", "mem_mhz", "power_w")
POWER_SAMPLE_S = 0.05


class _Gpu:
    """One GPU's handle, what it supports, and the power limit to put back."""

    def __init__(self, target: NvidiaGpuTarget, index: int, suffix: str) -> None:
        call = target._call
        self.index, self.suffix = index, suffix
        self.handle = call("nvmlDeviceGetHandleByIndex", index)
        self.name = str(call("nvmlDeviceGetName", self.handle))
        self.mem_clocks = tuple(sorted(call("nvmlDeviceGetSupportedMemoryClocks", self.handle)))
        self.sm_clocks = tuple(
            sorted(
                set(call("nvmlDeviceGetSupportedGraphicsClocks", self.handle, self.mem_clocks[-1]))
            )
        )
        low_mw, high_mw = call("nvmlDeviceGetPowerManagementLimitConstraints", self.handle)
        self.power_range_w = (low_mw // 1000, high_mw // 1000)
        self.default_power_w = call("nvmlDeviceGetPowerManagementDefaultLimit", self.handle) // 1000
        self.original_power_mw = int(call("nvmlDeviceGetPowerManagementLimit", self.handle))
        self.original_power_w = round(self.original_power_mw / 1000)
        self.mem_lockable = len(self.mem_clocks) > 1 and _locks_memory(target, self)


def _locks_memory(target: NvidiaGpuTarget, gpu: _Gpu) -> bool:
    """Whether the GPU takes a memory-clock lock: some list several memory clocks and still
    answer "Not Supported" (an H200, driver 580.159.04). Tried once at the top clock, which is
    the default, and undone; without root the answer is unknown and the knob stays (its
    trials then say that root is needed)."""
    top = gpu.mem_clocks[-1]
    try:
        target._setter("nvmlDeviceSetMemoryLockedClocks", gpu, top, top)
        target._setter("nvmlDeviceResetMemoryLockedClocks", gpu)
    except TargetError as exc:
        return "Not Supported" not in str(exc)
    return True


class NvidiaGpuTarget(DeviceTarget):
    """SM clock, memory clock and power limit of one or several NVIDIA GPUs (module doc).

    Args:
        command: Workload argument list run once per trial, the program first, with
            ``{knob}`` placeholders (as the command target's ``command``). Required.
        metrics: Names of the metrics the workload must report, a non-empty list.
        device: Index of the one GPU to drive, in ``[0, 63]``; ignored when ``devices`` is set.
        devices: Distinct indexes of several GPUs to drive at once; each gets its own knobs,
            suffixed ``_<index>`` (default: only ``device``).
        knobs: Kinds of knob to keep, of ``sm_mhz``, ``mem_mhz`` and ``power_w`` (default: all
            that the device supports).
        settle_s: Seconds to wait after setting the clocks, before the workload starts.
        sm_levels: Number of SM clock levels to keep, evenly spread, in ``[2, 1000]`` (default:
            every supported graphics clock).
        power_step_w: Watts between power-limit levels, in ``[1, 1000]``.
        timeout_s: Seconds the workload may run per trial before its process group is killed.
        env: Table of fixed environment variables for the workload (default: none).
        workdir: Existing directory the workload runs in (default: the current directory).
        nvml: Name of the NVML module to import: ``pynvml``, or ``targets.hardware.fake_nvml``
            for the simulated GPU of the tests.
        helper: Socket path of the privileged helper that runs NVML's setters (default: call
            them directly, which needs root).
    """

    kind: ClassVar[str] = "nvgpu"
    energy_prefix: ClassVar[str] = "gpu_"
    energy_source = "the GPU (NVML)"

    def __init__(
        self,
        *,
        command: Any = None,
        metrics: Any = None,
        device: Any = 0,
        devices: Any = None,
        knobs: Any = None,
        settle_s: Any = 1.5,
        sm_levels: Any = None,
        power_step_w: Any = 25,
        timeout_s: Any = 600.0,
        env: Any = None,
        workdir: Any = None,
        nvml: Any = "pynvml",
        helper: Any = None,
    ) -> None:
        super().__init__(
            CommandTarget(
                command=command, metrics=metrics, timeout_s=timeout_s, env=env, workdir=workdir
            )
        )
        indexes = _device_list(device, devices)
        self.helper = option_helper(helper)
        self.index = indexes[0]
        self.kinds = _knob_kinds(knobs)
        self.settle_s = option_number("settle_s", settle_s, 0.0, 600.0)
        self.sm_levels = None if sm_levels is None else option_int("sm_levels", sm_levels, 2, 1000)
        self.power_step_w = option_int("power_step_w", power_step_w, 1, 1000)
        if not isinstance(nvml, str):
            raise ValidationError("target.nvml", f"got {nvml!r}", "a module name such as pynvml")
        try:
            self.nvml: ModuleType = importlib.import_module(nvml)
        except ImportError as exc:
            hint = install_hint(nvml) if nvml == "pynvml" else None
            raise TargetError(
                f"cannot import {nvml}: {exc}"
                + (f"; the nvgpu target needs {hint} (or pip install nvidia-ml-py)" if hint else "")
            ) from exc
        self._call("nvmlInit")
        count = self._call("nvmlDeviceGetCount")
        for i in indexes:
            if i >= count:
                field = "target.devices" if devices is not None else "target.device"
                raise ValidationError(field, f"no GPU {i}", f"0..{count - 1}")
        several = len(indexes) > 1
        self.gpus = [_Gpu(self, i, f"_{i}" if several else "") for i in indexes]
        first = self.gpus[0]
        self.handle, self.name = first.handle, first.name
        self.mem_clocks, self.sm_clocks = first.mem_clocks, first.sm_clocks
        self._meters: list[_NvmlMeter] = []
        if several:
            self.energy_source = f"GPUs {', '.join(map(str, indexes))} (NVML)"

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

    def _setter(self, name: str, gpu: _Gpu, *args: int) -> None:
        """An NVML setter: through the privileged helper when one is configured."""
        if self.helper is not None:
            self.helper.nvml(name, gpu.index, *args)
        else:
            self._call(name, gpu.handle, *args)

    # -- the adapter ------------------------------------------------------------------
    def describe_knobs(self) -> tuple[Knob, ...]:
        knobs: list[Knob] = []
        for gpu in self.gpus:
            for knob in self._gpu_knobs(gpu):
                if knob.name.removesuffix(gpu.suffix) in self.kinds:
                    knobs.append(knob)
        return tuple(knobs)

    def _gpu_knobs(self, gpu: _Gpu) -> list[Knob]:
        sm = gpu.sm_clocks
        if self.sm_levels is not None and self.sm_levels < len(sm):
            step = (len(sm) - 1) / (self.sm_levels - 1)
            sm = tuple(sorted({sm[round(i * step)] for i in range(self.sm_levels)}))
        of = f"{gpu.name} (GPU {gpu.index})"
        unlocked = "the top level, {} MHz, leaves it unlocked (boosting up to it, as it comes)"
        knobs: list[Knob] = [
            OrdinalKnob(
                f"sm_mhz{gpu.suffix}",
                choices=sm,
                default=sm[-1],
                unit="MHz",
                description=f"SM clock lock of {of}; " + unlocked.format(sm[-1]),
            )
        ]
        if gpu.mem_lockable:
            knobs.append(
                OrdinalKnob(
                    f"mem_mhz{gpu.suffix}",
                    choices=gpu.mem_clocks,
                    default=gpu.mem_clocks[-1],
                    unit="MHz",
                    description=f"memory clock lock of {of}; "
                    + unlocked.format(gpu.mem_clocks[-1]),
                )
            )
        low, high = gpu.power_range_w
        if high > low:
            watts = set(range(low, high + 1, self.power_step_w))
            watts |= {high, gpu.default_power_w, gpu.original_power_w}
            levels = tuple(sorted(w for w in watts if low <= w <= high))
            as_it_was = gpu.original_power_w if low <= gpu.original_power_w <= high else None
            knobs.append(
                OrdinalKnob(
                    f"power_w{gpu.suffix}",
                    choices=levels,
                    default=as_it_was or gpu.default_power_w,
                    unit="W",
                    description=f"power limit of {of} (default: the limit in force before)",
                )
            )
        return knobs

    def set_device(self, config: Config) -> None:
        for gpu in self.gpus:
            self._set_gpu(gpu, config)
        if self.settle_s:
            time.sleep(self.settle_s)

    def lock_sm(self, mhz: int, position: int = 0) -> None:
        """Lock the SM clock of the target's ``position``-th GPU at ``mhz`` now (the top
        level unlocks it), nothing else: what switching the clock as a job's stages run
        calls (``targets.hardware.stage_clocks``); restore still resets it."""
        self._lock(self.gpus[position], "Gpu", self.gpus[position].sm_clocks, mhz)

    def _lock(self, gpu: _Gpu, clock: str, levels: tuple[int, ...], mhz: int) -> None:
        if mhz >= levels[-1]:  # the top level: the clock as it comes, unlocked
            self._setter(f"nvmlDeviceReset{clock}LockedClocks", gpu)
        else:
            self._setter(f"nvmlDeviceSet{clock}LockedClocks", gpu, mhz, mhz)

    def _set_gpu(self, gpu: _Gpu, config: Config) -> None:
        sm, mem, power = (f"{k}{gpu.suffix}" for k in KNOBS)
        for knob, clock, levels in ((sm, "Gpu", gpu.sm_clocks), (mem, "Memory", gpu.mem_clocks)):
            if knob in config:
                self._lock(gpu, clock, levels, int(config[knob]))  # type: ignore[arg-type]
        if power in config:
            watts = int(config[power])  # type: ignore[arg-type]
            # The limit in force before may have a fraction of a watt: put back exactly that.
            milliwatts = gpu.original_power_mw if watts == gpu.original_power_w else watts * 1000
            self._setter("nvmlDeviceSetPowerManagementLimit", gpu, milliwatts)
            got = int(self._call("nvmlDeviceGetPowerManagementLimit", gpu.handle))
            if got != milliwatts:
                raise ConfigRejected(
                    f"power limit {watts} W of GPU {gpu.index} did not take effect "
                    f"(reads {got / 1000:g} W)"
                )

    def reset_device(self) -> None:
        """Reset every GPU, even when one of them fails; then raise the first failure."""
        failure: TargetError | None = None
        for gpu in self.gpus:
            try:
                self._reset_gpu(gpu)
            except TargetError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def _reset_gpu(self, gpu: _Gpu) -> None:
        self._setter("nvmlDeviceResetGpuLockedClocks", gpu)
        if gpu.mem_lockable:
            try:
                self._setter("nvmlDeviceResetMemoryLockedClocks", gpu)
            except TargetError as exc:
                if "Not Supported" not in str(exc):
                    raise
        self._setter("nvmlDeviceSetPowerManagementLimit", gpu, gpu.original_power_mw)

    def has_energy(self) -> bool:
        return True  # the energy counter, or else sampled power

    def energy_meter(self) -> EnergyMeter:
        self._meters = [_NvmlMeter(self, gpu) for gpu in self.gpus]
        return _SumMeter(self._meters)

    def device_metrics(self) -> dict[str, str]:
        out = {}
        for gpu in self.gpus:
            out[f"sm_mhz_seen{gpu.suffix}"] = (
                f"mean SM clock of GPU {gpu.index} while the workload ran, MHz"
            )
            if gpu.suffix:
                out[f"gpu_energy_j{gpu.suffix}"] = f"energy of GPU {gpu.index}, J"
        return out

    def device_measurements(self) -> dict[str, float]:
        out = {}
        for gpu, meter in zip(self.gpus, self._meters, strict=False):
            out[f"sm_mhz_seen{gpu.suffix}"] = meter.mean_clock()
            if gpu.suffix:
                out[f"gpu_energy_j{gpu.suffix}"] = meter.joules
        return out


class _SumMeter:
    """Several GPUs' meters read as one: the sum of their energies."""

    def __init__(self, meters: list[_NvmlMeter]) -> None:
        self.meters = meters

    def start(self) -> None:
        for meter in self.meters:
            meter.start()

    def stop(self) -> float:
        return sum(meter.stop() for meter in self.meters)

    def between(self, start: float, end: float) -> float | None:
        """The window's energy, summed; each GPU's ``joules`` then holds its part of it."""
        parts = [meter.between(start, end) for meter in self.meters]
        if any(part is None for part in parts):
            return None
        for meter, part in zip(self.meters, parts, strict=True):
            meter.joules = part  # type: ignore[assignment]
        return sum(part for part in parts if part is not None)


def _device_list(device: Any, devices: Any) -> list[int]:
    if devices is None:
        return [option_int("device", device, 0, 63)]
    if not isinstance(devices, list) or not devices:
        raise ValidationError("target.devices", f"got {devices!r}", "a list of GPU indexes")
    indexes = [option_int(f"devices[{i}]", d, 0, 63) for i, d in enumerate(devices)]
    if len(set(indexes)) != len(indexes):
        raise ValidationError("target.devices", f"{indexes} repeats a GPU", "distinct indexes")
    return indexes


def _knob_kinds(knobs: Any) -> tuple[str, ...]:
    if knobs is None:
        return KNOBS
    if not isinstance(knobs, list) or not knobs or any(k not in KNOBS for k in knobs):
        raise ValidationError("target.knobs", f"got {knobs!r}", KNOBS)
    return tuple(knobs)


class _NvmlMeter:
    """The total-energy counter (Volta and later), else sampled power; SM clock samples.

    Each power sample also reads the counter, so ``between`` can give the energy of the
    workload's own timed window (``targets.hardware.device``)."""

    def __init__(self, target: NvidiaGpuTarget, gpu: _Gpu) -> None:
        self.nvml, self.handle = target.nvml, gpu.handle
        self.clocks: list[int] = []
        self.power = SampledPower(self._watts, POWER_SAMPLE_S)
        self.counter = EnergyTrace()
        self._counter: float | None = None
        self.joules = 0.0

    def start(self) -> None:
        self.clocks, self.counter = [], EnergyTrace()
        self._counter = self._energy_mj()
        self.power.start()

    def between(self, start: float, end: float) -> float | None:
        if self._counter is not None:
            return self.counter.between(start, end)
        return self.power.between(start, end)

    def stop(self) -> float:
        sampled = self.power.stop()
        after = self._energy_mj()
        if self._counter is None or after is None:
            self.joules = sampled
        else:
            self.joules = (after - self._counter) / 1000
        return self.joules

    def mean_clock(self) -> float:
        return sum(self.clocks) / len(self.clocks) if self.clocks else 0.0

    def _energy_mj(self) -> float | None:
        try:
            return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except self.nvml.NVMLError:
            return None  # before Volta: integrate sampled power instead

    def _watts(self) -> float | None:
        if self._counter is not None:
            at, counter = time.monotonic(), self._energy_mj()
            if counter is not None:
                self.counter.add(at, counter / 1000)
        try:
            watts = self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000
            self.clocks.append(
                int(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
            )
        except self.nvml.NVMLError:
            return None
        return float(watts)
