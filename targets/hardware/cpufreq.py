"""CPU frequency as a knob: Linux cpufreq sysfs, a workload command, RAPL energy.

Each trial pins (``mode = "pin"``: ``scaling_min_freq = scaling_max_freq = f``) or caps
(``mode = "cap"``: only ``scaling_max_freq = f``, the governor scales below it) every selected
cpufreq policy at the trial's ``cpu_khz`` level, reads the limits back, runs the workload
command (exactly as the command target runs its program: argument list, ``{knob}``
placeholders, ``TUNER_<KNOB>`` variables, metrics from its last JSON line, timeout kills the
process group), and adds ``energy_j`` and ``power_w`` from RAPL where readable (and
``energy_j_per_request`` when ``metrics`` lists ``requests``, which
``targets/workloads/inference.py`` reports), over the timed window the workload reports
where it reports one::

    [target]
    kind = "cpufreq"
    command = ["python3", "-m", "targets.workloads.inference",
               "--batch", "{batch}", "--threads", "{threads}"]
    metrics = ["requests", "requests_per_s", "p99_ms"]
    mode = "pin"             # or "cap"
    policies = ["policy0"]   # default: every policy
    levels = 8               # frequency levels when the driver has no table (intel_pstate)
    sysfs = "/sys"           # a fake tree in tests (targets/hardware/fake_sysfs.py)

Levels: ``scaling_available_frequencies`` where the driver has a table (acpi-cpufreq,
Tegra); otherwise (``intel_pstate`` in active mode, the default with HWP, which has no
table, no ``userspace`` governor and no ``scaling_setspeed``) ``levels`` evenly spaced
values from ``cpuinfo_min_freq`` to ``cpuinfo_max_freq``. Limits are written in the order
the kernel accepts (min first when lowering, max first when raising). The original
limits of every policy are read when the target is built and written back after every
trial and at close, on every exit path (the governor is never changed).

Writing these files needs root; without it a trial fails with a message that says so.
``helper = "/run/tuner/helper.sock"`` sends the writes to the privileged helper
(``targets/hardware/helper.py``) instead, so the tuner itself runs unprivileged. Energy needs
a readable RAPL zone: otherwise ``energy_j`` is not among the target's metrics at all, so a
study that asks for it is rejected with the metrics that are available.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from targets.base import option_int, option_names_list
from targets.command.target import CommandTarget
from targets.hardware import sysfs
from targets.hardware.device import DeviceTarget
from targets.hardware.helper import option_helper, writer
from targets.hardware.rapl import RaplMeter
from tuner.errors import ConfigRejected, ValidationError
from tuner.space import Config, Knob, OrdinalKnob

CPUFREQ = Path("devices") / "system" / "cpu" / "cpufreq"
MODES = ("pin", "cap")
KNOB = "cpu_khz"


@dataclass
class Policy:
    """One cpufreq policy (the CPUs that share a clock) and its state at setup."""

    path: Path
    driver: str
    min_khz: int
    max_khz: int
    hw_min_khz: int
    hw_max_khz: int
    table: tuple[int, ...]

    @classmethod
    def read(cls, path: Path) -> Policy:
        def text(name: str) -> str:
            return (path / name).read_text().strip()

        table_file = path / "scaling_available_frequencies"
        table = (
            tuple(sorted({int(v) for v in table_file.read_text().split()}))
            if table_file.exists()
            else ()
        )
        return cls(
            path,
            text("scaling_driver") if (path / "scaling_driver").exists() else "unknown",
            int(text("scaling_min_freq")),
            int(text("scaling_max_freq")),
            int(text("cpuinfo_min_freq")),
            int(text("cpuinfo_max_freq")),
            table,
        )

    def limits(self) -> tuple[int, int]:
        return (
            int((self.path / "scaling_min_freq").read_text()),
            int((self.path / "scaling_max_freq").read_text()),
        )

    def set_limits(self, low: int, high: int, write: Callable[[Path, str], None]) -> None:
        """Write min and max in an order the kernel accepts (min <= max at every step)."""
        low_file, high_file = self.path / "scaling_min_freq", self.path / "scaling_max_freq"
        sysfs.write_range(low_file, high_file, low, high, write)

    def restore(self, write: Callable[[Path, str], None]) -> None:
        low_file, high_file = self.path / "scaling_min_freq", self.path / "scaling_max_freq"
        sysfs.restore_range(low_file, high_file, self.min_khz, self.max_khz, self.hw_max_khz, write)


class CpuFreqTarget(DeviceTarget):
    """CPU frequency levels plus a workload command (see the module doc).

    Args:
        command: Workload argument list run once per trial, the program first, with
            ``{knob}`` placeholders (as the command target's ``command``). Required.
        metrics: Names of the metrics the workload must report, a non-empty list.
        mode: ``pin`` (``scaling_min_freq = scaling_max_freq = cpu_khz``) or ``cap`` (only
            ``scaling_max_freq``; the governor scales below it).
        policies: Names of the cpufreq policies to set, e.g. ``["policy0"]`` (default: every
            policy).
        levels: Number of evenly spaced frequency levels, in ``[2, 64]``, used when the driver
            has no ``scaling_available_frequencies`` table (``intel_pstate``).
        sysfs: Root of the sysfs tree, an existing directory (a fake tree in tests).
        timeout_s: Seconds the workload may run per trial before its process group is killed.
        env: Table of fixed environment variables for the workload (default: none).
        workdir: Existing directory the workload runs in (default: the current directory).
        dram: Whether the RAPL DRAM zones count towards the energy as well as the package.
        helper: Socket path of the privileged helper that does the sysfs writes (default:
            write directly, which needs root).
    """

    kind: ClassVar[str] = "cpufreq"
    energy_source = "the CPU package (RAPL)"

    def __init__(
        self,
        *,
        command: Any = None,
        metrics: Any = None,
        mode: Any = "pin",
        policies: Any = None,
        levels: Any = 8,
        sysfs: Any = "/sys",
        timeout_s: Any = 600.0,
        env: Any = None,
        workdir: Any = None,
        dram: Any = False,
        helper: Any = None,
    ) -> None:
        super().__init__(
            CommandTarget(
                command=command, metrics=metrics, timeout_s=timeout_s, env=env, workdir=workdir
            )
        )
        if mode not in MODES:
            raise ValidationError("target.mode", f"got {mode!r}", MODES)
        self.mode = mode
        self.policy_names = option_names_list("policies", policies)
        self.levels = option_int("levels", levels, 2, 64)
        if not isinstance(sysfs, str) or not Path(sysfs).is_dir():
            raise ValidationError("target.sysfs", f"{sysfs!r} is not a directory", "a sysfs root")
        self.sysfs = Path(sysfs)
        if not isinstance(dram, bool):
            raise ValidationError("target.dram", f"got {dram!r}", "true or false")
        self.policies = self._discover()
        self.meter = RaplMeter.find(self.sysfs, dram)
        self.write = writer(option_helper(helper), "CPU frequency control")

    # -- discovery ----------------------------------------------------------------------
    def _discover(self) -> list[Policy]:
        root = self.sysfs / CPUFREQ
        found = {p.name: p for p in sorted(root.glob("policy*")) if p.is_dir()}
        if not found:
            raise ValidationError(
                "target.sysfs",
                f"no cpufreq policies under {root} (this machine or VM exposes no CPU "
                "frequency control)",
                "a sysfs tree with devices/system/cpu/cpufreq/policyN",
            )
        names = self.policy_names or sorted(found)
        for name in names:
            if name not in found:
                raise ValidationError(f"target.policies.{name}", "no such policy", sorted(found))
        try:
            return [Policy.read(found[name]) for name in names]
        except (OSError, ValueError) as exc:
            raise ValidationError("target.sysfs", f"unreadable cpufreq policy: {exc}") from exc

    def frequency_levels(self) -> tuple[int, ...]:
        """The ``cpu_khz`` levels every selected policy supports, lowest first."""
        first = self.policies[0]
        if all(p.table for p in self.policies):
            common = set(first.table)
            for policy in self.policies[1:]:
                common &= set(policy.table)
            if len(common) >= 2:
                return tuple(sorted(common))
        low = max(p.hw_min_khz for p in self.policies)
        high = min(p.hw_max_khz for p in self.policies)
        step = (high - low) / (self.levels - 1)
        return tuple(sorted({round(low + i * step) for i in range(self.levels)}))

    # -- the adapter ------------------------------------------------------------------
    def describe_knobs(self) -> tuple[Knob, ...]:
        levels = self.frequency_levels()
        return (
            OrdinalKnob(
                KNOB,
                choices=levels,
                default=levels[-1],
                unit="kHz",
                description=f"CPU frequency ({self.mode}) of "
                + ", ".join(p.path.name for p in self.policies),
            ),
        )

    def set_device(self, config: Config) -> None:
        if KNOB not in config:
            return
        khz = int(config[KNOB])  # type: ignore[arg-type]
        for policy in self.policies:
            low = min(khz if self.mode == "pin" else policy.min_khz, khz)
            policy.set_limits(low, khz, self.write)
            got = policy.limits()
            if got[1] != khz or (self.mode == "pin" and got[0] != khz):
                raise ConfigRejected(
                    f"{policy.path.name}: asked for [{low}, {khz}] kHz, the kernel "
                    f"kept [{got[0]}, {got[1]}] (a platform or thermal limit)"
                )

    def reset_device(self) -> None:
        for policy in self.policies:
            policy.restore(self.write)

    def energy_meter(self) -> RaplMeter | None:
        return self.meter
