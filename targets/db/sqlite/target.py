"""Embedded SQLite target: tune PRAGMAs on a real file-backed database with Python's sqlite3.

``setup()`` makes a private temporary directory (prefix ``tuner-sqlite-``) and bulk-loads a
database of about ``db_mb`` MiB once (``targets.db.sqlite.workload``). Each trial then works on
a fresh, fsynced copy of that database, so trials never see each other's writes, WAL files
or dirty pages:

* ``apply()`` copies the base file for the configuration's page size (built on first use
  with ``VACUUM INTO``, since a page size only changes on an empty database or by a vacuum),
  opens the connection the workload uses, sets every PRAGMA and reads every one back. A
  value SQLite did not take (``page_size`` and ``mmap_size`` fail silently, ``journal_mode``
  answers with the mode it actually set) rejects the configuration as INFEASIBLE.
* ``measure()`` runs the timed operation mix and returns ``ops_per_s``, ``write_tps`` and
  the ``p50_ms``/``p95_ms``/``p99_ms`` latencies.
* ``restore()`` closes the connection and deletes the trial files (``-wal``, ``-shm`` and
  ``-journal`` included); ``close()`` removes the whole directory.

PRAGMAs are applied in a fixed order on the one connection the workload uses, outside any
transaction. ``page_size`` is only read back (it is a property of the copied file).
``locking_mode`` precedes ``journal_mode``: where the wal-index lives is decided when WAL is
first entered, in heap memory (no ``-shm`` file) for a connection that is already exclusive,
and a connection that entered WAL exclusive cannot go back to normal until it leaves WAL.
``synchronous`` follows ``journal_mode`` so that the requested level, not the build's
``SQLITE_DEFAULT_WAL_SYNCHRONOUS``, is what WAL runs with. Every value is read back after
the last one is set, so an interaction between two PRAGMAs is caught as well.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from knobs.loader import load_catalog, select_knobs
from targets.base import (
    Target,
    full_config,
    option_directory,
    option_int,
    option_names_list,
    option_number,
)
from targets.db.sqlite.workload import (
    METRICS,
    WorkloadMix,
    build_database,
    copy_with_page_size,
    rows_for_size,
    run_workload,
)
from targets.host.facts import ram_bytes
from targets.host.owned_dirs import make_owned_dir, reap_orphans
from tuner.errors import ConfigRejected, StateError, TargetError, ValidationError
from tuner.space import Config, IntKnob, Knob, OrdinalKnob, Scalar

DIR_PREFIX = "tuner-sqlite-"
DEFAULT_PAGE_SIZE = 4096
TRIAL_SUFFIXES = ("", "-wal", "-shm", "-journal")
_MAX_MMAP_SIZE = 0x7FFF0000  # SQLite's compile-time default on platforms with mmap


@dataclass(frozen=True)
class _Pragma:
    """How one knob is written to and read back from a connection."""

    to_sql: Callable[[Scalar], str] | None  # None: a file property, only read back
    decode: Callable[[Any], Scalar]


def _upper(value: Scalar) -> str:
    return str(value).upper()


def _lower(raw: Any) -> Scalar:
    return str(raw).lower()


def _levels(*names: str) -> Callable[[Any], Scalar]:
    def decode(raw: Any) -> Scalar:
        return names[raw] if isinstance(raw, int) and 0 <= raw < len(names) else raw

    return decode


def _kib(raw: Any) -> Scalar:
    # Negative values are KiB; a positive one counts pages and is reported as such.
    return -raw if isinstance(raw, int) and raw < 0 else f"{raw} pages"


# Application order (see the module docstring).
PRAGMAS: dict[str, _Pragma] = {
    "page_size": _Pragma(None, int),
    "locking_mode": _Pragma(_upper, _lower),
    "journal_mode": _Pragma(_upper, _lower),
    "synchronous": _Pragma(_upper, _levels("off", "normal", "full", "extra")),
    "cache_size": _Pragma(lambda v: str(-int(v)), _kib),
    "mmap_size": _Pragma(lambda v: str(int(v)), int),
    "temp_store": _Pragma(_upper, _levels("default", "file", "memory")),
    "wal_autocheckpoint": _Pragma(lambda v: str(int(v)), int),
    "cache_spill": _Pragma(lambda v: "ON" if v else "OFF", bool),
    "secure_delete": _Pragma(_upper, _levels("off", "on", "fast")),
}


class SqliteTarget(Target):
    """A file-backed SQLite database under a single-threaded OLTP-like workload.

    Args:
        db_mb: Size of the database in MiB (about ``db_mb * 4830`` rows).
        measure_s: Seconds of measured workload per trial, at least 0.01.
        warmup_s: Seconds of unrecorded workload before the measurement.
        write_fraction: Share of operations that are small write transactions.
        range_fraction: Share of operations that are 50-100 row range reads; the rest
            are point reads. ``write_fraction + range_fraction <= 1``.
        seed: Seeds the data and the operation sequence.
        windows: Equal intervals the measured seconds are reported in while someone
            watches the trial (``Target.window``: progress, early stopping), 1-1000.
        workdir: Parent directory of the temporary directory (default: the system's).
        knobs: Catalog names of the knobs to tune (default: the whole catalog).
    """

    kind = "sqlite"

    def __init__(
        self,
        *,
        db_mb: float = 32.0,
        measure_s: float = 3.0,
        warmup_s: float = 0.5,
        write_fraction: float = 0.3,
        range_fraction: float = 0.2,
        seed: int = 0,
        windows: int = 10,
        workdir: str | Path | None = None,
        knobs: list[str] | None = None,
    ) -> None:
        self.db_mb = option_number("db_mb", db_mb, 0, 65536, open_low=True)
        self.measure_s = option_number("measure_s", measure_s, 0.01, 3600)
        self.warmup_s = option_number("warmup_s", warmup_s, 0, 3600)
        self.write_fraction = option_number("write_fraction", write_fraction, 0, 1)
        self.range_fraction = option_number("range_fraction", range_fraction, 0, 1)
        if self.write_fraction + self.range_fraction > 1:
            raise ValidationError(
                "target.range_fraction",
                f"write_fraction + range_fraction = {self.write_fraction + self.range_fraction}",
                "write_fraction + range_fraction <= 1",
            )
        self.seed = option_int("seed", seed, 0, 2**31 - 1)
        self.windows = option_int("windows", windows, 1, 1000)
        self.workdir = option_directory("workdir", workdir)
        names = option_names_list("knobs", knobs)
        self._selected = select_knobs(load_catalog("sqlite"), names, "target.knobs")
        self._explicit = names is not None
        self._knobs: tuple[Knob, ...] | None = None
        self.directory: Path | None = None
        self._rows = 0
        self._bases: dict[int, Path] = {}
        self._conn: sqlite3.Connection | None = None
        self._trial_path: Path | None = None
        self._trials = 0

    # -- contract ----------------------------------------------------------------------
    def describe_knobs(self) -> tuple[Knob, ...]:
        """The selected catalog knobs with this host's ranges and this build's defaults."""
        if self._knobs is None:
            self._knobs = _host_knobs(self._selected, self._explicit)
        return self._knobs

    def describe_metrics(self) -> dict[str, str]:
        return dict(METRICS)

    def setup(self) -> None:
        """Create the temporary directory and bulk-load the base database (once)."""
        if self.directory is not None:
            return
        reap_orphans(self.workdir, DIR_PREFIX)  # what a killed session left (owned_dirs)
        self.directory = make_owned_dir(self.workdir, DIR_PREFIX)
        self._rows = rows_for_size(self.db_mb)
        build = self.directory / "build.db"
        try:
            build_database(build, self._rows, self.seed)
            _fsync(build)
        except (sqlite3.Error, OSError) as exc:
            raise TargetError(
                f"could not build the sqlite database in {self.directory}: {exc}"
            ) from exc
        page_size = next((k.default for k in self.describe_knobs() if k.name == "page_size"), None)
        self._base_for(int(page_size) if page_size is not None else DEFAULT_PAGE_SIZE)

    def measurement_window(self) -> tuple[float, float] | None:
        return (self.warmup_s, self.measure_s)

    def set_measurement_window(self, warmup_s: float, measure_s: float) -> None:
        self.warmup_s = option_number("warmup_s", warmup_s, 0, 3600)
        self.measure_s = option_number("measure_s", measure_s, 0.01, 3600)

    def apply(self, config: Config) -> None:
        """Copy the right base file, open the connection, set and verify every PRAGMA."""
        if self.directory is None:
            raise StateError("apply() before setup(): use the sqlite target in a with block")
        if self._trial_path is not None:
            raise StateError("apply() called again before restore()")
        values = full_config("sqlite", self.describe_knobs(), config)
        page_size = int(values.get("page_size", DEFAULT_PAGE_SIZE))
        self._trials += 1
        self._trial_path = self.directory / f"trial-{self._trials}.db"
        base = self._base_for(page_size)
        try:
            shutil.copyfile(base, self._trial_path)
            _fsync(self._trial_path)
            self._conn = sqlite3.connect(self._trial_path, isolation_level=None)
        except (sqlite3.Error, OSError) as exc:
            raise TargetError(f"could not prepare the trial database: {exc}") from exc
        _apply_pragmas(self._conn, values)

    def measure(self) -> dict[str, float]:
        """Run the warm-up and the measured window on the applied configuration."""
        if self._conn is None:
            raise StateError("measure() before apply()")
        mix = WorkloadMix(self._rows, self.write_fraction, self.range_fraction, self.seed)
        try:
            return run_workload(
                self._conn, mix, self.warmup_s, self.measure_s, self.windows,
                self.window if self.watched else None,
            )  # fmt: skip
        except MemoryError as exc:
            raise ConfigRejected("out of memory while running the workload") from exc
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorname", "") == "SQLITE_NOMEM":
                raise ConfigRejected(f"SQLite ran out of memory: {exc}") from exc
            raise TargetError(f"the sqlite workload failed: {exc}") from exc

    def restore(self) -> None:
        """Close the trial connection and delete the trial files; safe to repeat."""
        conn, self._conn = self._conn, None
        path, self._trial_path = self._trial_path, None
        problems: list[str] = []
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error as exc:
                problems.append(f"closing the connection: {exc}")
        if path is not None:
            for suffix in TRIAL_SUFFIXES:
                try:
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
                except OSError as exc:
                    problems.append(f"deleting {path}{suffix}: {exc}")
        if problems:
            raise TargetError("could not restore the sqlite target: " + "; ".join(problems))

    def close(self) -> None:
        """Restore, then remove the temporary directory; safe to repeat."""
        try:
            self.restore()
        finally:
            directory, self.directory = self.directory, None
            self._bases.clear()
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
                if directory.exists():
                    raise TargetError(f"could not remove the sqlite target's directory {directory}")

    # -- inspection --------------------------------------------------------------------
    @property
    def connection(self) -> sqlite3.Connection | None:
        """The open trial connection between ``apply()`` and ``restore()``."""
        return self._conn

    @property
    def trial_path(self) -> Path | None:
        """The trial database file between ``apply()`` and ``restore()``."""
        return self._trial_path

    def current_settings(self) -> Config:
        """Every tuned PRAGMA as the trial connection reports it, in knob form."""
        if self._conn is None:
            raise StateError("current_settings() needs an applied configuration")
        return read_settings(self._conn, [k.name for k in self.describe_knobs()])

    # -- helpers -----------------------------------------------------------------------
    def _base_for(self, page_size: int) -> Path:
        """The compacted base database with ``page_size``, built on first use."""
        if page_size in self._bases:
            return self._bases[page_size]
        assert self.directory is not None
        path = self.directory / f"base-{page_size}.db"
        try:
            actual = copy_with_page_size(self.directory / "build.db", path, page_size)
            _fsync(path)
        except (sqlite3.Error, OSError) as exc:
            path.unlink(missing_ok=True)
            raise TargetError(f"could not build the page_size={page_size} database: {exc}") from exc
        if actual != page_size:
            path.unlink(missing_ok=True)
            raise ConfigRejected(f"PRAGMA page_size: requested {page_size}, read back {actual}")
        self._bases[page_size] = path
        return path


def read_settings(conn: sqlite3.Connection, names: list[str]) -> Config:
    """The PRAGMAs ``names`` as ``conn`` reports them, decoded to knob values."""
    out: Config = {}
    for name in names:
        pragma = PRAGMAS[name]  # only known names reach the SQL text
        row = conn.execute(f"PRAGMA {name}").fetchone()
        out[name] = pragma.decode(row[0]) if row is not None else "(no value)"
    return out


def _apply_pragmas(conn: sqlite3.Connection, values: Config) -> None:
    """Set every PRAGMA of ``values`` in ``PRAGMAS`` order, then check each one took."""
    for name, pragma in PRAGMAS.items():
        if name not in values or pragma.to_sql is None:
            continue
        statement = f"PRAGMA {name} = {pragma.to_sql(values[name])}"
        try:
            conn.execute(statement).fetchall()
        except sqlite3.Error as exc:
            raise ConfigRejected(f"{statement} failed: {exc}") from exc
    actual = read_settings(conn, [name for name in PRAGMAS if name in values])
    for name, got in actual.items():
        if got != values[name] or type(got) is not type(values[name]):
            raise ConfigRejected(f"PRAGMA {name}: requested {values[name]!r}, read back {got!r}")


def _host_knobs(selected: tuple[Knob, ...], explicit: bool) -> tuple[Knob, ...]:
    """Narrow host-dependent ranges and take this build's defaults."""
    ram = ram_bytes()  # the cgroup's limit when lower than the host's RAM
    defaults, max_mmap = _build_facts()
    out: list[Knob] = []
    for knob in selected:
        if knob.name == "cache_size" and ram is not None and isinstance(knob, IntKnob):
            knob = replace(knob, high=max(min(knob.high, ram // 4 // 1024), 4096))
        if knob.name == "mmap_size" and isinstance(knob, OrdinalKnob):
            cap = max_mmap if ram is None else min(max_mmap, ram // 2)
            levels = tuple(v for v in knob.choices if isinstance(v, int) and v <= cap)
            if len(levels) < 2:
                if explicit:
                    raise ValidationError(
                        "target.knobs",
                        "mmap_size cannot be tuned: this SQLite build has memory-mapped I/O off",
                        [k.name for k in selected if k.name != "mmap_size"],
                    )
                continue
            knob = replace(knob, choices=levels)
        out.append(_with_default(knob, defaults.get(knob.name)))
    return tuple(out)


def _with_default(knob: Knob, value: Scalar | None) -> Knob:
    if value is None:
        return knob
    try:
        return replace(knob, default=knob.validate(value))
    except ValidationError:
        return knob


def _build_facts() -> tuple[dict[str, Scalar], int]:
    """This build's per-connection defaults and its largest mmap_size."""
    conn = sqlite3.connect("")  # a private temporary database, deleted on close
    try:
        defaults = {
            name: PRAGMAS[name].decode(row[0])
            for name in PRAGMAS
            if name != "mmap_size" and (row := conn.execute(f"PRAGMA {name}").fetchone())
        }
        options: dict[str, str] = {}
        for (option,) in conn.execute("PRAGMA compile_options"):
            key, _, value = str(option).partition("=")
            options[key] = value
    finally:
        conn.close()
    try:
        max_mmap = int(options.get("MAX_MMAP_SIZE", str(_MAX_MMAP_SIZE)), 0)
        defaults["mmap_size"] = int(options.get("DEFAULT_MMAP_SIZE", "0"), 0)
    except ValueError:
        max_mmap = _MAX_MMAP_SIZE
    return defaults, max_mmap


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
