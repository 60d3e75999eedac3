"""Ours with early stopping and the short-window screen (``screen_windows = 3`` of the 10
windows, the best third go on) on the simulated progression of ``ours-stop``, scored at
equal measured time; otherwise exactly ``ours-stop``."""

from __future__ import annotations

from collections.abc import Callable

from bench.contract import MethodRun, SuiteProblem
from bench.peers import ours_stop

NAME = "ours-screen"
STOPPING = {"early_stop": True, "screen_windows": 3}


def available() -> str | None:
    """Always usable."""
    return None


def run(
    problem: SuiteProblem, seed: int, budget: int, on_eval: Callable[[], None] | None = None
) -> MethodRun:
    """Ours with the rule and the screen until ``budget`` measurements' worth of time."""
    return ours_stop.run(problem, seed, budget, on_eval, STOPPING, NAME)
