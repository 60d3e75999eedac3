"""What the hardware targets share: a device's knobs around a workload command, and energy.

``DeviceTarget`` runs the workload exactly as the command target runs its program and adds
the device's part: ``set_device(config)`` before the workload, ``reset_device()`` after every
trial and at close (on every exit path), and an energy meter around the workload. The meter
gives ``<prefix>energy_j`` and ``<prefix>power_w``, plus ``<prefix>energy_j_per_request``
when the workload reports ``requests``; a target without a readable energy source has no
meter and so no energy metrics at all (never invented ones).

A workload that reports the window it timed, ``window_start_s`` and ``window_end_s`` (its
``time.monotonic()`` at the start and end of the timed part; ``targets.workloads.inference`` and
``targets.workloads.pipeline`` do), is metered over that window only, when the meter kept a trace to
read it from: otherwise the energy of process start-up, imports, device initialisation and
warm-up lands on the requests too. On the H200 that was half of a short trial's energy:
17.7 mJ per request for the whole command against 9.0 for the timed part
(``bench/results/gpu/``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import ClassVar, Protocol

from targets.base import Target
from targets.command.target import CommandTarget
from tuner.space import Config, SearchSpace


class EnergyMeter(Protocol):
    def start(self) -> None: ...

    def stop(self) -> float:
        """Joules since ``start``."""
        ...


class EnergyTrace:
    """Cumulative joules at sampled instants; the energy between two instants in the span."""

    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []

    def add(self, at: float, joules: float) -> None:
        self.points.append((at, joules))

    def at(self, moment: float) -> float | None:
        """Cumulative joules at ``moment`` (linear between samples), None outside the span."""
        points = self.points
        if len(points) < 2 or not points[0][0] <= moment <= points[-1][0]:
            return None
        for (t0, j0), (t1, j1) in itertools.pairwise(points):
            if moment <= t1:
                return j0 if t1 == t0 else j0 + (j1 - j0) * (moment - t0) / (t1 - t0)
        return points[-1][1]

    def between(self, start: float, end: float) -> float | None:
        first, last = self.at(start), self.at(end)
        return None if first is None or last is None or end <= start else last - first


class SampledPower:
    """Integrates ``read_watts()`` over time in a thread (trapezoid rule).

    A reading of None (the sensor could not be read this time) is skipped; the first and
    last readings are taken in ``start`` and ``stop``.
    """

    def __init__(self, read_watts: Callable[[], float | None], period_s: float) -> None:
        self.read_watts = read_watts
        self.period_s = period_s
        self.joules = 0.0
        self.trace = EnergyTrace()
        self._last: tuple[float, float] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.joules, self._last, self.trace = 0.0, None, EnergyTrace()
        self._stop.clear()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="power-sample", daemon=True)
        self._thread.start()

    def stop(self) -> float:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return self.joules

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def _sample(self) -> None:
        watts = self.read_watts()
        if watts is None:
            return
        now = time.monotonic()
        if self._last is not None:
            self.joules += (watts + self._last[1]) / 2 * (now - self._last[0])
        self._last = (now, watts)
        self.trace.add(now, self.joules)

    def between(self, start: float, end: float) -> float | None:
        """Joules between two ``time.monotonic()`` instants of the run, from the samples."""
        return self.trace.between(start, end)


class DeviceTarget(Target):
    """A device's knobs plus a workload command; subclasses supply the device part."""

    energy_prefix: ClassVar[str] = ""
    energy_source: str = "the device"  # what the meter measures, for metric descriptions

    def __init__(self, workload: CommandTarget) -> None:
        self.workload = workload
        self._active = False

    # -- what a device provides -------------------------------------------------------
    def set_device(self, config: Config) -> None:
        """Put the device knobs of ``config`` into effect (and check they took)."""

    def reset_device(self) -> None:
        """Put the device back as it was when the target was built."""

    def energy_meter(self) -> EnergyMeter | None:
        """A meter for one workload run, or None when no energy source is readable."""
        return None

    def has_energy(self) -> bool:
        """Whether runs are metered (a target whose meters cost something says so cheaply)."""
        return self.energy_meter() is not None

    def device_metrics(self) -> dict[str, str]:
        """Further metrics ``device_measurements`` adds, name -> meaning."""
        return {}

    def device_measurements(self) -> dict[str, float]:
        """Further metrics of the run that just ended (after the meter stopped)."""
        return {}

    # -- the Target contract ------------------------------------------------------------
    def describe_metrics(self) -> dict[str, str]:
        metrics = self.workload.describe_metrics()
        if self.has_energy():
            p = self.energy_prefix
            metrics[f"{p}energy_j"] = f"energy of {self.energy_source} during the workload, J"
            metrics[f"{p}power_w"] = f"mean power of {self.energy_source} during the workload, W"
            if "requests" in metrics:
                metrics[f"{p}energy_j_per_request"] = f"{p}energy_j / requests"
        return {**metrics, **self.device_metrics()}

    def check_space(self, space: SearchSpace) -> None:
        self.workload.check_space(space)

    def setup(self) -> None:
        self._active = True
        self.workload.setup()

    def close(self) -> None:
        try:
            if self._active:
                self.reset_device()
        finally:
            self._active = False
            self.workload.close()

    def apply(self, config: Config) -> None:
        self.workload.apply(config)
        self.set_device(config)

    def measure(self) -> dict[str, float]:
        meter = self.energy_meter()
        if meter is None:
            return {**self.workload.measure(), **self.device_measurements()}
        return {
            **metered(meter, self.workload.measure, self.energy_prefix),
            **self.device_measurements(),
        }

    def restore(self) -> None:
        try:
            self.reset_device()
        finally:
            self.workload.restore()


def metered(
    meter: EnergyMeter, run: Callable[[], dict[str, float]], prefix: str = ""
) -> dict[str, float]:
    """``run()``'s metrics with the energy ``meter`` read around it: ``<prefix>energy_j``,
    ``<prefix>power_w`` and, when the metrics count ``requests``,
    ``<prefix>energy_j_per_request``. Where the run reports its timed window and the meter
    can read energy between two instants, the energy and power are the window's."""
    meter.start()
    started = time.monotonic()
    try:
        metrics = run()
    finally:
        joules = meter.stop()
        seconds = time.monotonic() - started
    window = _window(metrics)
    between = getattr(meter, "between", None)
    if window is not None and between is not None:
        timed = between(*window)
        if timed is not None:
            joules, seconds = timed, window[1] - window[0]
    out = {**metrics, f"{prefix}energy_j": joules, f"{prefix}power_w": joules / max(seconds, 1e-9)}
    if out.get("requests", 0) > 0:
        out[f"{prefix}energy_j_per_request"] = joules / out["requests"]
    return out


def _window(metrics: dict[str, float]) -> tuple[float, float] | None:
    """The timed window the workload reported, if it reported one."""
    start, end = metrics.get("window_start_s"), metrics.get("window_end_s")
    if start is None or end is None or end <= start:
        return None
    return start, end
