"""The SQLite target's data and workload: a keyed table, built once, and a timed mix of ops.

The database is one table with an integer primary key, a secondary key ``k`` with an index,
an integer, a short text and a 180-byte blob; about ``ROW_BYTES`` on disk per row (table
plus index, 4 KiB pages). It is bulk-loaded once with journaling and fsync off, then copied
per page size with ``PRAGMA page_size = N; VACUUM INTO`` (which, unlike an in-place
``VACUUM``, honours the new page size even for a WAL database), so every page size starts
from an equally compact file.

The workload is single-threaded and OLTP-like. Each operation is, by the mix's fractions:

* a write transaction: ``BEGIN``, 1-5 statements (60 % updates of a random row's value and
  blob, 20 % inserts, 20 % deletes by primary key), ``COMMIT``; the commit is what
  ``journal_mode`` and ``synchronous`` make cheap or expensive;
* a range read: 50-100 rows in ``k`` order through the index, each fetched from the table;
* a point read of one row by primary key.

The sequence of operations and their arguments comes from one seeded generator, so every
trial with the same seed runs the same operations in the same order (a faster trial just
gets further). Each operation's latency is taken with ``time.perf_counter_ns``.
"""

from __future__ import annotations

import math
import random
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROW_BYTES = 217  # measured: 139,810 rows -> 28.9 MiB at 4 KiB pages
PAYLOAD_BYTES = 180
_TAGS = 97
_SCHEMA = (
    "CREATE TABLE items (id INTEGER PRIMARY KEY, k INTEGER NOT NULL, v INTEGER NOT NULL, "
    "tag TEXT NOT NULL, payload BLOB NOT NULL)"
)
_INDEX = "CREATE INDEX items_k ON items (k)"
_POINT = "SELECT v, tag, payload FROM items WHERE id = ?"
_RANGE = "SELECT id, v, tag FROM items WHERE k >= ? ORDER BY k LIMIT ?"
_UPDATE = "UPDATE items SET v = v + 1, payload = ? WHERE id = ?"
_INSERT = "INSERT INTO items (k, v, tag, payload) VALUES (?, ?, ?, ?)"
_DELETE = "DELETE FROM items WHERE id = ?"

METRICS = {
    "ops_per_s": "operations completed per second in the measured window (higher is better)",
    "write_tps": "write transactions committed per second in the measured window",
    "p50_ms": "median operation latency, milliseconds",
    "p95_ms": "95th percentile operation latency, milliseconds",
    "p99_ms": "99th percentile operation latency, milliseconds",
}


@dataclass(frozen=True)
class WorkloadMix:
    """What the timed loop runs.

    Attributes:
        rows: Rows in the freshly built table (primary keys ``1..rows``).
        write_fraction: Share of operations that are write transactions.
        range_fraction: Share of operations that are range reads; the rest are point reads.
        seed: Seeds the operation sequence.
    """

    rows: int
    write_fraction: float
    range_fraction: float
    seed: int


def rows_for_size(db_mb: float) -> int:
    """Rows that make a database of about ``db_mb`` MiB (at 4 KiB pages)."""
    return max(1000, int(db_mb * 2**20 / ROW_BYTES))


def build_database(path: Path, rows: int, seed: int) -> None:
    """Create the table at ``path`` with ``rows`` rows (fast: no journal, no fsync)."""
    rng = random.Random(f"{seed}:build")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("PRAGMA cache_size = -65536")
        conn.execute(_SCHEMA)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO items VALUES (?, ?, ?, ?, ?)",
            (
                (i, rng.randrange(rows), i, f"tag-{i % _TAGS}", rng.randbytes(PAYLOAD_BYTES))
                for i in range(1, rows + 1)
            ),
        )
        conn.execute(_INDEX)
        conn.execute("COMMIT")
    finally:
        conn.close()


