"""NVIDIA Jetson GPU and memory (EMC) clocks as knobs, with energy from the INA3221 rails.

The PolyThrottle knobs on a Jetson (TX2, Xavier, Orin), where NVML does not exist::

    [target]
    kind = "jetson"
    command = ["python3", "-m", "targets.workloads.inference",
               "--batch", "{batch}", "--device", "cuda"]
    metrics = ["requests", "requests_per_s", "p99_ms"]
    gpu_mode = "pin"        # or "floor": only the governor's minimum (PolyThrottle's knob)
    rails = ["VDD_IN"]      # INA3221 rails to sum for energy (default: the board input rail)
    sysfs = "/sys"          # a fake tree in tests (targets/hardware/fake_sysfs.py)

Knobs, read from the device: ``gpu_hz`` from the GPU devfreq node's
``available_frequencies`` (the node under ``class/devfreq`` whose name holds gp10b, gv11b,
ga10b, gb10b or gpu), and ``emc_khz`` from BPMP's ``possible_rates`` where debugfs is mounted
(``kernel/debug/bpmp/debug/clk/emc``). Each trial writes the devfreq ``min_freq``/``max_freq``
(order-safe, min <= max at every step), locks the EMC rate (``mrq_rate_locked = 1``, then
``rate``) and reads both back (BPMP silently rounds rates it does not support: a rate that
does not read back is INFEASIBLE), runs the workload as the command target does, and samples
the selected rails (``inN_input`` mV x ``currN_input`` mA, the hwmon layout of JetPack 5 and
later) every ``sample_s`` to report ``energy_j``, ``power_w`` and ``energy_j_per_request``.
Restore writes the original devfreq limits and EMC rate back and unlocks the EMC, after
every trial and at close. Writing these files needs root. The ``nvpmodel`` power mode caps
every range: run under MAXN (or the mode to tune within).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from targets.base import option_names_list, option_number
from targets.command.target import CommandTarget
from targets.hardware.device import DeviceTarget, SampledPower
from targets.hardware.helper import option_helper, writer
from targets.hardware.sysfs import read_int, read_text, restore_range, write_range
from tuner.errors import ConfigRejected, TargetError, ValidationError
from tuner.space import Config, Knob, OrdinalKnob

DEVFREQ = Path("class") / "devfreq"
EMC = Path("kernel") / "debug" / "bpmp" / "debug" / "clk" / "emc"
INA = Path("bus") / "i2c" / "drivers" / "ina3221"
GPU_NAMES = ("gp10b", "gv11b", "ga10b", "gb10b", "gpu")
INPUT_RAILS = ("VDD_IN", "POM_5V_IN", "VIN_SYS_5V0")
GPU_MODES = ("pin", "floor")


@dataclass(frozen=True)
class Rail:
    """One INA3221 channel: its label and the hwmon files of voltage (mV) and current (mA)."""

    label: str
    volts: Path
    amps: Path

    def milliwatts(self) -> float:
        return read_int(self.volts) * read_int(self.amps) / 1000


def find_rails(root: Path) -> list[Rail]:
    """Every labelled INA3221 channel (not ``NC``, not the shunt-sum channel 7)."""
    rails = []
    for label in sorted((root / INA).glob("*/hwmon/hwmon*/in*_label")):
        channel = label.name[2 : -len("_label")]
        name = read_text(label)
        if name == "NC" or channel == "7" or "sum" in name.lower():
            continue
        rails.append(
            Rail(
                name, label.with_name(f"in{channel}_input"), label.with_name(f"curr{channel}_input")
            )
        )
    return rails


class JetsonTarget(DeviceTarget):
    """GPU devfreq and EMC clocks of a Jetson, INA3221 energy (see the module doc).

    Args:
        command: Workload argument list run once per trial, the program first, with
            ``{knob}`` placeholders (as the command target's ``command``). Required.
        metrics: Names of the metrics the workload must report, a non-empty list.
        gpu_mode: ``pin`` (devfreq ``min_freq = max_freq = gpu_hz``) or ``floor`` (only the
            minimum is set to ``gpu_hz``; the maximum stays the original, or ``gpu_hz`` if higher).
        rails: Labels of the INA3221 rails whose power is summed for the energy (default: the
            board input rail, the first of ``VDD_IN``, ``POM_5V_IN`` or ``VIN_SYS_5V0`` found).
        sysfs: Root of the sysfs tree, an existing directory (a fake tree in tests).
        sample_s: Seconds between power samples of the rails, in ``[0.001, 10]``.
        helper: Socket path of the privileged helper that does the sysfs writes (default:
            write directly, which needs root).
        timeout_s: Seconds the workload may run per trial before its process group is killed.
        env: Table of fixed environment variables for the workload (default: none).
        workdir: Existing directory the workload runs in (default: the current directory).
    """

    kind: ClassVar[str] = "jetson"

    def __init__(
        self,
        *,
        command: Any = None,
        metrics: Any = None,
        gpu_mode: Any = "pin",
        rails: Any = None,
        sysfs: Any = "/sys",
        sample_s: Any = 0.05,
        helper: Any = None,
        timeout_s: Any = 600.0,
        env: Any = None,
        workdir: Any = None,
    ) -> None:
        super().__init__(
            CommandTarget(
                command=command, metrics=metrics, timeout_s=timeout_s, env=env, workdir=workdir
            )
        )
        if gpu_mode not in GPU_MODES:
            raise ValidationError("target.gpu_mode", f"got {gpu_mode!r}", GPU_MODES)
        self.gpu_mode = gpu_mode
        if not isinstance(sysfs, str) or not Path(sysfs).is_dir():
            raise ValidationError("target.sysfs", f"{sysfs!r} is not a directory", "a sysfs root")
        self.root = Path(sysfs)
        self.sample_s = option_number("sample_s", sample_s, 0.001, 10.0)
        self.write = writer(option_helper(helper), "Jetson clock control")
        self.gpu = self._find_gpu()
        self.gpu_levels = tuple(
            sorted(int(v) for v in sysfs_read(self.gpu / "available_frequencies").split())
        )
        self.gpu_limits = (
            read_int(self.gpu / "min_freq"),
            read_int(self.gpu / "max_freq"),
        )
        emc = self.root / EMC
        self.emc = emc if _visible(emc / "rate") else None
        self.emc_levels: tuple[int, ...] = ()
        self.emc_rate = read_int(emc / "rate") if self.emc is not None else 0
        if self.emc is not None:
            rates = self.emc / "possible_rates"
            if not _visible(rates):
                rates = self.emc.parent.parent / "emc" / "possible_rates"  # .../bpmp/debug/emc
            self.emc_levels = tuple(sorted(int(v) for v in sysfs_read(rates).split()))
        all_rails = find_rails(self.root)
        wanted = option_names_list("rails", rails)
        if wanted is None:
            wanted = [r.label for r in all_rails if r.label in INPUT_RAILS][:1]
        labels = [r.label for r in all_rails]
        for name in wanted:
            if name not in labels:
                raise ValidationError(f"target.rails.{name}", "no such INA3221 rail", labels)
        self.rails = [r for r in all_rails if r.label in wanted]
        self.energy_source = "+".join(r.label for r in self.rails) + " (INA3221)"

    def _find_gpu(self) -> Path:
        nodes = sorted((self.root / DEVFREQ).glob("*"))
        for node in nodes:
            if (
                any(token in node.name for token in GPU_NAMES)
                and (node / "available_frequencies").exists()
            ):
                return node
        raise ValidationError(
            "target.sysfs",
            f"no Jetson GPU devfreq node under {self.root / DEVFREQ} "
            f"(names with {', '.join(GPU_NAMES)})",
            [n.name for n in nodes] or "a Jetson's sysfs",
        )

    # -- the adapter ------------------------------------------------------------------
    def describe_knobs(self) -> tuple[Knob, ...]:
        knobs: list[Knob] = [
            OrdinalKnob(
                "gpu_hz",
                choices=self.gpu_levels,
                default=self.gpu_levels[-1],
                unit="Hz",
                description=f"GPU clock ({self.gpu_mode}) of {self.gpu.name}",
            )
        ]
        if len(self.emc_levels) > 1:
            knobs.append(
                OrdinalKnob(
                    "emc_khz",
                    choices=self.emc_levels,
                    default=self.emc_levels[-1],
                    unit="kHz",
                    description="memory (EMC) clock, locked through BPMP",
                )
            )
        return tuple(knobs)

    def set_device(self, config: Config) -> None:
        if "gpu_hz" in config:
            hz = int(config["gpu_hz"])  # type: ignore[arg-type]
            high = hz if self.gpu_mode == "pin" else max(hz, self.gpu_limits[1])
            write_range(self.gpu / "min_freq", self.gpu / "max_freq", hz, high, self.write)
            got = (read_int(self.gpu / "min_freq"), read_int(self.gpu / "max_freq"))
            if got != (hz, high):
                raise ConfigRejected(f"GPU devfreq asked [{hz}, {high}] Hz, kept {list(got)}")
        if "emc_khz" in config and self.emc is not None:
            khz = int(config["emc_khz"])  # type: ignore[arg-type]
            self.write(self.emc / "mrq_rate_locked", "1")
            self.write(self.emc / "rate", str(khz * 1000))
            got_hz = read_int(self.emc / "rate")
            if got_hz != khz * 1000:
                raise ConfigRejected(f"EMC rate {khz} kHz not taken by BPMP (reads {got_hz} Hz)")

    def reset_device(self) -> None:
        low, high = self.gpu_limits
        ceiling = self.gpu_levels[-1]
        restore_range(self.gpu / "min_freq", self.gpu / "max_freq", low, high, ceiling, self.write)
        if self.emc is not None and read_int(self.emc / "mrq_rate_locked") == 1:
            self.write(self.emc / "rate", str(self.emc_rate))  # back where it was, then unlock
            self.write(self.emc / "mrq_rate_locked", "0")

    def energy_meter(self) -> SampledPower | None:
        if not self.rails:
            return None
        return SampledPower(self._watts, self.sample_s)

    def _watts(self) -> float | None:
        try:
            return sum(r.milliwatts() for r in self.rails) / 1000
        except (OSError, ValueError):
            return None


def sysfs_read(path: Path) -> str:
    try:
        return read_text(path)
    except OSError as exc:
        raise TargetError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _visible(path: Path) -> bool:
    """Whether ``path`` exists for this process: debugfs is often root's only, and then the
    EMC clock is not a knob (Python 3.11's ``exists`` raises instead of saying False)."""
    try:
        return path.exists()
    except OSError:
        return False
