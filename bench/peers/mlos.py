"""mlos-core (SMAC, with its LlamaTune adapter where the problem embeds) as a peer.

A wrapper of ``bench/mlos_peer.py``: the optimizer runs in ``bench/.venv-mlos`` (made by
``bench/setup_mlos.sh``; mlos-core 0.6.2 needs numpy<2) behind a JSON-lines child process,
and this side measures. Unavailable, with the reason, when that environment is missing or
does not import mlos-core.

The child is built as ``bench/mlos_peer.py`` says: SMAC with ``n_random_init=10``,
``max_trials=budget``, ``max_ratio=1.0``, seed ``seed + 1`` (its wrapper turns 0 into a random
seed), LlamaTune with ``num_low_dims = problem.embed_dims`` and the patched special-value
bias when the problem has an embedding dimension below its knob count; otherwise SMAC on the
knobs themselves (IDENTITY adapter). Knobs (``_common.Encoding``): float and int knobs as
ConfigSpace ``Float``/``Integer`` (``log`` as the knob says, special values of int knobs
kept), categorical and bool knobs a ``Categorical`` over their value indices, ordinal knobs
an ``Integer`` over their level indices (an int knob reaching 2**62, which ConfigSpace's
``Integer`` cannot hold, as a ``Float``, rounded on this side); a candidate list one
``Categorical`` over the
candidates' indices (a repeated candidate is answered from its earlier measurement,
``Tracker.propose``).

mlos-core is given one score to minimize and no constraints: ``sign * value`` for a feasible
measurement, and the worst value measured so far for one that breaks a constraint, breaks
the system or fails (``_common.BadValues``; such scores wait, registered by suggestion id,
until the run has measured a value). Reported best: the best completed feasible measurement
so far.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from bench.contract import MethodRun, SuiteProblem
from bench.mlos_peer import DEFAULT_PYTHON, MlosPeer, PeerUnavailable, probe
from bench.peers._common import BadValues, Dim, Encoding, OnEval, Tracker

NAME = "mlos"
LONG_LIMIT = 2**62  # ConfigSpace's Integer bounds must fit a C long (MySQL has 2**64 - 1 knobs)


def available() -> str | None:
    """None when ``bench/.venv-mlos`` imports mlos-core, else why not."""
    return _probe()


def versions() -> dict[str, Any]:
    """The peer environment's package versions (raises ``PeerUnavailable``)."""
    return probe(DEFAULT_PYTHON)


def run(problem: SuiteProblem, seed: int, budget: int, on_eval: OnEval | None = None) -> MethodRun:
    """One run of ``budget`` evaluations (the child process lives for the run)."""
    tracker = Tracker(NAME, problem, seed, budget, on_eval)
    encoding = Encoding(problem)
    bad = BadValues(tracker.judge)
    specials = {k.name: list(k.special_values) for k in encoding.space.knobs if k.kind == "int"}
    knobs = [_knob(d, specials.get(d.name, [])) for d in encoding.dims]
    embed = problem.embed_dims
    setup = {
        "knobs": knobs,
        "seed": seed + 1,
        "budget": budget,
        "num_low_dims": embed if embed is not None and embed < len(knobs) else None,
        "special_values": "patch",
    }
    with MlosPeer(DEFAULT_PYTHON, setup) as peer:
        tracker.notes[f"adapter_{peer.info['adapter']}"] = 1
        while not tracker.done:
            if tracker.stalled:
                tracker.fill()
                break
            point, raw = peer.suggest_point()
            measurement, _ = tracker.propose(encoding.decode(raw))
            for waiting, score in bad.add(point, measurement):
                peer.register(score, waiting)
    return tracker.result()


@lru_cache(maxsize=1)
def _probe() -> str | None:
    try:
        probe(DEFAULT_PYTHON)
    except PeerUnavailable as err:
        return str(err)
    return None


def _knob(dim: Dim, special_values: list[Any]) -> dict[str, Any]:
    if dim.kind == "categorical":
        return {"name": dim.name, "kind": "categorical", "choices": list(range(int(dim.high) + 1))}
    kind = "float" if dim.kind == "float" else "int"
    if kind == "int" and max(abs(dim.low), abs(dim.high)) >= LONG_LIMIT:
        kind, special_values = "float", []  # rounded by Encoding.decode
    knob: dict[str, Any] = {"name": dim.name, "kind": kind, "low": dim.low, "high": dim.high}
    if dim.log:
        knob["log"] = True
    if special_values:
        knob["special_values"] = special_values
    return knob
