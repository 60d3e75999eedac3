"""Ours without the LlamaTune embedding: the whole knob space, as a study that names no
``embedding`` runs (the product's default); otherwise exactly ``ours``. On a problem
without ``embed_dims`` it is ``ours`` itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from bench.contract import MethodRun, SuiteProblem
from bench.peers import ours

NAME = "ours-full"


def available() -> str | None:
    """Always usable."""
    return None


def run(
    problem: SuiteProblem, seed: int, budget: int, on_eval: Callable[[], None] | None = None
) -> MethodRun:
    """``budget`` trials of our designer on the full space."""
    return ours.run(replace(problem, embed_dims=None), seed, budget, on_eval, name=NAME)
