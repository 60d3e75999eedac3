"""Ours with the self-correcting portfolio on (``designer.portfolio = true``): EXPLORE after
stagnation, then the forest beside the GP, chosen by the gains their trials measured
(``tuner/designer/strategy.py``, ``PortfolioStep``). A variant for choosing on the develop
half whether the portfolio becomes the default; otherwise exactly ``ours``.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.contract import MethodRun, SuiteProblem
from bench.peers import ours

NAME = "ours-portfolio"


def available() -> str | None:
    """Always usable."""
    return None


def run(
    problem: SuiteProblem, seed: int, budget: int, on_eval: Callable[[], None] | None = None
) -> MethodRun:
    """``budget`` trials of our designer with the portfolio on."""
    return ours.run(problem, seed, budget, on_eval, designer={"portfolio": True}, name=NAME)
