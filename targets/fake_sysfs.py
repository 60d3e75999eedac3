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

from targets.cpufreq import CPUFREQ
from targets.rapl import POWERCAP

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
