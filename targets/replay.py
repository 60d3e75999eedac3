"""Replay measured results from a table: benchmark a study offline, noise included.

The table is a CSV with one row per measurement (per repetition), as
``shared/reference/hw_freq.md`` §5.3 recommends: knob columns, metric columns and
optionally a ``status`` column (``COMPLETED``, ``INFEASIBLE``, ``FAILED`` or ``TIMED_OUT``,
with a ``reason``; a ``trial_s`` column, the time a measurement took, is ignored)::

    sm_mhz,batch,latency_p99_ms,energy_j_per_request
    1980,8,11.2,0.91
    1980,8,11.9,0.93          <- a second repetition of the same cell
    1410,8,13.0,0.71
    ...

    [target]
    kind = "replay"
    table = "runs/h100-sweep.csv"
    metrics = ["latency_p99_ms", "energy_j_per_request"]   # the other columns are knobs
    seed = 0

Knobs: the columns ``knobs = [...]`` names, or else every column that is not a metric,
``status``, ``reason`` or ``trial_s`` (a table with more metric columns than the study uses,
as ``runner.sweep`` writes, needs ``knobs``: its other columns are then ignored). Numeric
columns become
ordinal knobs over their distinct values, text columns categorical ones, and each knob's
default is its value in the first row (a sweep usually starts at the device's defaults).
A trial returns one repetition of its cell: the repetitions of a cell are served in a
seeded random order (the same seed replays the same sequence), so a study meets the
measurement noise the table recorded. A configuration the table has no row for is a
FAILED trial ("not measured"), never an invented number.
"""

from __future__ import annotations

import csv
import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

from targets.base import Target, option_int
from targets.command.target import metric_names
from tuner.constraints import is_number
from tuner.errors import ConfigRejected, TargetError, TrialTimedOut, ValidationError
from tuner.space import CategoricalKnob, Config, Knob, OrdinalKnob, Scalar

SPECIAL_COLUMNS = ("status", "reason", "trial_s")  # trial_s: bench.sweep's timing, ignored
STATUSES = ("COMPLETED", "INFEASIBLE", "FAILED", "TIMED_OUT")
Cell = tuple[Scalar, ...]


