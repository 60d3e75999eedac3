"""Measure a target over a grid of its knobs into a replay table (``targets/replay.py``).

Run as ``python -m runner.sweep CONFIG --out TABLE.csv [--repeats 3] [--levels KNOB=a,b,c]``.

``CONFIG`` is a ``tuner tune`` config; its target measures every cell of the grid of the
study's knobs ``--repeats`` times: ordinal, categorical and bool knobs over all their values,
int and float knobs over the values ``--levels`` gives (a knob with neither is held at its
default and left out of the table, which the output says). The default configuration is
measured first in every pass, so it is the table's first row (a replayed study takes its
defaults from there); the other cells come in a new seeded random order each pass, so slow
drift of the machine (heat, background load) spreads over the cells instead of biasing some.
Each measurement is ``Target.run_trial``: the target restores the system after it, as in a
session. Rows are appended as they are measured (a stopped sweep keeps what it measured),
with every metric the target reports plus ``status``, ``reason`` and ``trial_s`` (the
seconds the measurement took, which the replay target ignores); ``bench.replay``
benchmarks optimizers on the result. ``examples/sweep_inference.toml`` is the CPU sweep
behind ``bench/results/replay/``; on a GPU, ``examples/gpu_inference.toml`` with
``--levels`` for nothing (its knobs are all levels read from the device) sweeps clocks,
power limits and batch sizes.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from runner.config import load_config
from targets import grid
from targets.host.signals import terminate_on_sigterm
from tuner.errors import TunerError, ValidationError
from tuner.space import BoolKnob, CategoricalKnob, Knob, OrdinalKnob, Scalar, SearchSpace

console = Console()
MAX_CELLS = 5000


def grid_levels(
    space: SearchSpace, levels: dict[str, list[str]]
) -> tuple[dict[str, list[Scalar]], dict[str, Scalar]]:
    """The values each swept knob takes, and the knobs held at their default."""
    unknown = sorted(set(levels) - set(space.names))
    if unknown:
        raise ValidationError(f"--levels {unknown[0]}", "no such knob", space.names)
    swept: dict[str, list[Scalar]] = {}
    held: dict[str, Scalar] = {}
    for knob in space.knobs:
        if knob.name in levels:
            values = [_parse(knob, text) for text in levels[knob.name]]
        elif isinstance(knob, OrdinalKnob | CategoricalKnob):
            values = list(knob.choices)
        elif isinstance(knob, BoolKnob):
            values = [False, True]
        else:
            if knob.default is None:
                raise ValidationError(
                    f"--levels {knob.name}", "a numeric knob without a default needs levels"
                )
            held[knob.name] = knob.default
            continue
        values = [knob.validate(v, f"--levels {knob.name}") for v in values]
        if len(values) < 2:
            held[knob.name] = values[0]
            continue
        swept[knob.name] = list(dict.fromkeys(values))
    return swept, held


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _sweep(args)
    except TunerError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}")
        return 1


def _sweep(args: argparse.Namespace) -> int:
    levels: dict[str, list[str]] = {}
    for item in args.levels:
        name, _, values = item.partition("=")
        if not values:
            raise ValidationError("--levels", f"got {item!r}", "KNOB=v1,v2,...")
        levels[name] = values.split(",")
    config = load_config(args.config)
    space = config.spec.space
    swept, held = grid_levels(space, levels)
    if not swept:
        raise ValidationError("--levels", "nothing to sweep: every knob is held", space.names)
    default = {k.name: k.default for k in space.knobs if k.default is not None}
    count = 1
    for values in swept.values():
        count *= len(values)
    if count > args.max_cells:
        raise ValidationError("--max-cells", f"the grid has {count} cells", f"<= {args.max_cells}")
    cells = grid.cells(swept)
    first = {n: default[n] for n in swept if n in default}
    control = first if first in cells else None  # first in every pass, when it is a cell
    if held:
        console.print(f"held at: {', '.join(f'{k}={v}' for k, v in held.items())}")
    metrics = list(config.target.describe_metrics())
    header = [*swept, *metrics, "status", "reason", "trial_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    columns = [*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn()]
    with (
        terminate_on_sigterm(),
        config.target as target,
        open(args.out, "w", newline="", encoding="utf-8") as handle,
        Progress(*columns, TimeElapsedColumn(), console=console) as progress,
    ):
        writer = csv.DictWriter(handle, fieldnames=header)
        writer.writeheader()
        task = progress.add_task("sweep", total=count * args.repeats)
        for repeat in range(args.repeats):
            for cell in grid.measuring_order(cells, control, args.seed + repeat):
                started = time.monotonic()
                outcome = target.run_trial({**held, **cell})
                row: dict[str, Any] = {**cell, "status": outcome.status.value}
                row["reason"] = outcome.reason[:200]
                row["trial_s"] = round(time.monotonic() - started, 3)
                row.update({m: outcome.metrics[m] for m in metrics if m in outcome.metrics})
                writer.writerow(row)
                handle.flush()
                progress.advance(task)
    console.print(f"wrote {args.out}: {count} cells x {args.repeats} repetitions")
    return 0


def _parse(knob: Knob, text: str) -> Scalar:
    if isinstance(knob, CategoricalKnob):
        return text
    if isinstance(knob, BoolKnob):
        return text.lower() in ("1", "true", "on", "yes")
    number = float(text)
    return int(number) if number.is_integer() and not isinstance(knob.default, float) else number


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runner.sweep", description=__doc__)
    parser.add_argument("config", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the grid")
    parser.add_argument("--levels", action="append", default=[], metavar="KNOB=v1,v2")
    parser.add_argument("--seed", type=int, default=0, help="cell order")
    parser.add_argument("--max-cells", type=int, default=MAX_CELLS)
    return parser


if __name__ == "__main__":
    sys.exit(main())
