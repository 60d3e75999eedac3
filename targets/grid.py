"""The cells of a measured grid, and the order to measure them in.

Both grid measurements of the project use this: ``python -m runner.sweep`` (a replay table
from any target) and ``python -m bench.gpu_device`` (clocks on a lent GPU). A sweep measures
its control cell (the default configuration) first, then every other cell once in a seeded
random order, so slow drift of the machine (heat, background load) spreads over the cells
instead of biasing some; with ``control_every`` it re-measures the control after every that
many cells, so the drift can be read off the table.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from typing import TypeVar

Value = TypeVar("Value")


def cells(levels: Mapping[str, Sequence[Value]]) -> list[dict[str, Value]]:
    """Every combination of the levels, in the order of ``levels`` (the last knob fastest)."""
    names = list(levels)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*levels.values())]


def measuring_order(
    grid: Sequence[Mapping[str, Value]],
    control: Mapping[str, Value] | None,
    seed: int,
    control_every: int = 0,
) -> list[dict[str, Value]]:
    """One pass over ``grid``: the control first, the other cells in ``seed``'s random order.

    ``control`` (None: no control) is measured first even when it is not a cell of the grid,
    and again after every ``control_every`` other cells (0: only first). Each other cell
    comes exactly once; the same seed gives the same order.
    """
    if control_every < 0:
        raise ValueError(f"control_every must be >= 0, got {control_every}")
    rest = [dict(cell) for cell in grid if control is None or dict(cell) != dict(control)]
    random.Random(seed).shuffle(rest)
    if control is None:
        return rest
    order = [dict(control)]
    for i, cell in enumerate(rest, start=1):
        order.append(cell)
        if control_every and i % control_every == 0:
            order.append(dict(control))
    return order