class ReplayTarget(Target):
    """Serves measured rows of a table (see the module doc).

    Args:
        table: Path of the CSV file, one row per measurement (repetition). Required.
        metrics: Names of the metric columns to serve, a non-empty list; each must be a column
            of the table.
        seed: Seeds the order in which a cell's repetitions are served, in ``[0, 2**31 - 1]``.
        knobs: Names of the knob columns (default: every column that is not a metric,
            ``status``, ``reason`` or ``trial_s``).
    """

    kind: ClassVar[str] = "replay"

    def __init__(
        self, *, table: Any = None, metrics: Any = None, seed: Any = 0, knobs: Any = None
    ) -> None:
        if not isinstance(table, str) or not Path(table).is_file():
            raise ValidationError("target.table", f"{table!r} is not a file", "a CSV file path")
        self.table = Path(table)
        self.metrics = metric_names(metrics)
        self.seed = option_int("seed", seed, 0, 2**31 - 1)
        header, rows = _read(self.table)
        missing = [m for m in self.metrics if m not in header]
        if missing:
            raise ValidationError(f"target.metrics.{missing[0]}", "no such column", header)
        if knobs is None:
            self.knob_names = tuple(
                c for c in header if c not in self.metrics and c not in SPECIAL_COLUMNS
            )
        else:
            self.knob_names = _knob_columns(knobs, header, self.metrics)
        if not self.knob_names:
            raise ValidationError(
                "target.table", "no knob columns (every column is a metric)", header
            )
        for line, row in enumerate(rows, start=2):
            short = [c for c in header if row.get(c) is None]
            if short or None in row:  # csv's DictReader: None fills a short row, keys a long one
                raise ValidationError(
                    f"target.table line {line}",
                    f"has no value for {short[0]!r}"
                    if short
                    else "has more fields than the header",
                    f"one value per column: {', '.join(header)}",
                )
        numeric = {name: all(is_number(row[name]) for row in rows) for name in self.knob_names}
        convert = {name: (_as_number if numeric[name] else str) for name in self.knob_names}
        self._cells: dict[Cell, list[dict[str, str]]] = defaultdict(list)
        columns: dict[str, list[Scalar]] = {name: [] for name in self.knob_names}
        for line, row in enumerate(rows, start=2):
            status = row.get("status", "") or "COMPLETED"
            if status not in STATUSES:
                raise ValidationError(f"target.table line {line}", f"status {status!r}", STATUSES)
            cell = tuple(convert[name](row[name]) for name in self.knob_names)
            for name, value in zip(self.knob_names, cell, strict=True):
                columns[name].append(value)
            if status == "COMPLETED":
                for metric in self.metrics:
                    if not math.isfinite(_number(row[metric], f"target.table line {line}", metric)):
                        raise ValidationError(
                            f"target.table line {line}", f"{metric} is not finite"
                        )
            self._cells[cell].append(row)
        self._knobs = tuple(_knob(name, values) for name, values in columns.items())
        self._served: dict[Cell, int] = defaultdict(int)
        self._cell: Cell | None = None

    @property
    def noiseless(self) -> bool:
        """True when no cell has two rows that differ (no repetitions of a measurement)."""
        return all(
            len({tuple(sorted(row.items())) for row in rows}) == 1 for rows in self._cells.values()
        )

    @property
    def cells(self) -> int:
        return len(self._cells)

    def cell_rows(self) -> dict[Cell, list[dict[str, str]]]:
        """Every measured cell (knob values in ``knob_names`` order) and its rows."""
        return dict(self._cells)

    def describe_knobs(self) -> tuple[Knob, ...]:
        return self._knobs

    def describe_metrics(self) -> dict[str, str]:
        return {name: f"column of {self.table.name}" for name in self.metrics}

    def apply(self, config: Config) -> None:
        self._cell = tuple(config.get(name) for name in self.knob_names)  # type: ignore[misc]

    def measure(self) -> dict[str, float]:
        cell = self._cell
        rows = self._cells.get(cell) if cell is not None else None
        if not rows:
            shown = dict(zip(self.knob_names, cell or (), strict=False))
            raise TargetError(f"not measured: {self.table.name} has no row for {shown}")
        count = self._served[cell]  # type: ignore[index]
        self._served[cell] += 1  # type: ignore[index]
        order = list(range(len(rows)))
        random.Random(f"{self.seed}:{cell}:{count // len(rows)}").shuffle(order)
        row = rows[order[count % len(rows)]]
        status, reason = row.get("status", "") or "COMPLETED", row.get("reason", "")
        if status == "INFEASIBLE":
            raise ConfigRejected(reason or "infeasible (replayed)")
        if status == "TIMED_OUT":
            raise TrialTimedOut(reason or "timed out (replayed)")
        if status == "FAILED":
            raise TargetError(reason or "failed (replayed)")
        return {name: float(row[name]) for name in self.metrics}

    def restore(self) -> None:
        self._cell = None


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
            header = list(reader.fieldnames or [])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValidationError("target.table", f"cannot read {path}: {exc}") from exc
    if not rows:
        raise ValidationError("target.table", f"{path} has no rows")
    return header, rows


def _as_number(text: str) -> Scalar:
    """An int when the text is one, else a float."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def _number(text: str, where: str, metric: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValidationError(where, f"{metric} = {text!r} is not a number") from None


def _knob(name: str, values: list[Scalar]) -> Knob:
    distinct = list(dict.fromkeys(values))
    if len(distinct) < 2:
        raise ValidationError(
            f"target.table column {name}",
            f"has one value ({distinct[0]!r})",
            "a knob with 2+ values, or drop the column",
        )
    if all(isinstance(v, int | float) for v in distinct):
        return OrdinalKnob(name, choices=tuple(sorted(distinct)), default=values[0])  # type: ignore[type-var]
    return CategoricalKnob(name, choices=tuple(str(v) for v in distinct), default=str(values[0]))


def _knob_columns(knobs: Any, header: list[str], metrics: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(knobs, list) or not all(isinstance(k, str) for k in knobs):
        raise ValidationError("target.knobs", f"got {knobs!r}", "a list of column names")
    allowed = [c for c in header if c not in metrics and c not in SPECIAL_COLUMNS]
    for i, name in enumerate(knobs):
        if name not in allowed:
            raise ValidationError(f"target.knobs[{i}]", f"no such knob column {name!r}", allowed)
    return tuple(dict.fromkeys(knobs))
