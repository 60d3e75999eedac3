"""The measuring order of a grid sweep (``runner.sweep``, ``bench.gpu_device``)."""

from __future__ import annotations

import pytest

from targets import grid

LEVELS = {"sm_mhz": [1980, 1500, 990], "batch": [8, 64]}
DEFAULT = {"sm_mhz": 1980, "batch": 64}


def test_cells_are_every_combination_last_knob_fastest() -> None:
    assert grid.cells(LEVELS) == [
        {"sm_mhz": 1980, "batch": 8},
        {"sm_mhz": 1980, "batch": 64},
        {"sm_mhz": 1500, "batch": 8},
        {"sm_mhz": 1500, "batch": 64},
        {"sm_mhz": 990, "batch": 8},
        {"sm_mhz": 990, "batch": 64},
    ]
    assert grid.cells({}) == [{}]


def test_a_pass_measures_the_control_first_and_every_other_cell_once() -> None:
    cells = grid.cells(LEVELS)
    order = grid.measuring_order(cells, DEFAULT, seed=3)
    assert order[0] == DEFAULT
    assert len(order) == len(cells)
    assert sorted(map(str, order)) == sorted(map(str, cells))


def test_the_seed_fixes_the_order_and_passes_differ() -> None:
    cells = grid.cells({"a": list(range(6)), "b": list(range(5))})
    control = {"a": 0, "b": 0}
    first = grid.measuring_order(cells, control, seed=0)
    assert grid.measuring_order(cells, control, seed=0) == first
    assert grid.measuring_order(cells, control, seed=1) != first


def test_the_control_is_remeasured_after_every_n_cells() -> None:
    cells = grid.cells({"a": list(range(7))})
    control = {"a": 3}
    order = grid.measuring_order(cells, control, seed=5, control_every=2)
    # control, then 6 other cells with the control after the 2nd, 4th and 6th
    assert [i for i, cell in enumerate(order) if cell == control] == [0, 3, 6, 9]
    assert len(order) == 10
    assert {c["a"] for c in order} == set(range(7))


def test_a_control_outside_the_grid_still_comes_first_and_none_means_no_control() -> None:
    cells = grid.cells({"a": [1, 2, 3]})
    outside = {"a": 99}
    order = grid.measuring_order(cells, outside, seed=0, control_every=1)
    assert order[0] == outside and order.count(outside) == 4
    assert sorted(c["a"] for c in grid.measuring_order(cells, None, seed=0)) == [1, 2, 3]


def test_a_negative_control_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="control_every"):
        grid.measuring_order(grid.cells(LEVELS), DEFAULT, seed=0, control_every=-1)
