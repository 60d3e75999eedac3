"""CPU package (and DRAM) energy from the RAPL powercap interface, wraparound included.

Zones live at ``<sysfs>/class/powercap/intel-rapl:<pkg>`` (and ``intel-rapl:<pkg>:<n>`` for
subzones); each has ``name`` (``package-0``, ``core``, ``uncore``, ``dram``, ``psys``),
``energy_uj`` (a counter in microjoules) and ``max_energy_range_uj`` (where it wraps to 0).
Names are read from ``name`` (indices vary). ``package`` includes the cores and the uncore
but not DRAM, so only the package zones (and, when asked, the ``dram`` zones) are summed.

``energy_uj`` is readable only by root since the Platypus mitigation (CVE-2020-8694): when no
zone can be read, ``RaplMeter.find`` returns None and the target reports energy as
unavailable; a number is never invented. A counter wraps after ``max_energy_range_uj`` (about
262 kJ, 44 minutes at 100 W on one Haswell part), so a measurement samples every zone at
least every ``poll_s`` seconds and adds the modular differences.

The samples (every 50 ms by default) also form a trace of the running total, so that
``between`` gives the energy of the window a workload timed (``targets.hardware.device``):
without it, the CPU energy of the workload's start-up (a Python interpreter importing torch
takes seconds) would be charged to its requests.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from targets.hardware.device import EnergyTrace

POWERCAP = Path("class") / "powercap"
DEFAULT_POLL_S = 0.05


@dataclass(frozen=True)
class RaplZone:
    """One counter: its sysfs folder, name and wrap point."""

    path: Path
    name: str
    max_uj: int

    def read_uj(self) -> int:
        return int((self.path / "energy_uj").read_text().strip())


class RaplMeter:
    """Sums the energy of package (and optionally DRAM) zones between ``start`` and ``stop``."""

    def __init__(self, zones: list[RaplZone], poll_s: float = DEFAULT_POLL_S) -> None:
        self.zones = zones
        self.poll_s = poll_s
        self._last: list[int] = []
        self._total_uj = 0
        self.trace = EnergyTrace()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def find(
        cls, sysfs: Path, dram: bool = False, poll_s: float = DEFAULT_POLL_S
    ) -> RaplMeter | None:
        """A meter over the readable package (and DRAM) zones, or None when none is readable."""
        wanted = ("package", "dram") if dram else ("package",)
        zones = []
        for folder in sorted((sysfs / POWERCAP).glob("intel-rapl:*")):
            try:
                name = (folder / "name").read_text().strip()
                if not name.startswith(wanted):
                    continue
                zone = RaplZone(folder, name, int((folder / "max_energy_range_uj").read_text()))
                zone.read_uj()  # readable by us?
            except (OSError, ValueError):
                continue
            zones.append(zone)
        return cls(zones, poll_s) if zones else None

    def start(self) -> None:
        self._last = [z.read_uj() for z in self.zones]
        self._total_uj = 0
        self.trace = EnergyTrace()
        self.trace.add(time.monotonic(), 0.0)
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="rapl-poll", daemon=True)
        self._thread.start()

    def stop(self) -> float:
        """Joules used since ``start``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return self._total_uj / 1e6

    def between(self, start: float, end: float) -> float | None:
        """Joules between two ``time.monotonic()`` instants of the run, from the samples."""
        return self.trace.between(start, end)

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._sample()
            except (OSError, ValueError):
                # One unreadable sample is skipped, not fatal: the next one adds the whole
                # difference since the last good one. A zone that stays unreadable fails in
                # ``stop``, whose final sample is not caught.
                continue

    def _sample(self) -> None:
        with self._lock:
            now = [z.read_uj() for z in self.zones]
            for zone, before, after in zip(self.zones, self._last, now, strict=True):
                self._total_uj += (after - before) % (zone.max_uj + 1)
            self._last = now
            self.trace.add(time.monotonic(), self._total_uj / 1e6)
