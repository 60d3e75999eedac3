"""The postgres target's workload: pgbench's built-in scripts, and reading their results.

``pgbench -i -s SCALE`` loads the TPC-B-like tables once per session (scale 1 is 100,000
``pgbench_accounts`` rows, about 16 MB). Each measurement runs ``pgbench -n -b SCRIPT -c C
-j J -T S --random-seed SEED -l``:

* ``-n`` skips the vacuum pgbench would otherwise run first (it would flush the buffers
  the warm-up filled);
* ``-l`` writes one line per transaction (``client_id transaction_no time_us ...``) to
  ``<prefix>.<pid>`` and ``<prefix>.<pid>.<thread>`` files, from which the latency
  percentiles come, since pgbench itself prints only the average;
* ``--random-seed`` fixes the keys each client draws, so trials replay the same requests.

Throughput is pgbench's ``tps = N (without initial connection time)``. Percentiles are
nearest-rank over every logged transaction of the window, in milliseconds. A watched run
(``Target.window``) adds ``--progress=S``: each progress line is one window (its tps and
mean latency).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = ("tpcb-like", "simple-update", "select-only")
METRICS = {
    "tps": "transactions per second in the measured window, without connection time "
    "(higher is better)",
    "latency_avg_ms": "mean transaction latency reported by pgbench, milliseconds",
    "p50_ms": "median transaction latency, milliseconds",
    "p95_ms": "95th percentile transaction latency, milliseconds",
    "p99_ms": "99th percentile transaction latency, milliseconds",
}
_TPS = re.compile(
    r"^tps = ([0-9.]+) \((?:without initial connection time|excluding connections establishing)\)",
    re.MULTILINE,
)
_LATENCY = re.compile(r"^latency average = ([0-9.]+) ms", re.MULTILINE)
_PROGRESS = re.compile(r"^progress: [0-9.]+ s, ([0-9.]+) tps, lat ([0-9.]+) ms")


class WorkloadResultError(ValueError):
    """pgbench's output or logs did not hold a usable measurement."""


@dataclass(frozen=True)
class Workload:
    """What pgbench runs (validated by the target's options)."""

    script: str
    clients: int
    threads: int
    seed: int

    def init_args(self, scale: int) -> list[str]:
        """Arguments that (re)create the pgbench tables at ``scale``, quietly."""
        return ["-i", "-s", str(scale), "-q"]

    def run_args(
        self, seconds: int, log_prefix: Path | None = None, progress_s: int = 0
    ) -> list[str]:
        """Arguments of a timed run; with ``log_prefix``, a per-transaction log; with
        ``progress_s``, a progress line on stderr every that many seconds."""
        args = [
            *("-n", "-b", self.script),
            *("-c", str(self.clients), "-j", str(self.threads), "-T", str(seconds)),
            f"--random-seed={self.seed}",
        ]
        if log_prefix is not None:
            args += ["-l", f"--log-prefix={log_prefix}"]
        if progress_s:
            args.append(f"--progress={progress_s}")
        return args


def parse_summary(stdout: str) -> tuple[float, float]:
    """``(tps, latency_avg_ms)`` from pgbench's report.

    Raises:
        WorkloadResultError: The report has no ``tps = ...`` line.
    """
    tps = _TPS.search(stdout)
    if tps is None:
        raise WorkloadResultError(f"no 'tps = ...' line in pgbench's output: {stdout[-500:]!r}")
    latency = _LATENCY.search(stdout)
    return float(tps.group(1)), float(latency.group(1)) if latency else math.nan


def parse_progress(line: str) -> dict[str, float] | None:
    """One window's metrics from a ``--progress`` line (``progress: 5.0 s, 1234.5 tps, lat
    3.210 ms stddev ...``): its ``tps`` and ``latency_avg_ms``; None for any other line."""
    found = _PROGRESS.match(line)
    if found is None:
        return None
    return {"tps": float(found.group(1)), "latency_avg_ms": float(found.group(2))}


def read_latencies(log_prefix: Path) -> list[int]:
    """Transaction latencies (microseconds) from every log file of one run, then delete them.

    Failed or skipped transactions (``failed``/``skipped`` instead of a time) are left out.
    """
    latencies: list[int] = []
    for path in sorted(log_prefix.parent.glob(log_prefix.name + ".*")):
        with path.open(encoding="ascii", errors="replace") as log:
            for line in log:
                fields = line.split(maxsplit=3)
                if len(fields) >= 3 and fields[2].isdigit():
                    latencies.append(int(fields[2]))
        path.unlink()
    return latencies


def summarize(tps: float, latency_avg_ms: float, latencies_us: list[int]) -> dict[str, float]:
    """The target's metrics from pgbench's summary and the logged latencies.

    Raises:
        WorkloadResultError: No transaction completed in the window.
    """
    if not latencies_us or tps <= 0:
        raise WorkloadResultError("no transaction completed in the measured window")
    ordered = sorted(latencies_us)
    if math.isnan(latency_avg_ms):
        latency_avg_ms = sum(ordered) / len(ordered) / 1000
    return {
        "tps": tps,
        "latency_avg_ms": latency_avg_ms,
        "p50_ms": _quantile(ordered, 0.50) / 1000,
        "p95_ms": _quantile(ordered, 0.95) / 1000,
        "p99_ms": _quantile(ordered, 0.99) / 1000,
    }


def _quantile(ordered: list[int], q: float) -> float:
    """Nearest-rank quantile of an ascending list."""
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])