def copy_with_page_size(source: Path, dest: Path, page_size: int) -> int:
    """Write a compacted copy of ``source`` with ``page_size`` to ``dest``; return its page size."""
    conn = sqlite3.connect(source, isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size = {int(page_size)}")
        conn.execute("VACUUM INTO ?", (str(dest),))
    finally:
        conn.close()
    check = sqlite3.connect(dest)
    try:
        return int(check.execute("PRAGMA page_size").fetchone()[0])
    finally:
        check.close()


def run_workload(
    conn: sqlite3.Connection,
    mix: WorkloadMix,
    warmup_s: float,
    measure_s: float,
    windows: int = 1,
    on_window: Callable[[dict[str, float]], bool] | None = None,
) -> dict[str, float]:
    """Run the mix for ``warmup_s`` (unrecorded), then ``measure_s``; return ``METRICS``.

    With ``on_window``, the measured time runs as ``windows`` equal intervals, and each
    interval's own ``METRICS`` go to ``on_window`` as it ends; True from it ends the
    measurement there, and the metrics are those of the intervals that ran.

    ``conn`` must be in autocommit mode (``isolation_level=None``): write transactions are
    explicit ``BEGIN``/``COMMIT``.
    """
    ops = _Operations(conn, mix)
    _run_for(ops, int(warmup_s * 1e9), None)
    latencies: list[int] = []
    if on_window is None:
        writes, elapsed_ns = _run_for(ops, int(measure_s * 1e9), latencies)
        return summarize(latencies, writes, elapsed_ns)
    writes = elapsed_ns = 0
    for _ in range(windows):
        first = len(latencies)
        wrote, took = _run_for(ops, int(measure_s * 1e9 / windows), latencies)
        writes, elapsed_ns = writes + wrote, elapsed_ns + took
        if on_window(summarize(latencies[first:], wrote, took)):
            break
    return summarize(latencies, writes, elapsed_ns)


def summarize(latencies_ns: list[int], writes: int, elapsed_ns: int) -> dict[str, float]:
    """Throughput and latency percentiles of one measured window."""
    if not latencies_ns or elapsed_ns <= 0:
        raise ValueError("no operation completed in the measured window")
    ordered = sorted(latencies_ns)
    seconds = elapsed_ns / 1e9
    return {
        "ops_per_s": len(ordered) / seconds,
        "write_tps": writes / seconds,
        "p50_ms": _quantile(ordered, 0.50) / 1e6,
        "p95_ms": _quantile(ordered, 0.95) / 1e6,
        "p99_ms": _quantile(ordered, 0.99) / 1e6,
    }


class _Operations:
    """The seeded operation stream over one connection."""

    def __init__(self, conn: sqlite3.Connection, mix: WorkloadMix) -> None:
        self.conn = conn
        self.mix = mix
        self.rng = random.Random(f"{mix.seed}:ops")

    def run_one(self) -> bool:
        """Run the next operation; True when it was a write transaction."""
        u = self.rng.random()
        if u < self.mix.write_fraction:
            self._write()
            return True
        if u < self.mix.write_fraction + self.mix.range_fraction:
            start = self.rng.randrange(self.mix.rows)
            self.conn.execute(_RANGE, (start, self.rng.randint(50, 100))).fetchall()
        else:
            self.conn.execute(_POINT, (self.rng.randint(1, self.mix.rows),)).fetchone()
        return False

    def _write(self) -> None:
        rng, rows = self.rng, self.mix.rows
        # An error leaves the transaction open; the target then closes the connection,
        # which rolls it back (an explicit ROLLBACK is undefined with journal_mode = OFF).
        self.conn.execute("BEGIN")
        for _ in range(rng.randint(1, 5)):
            kind = rng.random()
            if kind < 0.6:
                self.conn.execute(_UPDATE, (rng.randbytes(PAYLOAD_BYTES), rng.randint(1, rows)))
            elif kind < 0.8:
                value = rng.randrange(rows)
                tag = f"tag-{value % _TAGS}"
                self.conn.execute(_INSERT, (value, value, tag, rng.randbytes(PAYLOAD_BYTES)))
            else:
                self.conn.execute(_DELETE, (rng.randint(1, rows),))
        self.conn.execute("COMMIT")


def _run_for(ops: _Operations, duration_ns: int, latencies: list[int] | None) -> tuple[int, int]:
    """Run operations until ``duration_ns`` passed; return (writes, elapsed ns)."""
    start = now = time.perf_counter_ns()
    deadline = start + duration_ns
    writes = 0
    while now < deadline:
        wrote = ops.run_one()
        end = time.perf_counter_ns()
        if latencies is not None:
            latencies.append(end - now)
        writes += wrote
        now = end
    return writes, now - start


def _quantile(ordered: list[int], q: float) -> float:
    """Nearest-rank quantile of an ascending list."""
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])
