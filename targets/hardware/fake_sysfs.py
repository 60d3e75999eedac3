"""Fake sysfs trees for the CPU frequency and RAPL adapters, where the hardware is absent.

They hold the same files, with the same formats, as the kernel's (``hw_freq.md`` §4.2-4.3),
as plain files under a temporary root that the adapters take as ``sysfs``. The kernel's
checks that matter to the adapters are not simulated here (a write of min > max succeeds),
so the tests assert the adapters' own ordering and read-back::

    root = make_cpufreq_tree(tmp_path, driver="acpi-cpufreq", policies=2)
    add_rapl_zone(root, "package-0", energy_uj=10**6)
    with build_target("cpufreq", {"sysfs": str(root), "command": [...], "metrics": [...]}):
        ...
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from targets.hardware.cpufreq import CPUFREQ
from targets.hardware.rapl import POWERCAP

ACPI_TABLE = (800_000, 1_200_000, 1_600_000, 2_000_000, 2_400_000, 2_800_000)
DEFAULT_MAX_RANGE_UJ = 262_143_999_938


def make_cpufreq_tree(
    root: Path,
    driver: str = "acpi-cpufreq",
    policies: int = 1,
    table: Sequence[int] = ACPI_TABLE,
    governor: str = "ondemand",
) -> Path:
    """``root`` with ``devices/system/cpu/cpufreq/policy0..`` of ``driver``.

    ``intel_pstate`` gets no ``scaling_available_frequencies`` (active mode has no table).
    """
    for index in range(policies):
        folder = root / CPUFREQ / f"policy{index}"
        folder.mkdir(parents=True, exist_ok=True)
        low, high = min(table), max(table)
        files = {
            "scaling_driver": driver,
            "scaling_governor": governor,
            "scaling_available_governors": "performance powersave"
            if driver == "intel_pstate"
            else "conservative ondemand userspace powersave performance schedutil",
            "cpuinfo_min_freq": str(low),
            "cpuinfo_max_freq": str(high),
            "scaling_min_freq": str(low),
            "scaling_max_freq": str(high),
            "affected_cpus": str(index),
        }
        if driver != "intel_pstate":
            files["scaling_available_frequencies"] = " ".join(map(str, sorted(table))) + " "
        for name, text in files.items():
            (folder / name).write_text(text + "\n")
    return root


def add_rapl_zone(
    root: Path,
    name: str,
    energy_uj: int = 0,
    max_range_uj: int = DEFAULT_MAX_RANGE_UJ,
    index: str | None = None,
) -> Path:
    """A powercap zone ``intel-rapl:<index>`` named ``name``; returns its ``energy_uj`` file."""
    existing = list((root / POWERCAP).glob("intel-rapl:*"))
    folder = root / POWERCAP / f"intel-rapl:{index if index is not None else len(existing)}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "name").write_text(name + "\n")
    (folder / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
    (folder / "energy_uj").write_text(f"{energy_uj}\n")
    return folder / "energy_uj"


ORIN_GPU_HZ = (
    306_000_000,
    408_000_000,
    510_000_000,
    612_000_000,
    714_000_000,
    816_000_000,
    918_000_000,
)
ORIN_EMC_KHZ = (204_000, 665_600, 2_133_000, 3_199_000)


def make_jetson_tree(
    root: Path,
    gpu: str = "17000000.ga10b",
    gpu_hz: Sequence[int] = ORIN_GPU_HZ,
    emc_khz: Sequence[int] | None = ORIN_EMC_KHZ,
    rails: dict[str, tuple[int, int]] | None = None,
) -> Path:
    """``root`` with a Jetson's GPU devfreq node, BPMP EMC debugfs and INA3221 hwmon rails.

    ``rails`` maps a label to (millivolts, milliamps); default: an Orin NX's ``VDD_IN`` at
    5 V / 2 A, ``VDD_CPU_GPU_CV`` and an ``NC`` channel. ``emc_khz=None`` leaves debugfs out.
    """
    node = root / "class" / "devfreq" / gpu
    node.mkdir(parents=True, exist_ok=True)
    levels = sorted(gpu_hz)
    files = {
        "available_frequencies": " ".join(map(str, levels)),
        "min_freq": str(levels[0]),
        "max_freq": str(levels[-1]),
        "cur_freq": str(levels[-1]),
        "governor": "nvhost_podgov",
    }
    for name, text in files.items():
        (node / name).write_text(text + "\n")
    if emc_khz is not None:
        debug = root / "kernel" / "debug" / "bpmp" / "debug"
        (debug / "clk" / "emc").mkdir(parents=True, exist_ok=True)
        (debug / "emc").mkdir(parents=True, exist_ok=True)
        (debug / "emc" / "possible_rates").write_text(" ".join(map(str, sorted(emc_khz))) + "\n")
        (debug / "clk" / "emc" / "rate").write_text(f"{max(emc_khz) * 1000}\n")
        (debug / "clk" / "emc" / "mrq_rate_locked").write_text("0\n")
    channels = (
        rails
        if rails is not None
        else {
            "VDD_IN": (5000, 2000),
            "VDD_CPU_GPU_CV": (5000, 900),
            "NC": (0, 0),
        }
    )
    hwmon = root / "bus" / "i2c" / "drivers" / "ina3221" / "1-0040" / "hwmon" / "hwmon3"
    hwmon.mkdir(parents=True, exist_ok=True)
    for index, (label, (millivolts, milliamps)) in enumerate(channels.items(), start=1):
        (hwmon / f"in{index}_label").write_text(label + "\n")
        (hwmon / f"in{index}_input").write_text(f"{millivolts}\n")
        (hwmon / f"curr{index}_input").write_text(f"{milliamps}\n")
    return root
