"""mlos-core's LlamaTune adapter + SMAC as a peer, run in its own pinned virtual environment.

mlos-core 0.6.2 needs ``numpy<2`` and ``pandas<3`` (``shared/reference/llamatune_db.md``
§3.4a), which the project's environment cannot take, so it lives in ``bench/.venv-mlos``
(made by ``bench/setup_mlos.sh`` from ``bench/mlos_requirements.txt``). This file is both
halves of the bridge:

* **parent** (``MlosPeer``, imported by ``bench/llamatune.py``): starts this file with the
  peer environment's Python and speaks JSON lines over its stdin/stdout: ``init`` (space,
  seed, settings) -> versions; ``suggest`` -> a configuration and its id; ``register`` (the
  score the parent measured, of the last suggestion or, with an ``id``, of an earlier one
  still waiting) -> ok; ``close``. The parent evaluates every configuration itself, so the
  peer runs on exactly the same problem code as every other method.
* **child** (``main``, run as a script): imports only the standard library (and
  ``bench/bridge.py``, which does the same) at module level; mlos-core, ConfigSpace and pandas
  are imported inside, from the peer environment. The child's stdout carries the protocol
  only; everything libraries print goes to stderr, which the parent keeps in a temporary file
  and quotes when the child fails (``bench/bridge.py``: both halves of the plumbing).

What the child builds (the LlamaTune paper's recipe as far as mlos-core exposes it):
``OptimizerFactory.create(optimizer_type=SMAC, optimizer_kwargs={seed, max_trials=budget,
n_random_init=10, max_ratio=1.0}, space_adapter_type=LLAMATUNE, space_adapter_kwargs=
{num_low_dims, special_param_values, max_unique_values_per_param=10000})`` over a
``ConfigurationSpace(seed=seed)`` (the seed also draws the HeSBO projection).
``max_ratio=1.0`` keeps SMAC from cutting the 10 initial points to 25 % of a small budget.
Seeds must be >= 1: the SMAC wrapper passes ``seed or -1`` to SMAC, so 0 would mean a random
seed (§3.3). With ``num_low_dims`` None the space adapter is IDENTITY (SMAC on the knobs
themselves, no special values); float and int knobs are log-scaled when the knob says
``log``.

**Special values**: in mlos-core 0.6.2 the non-special branch of
``LlamaTuneAdapter._special_param_value_scaler`` returns ``param.to_vector(x)`` for an
already-normalized ``x``, so every non-special value of a biased knob collapses to the knob's
lower bound (§3.4b). With ``special_values="patch"`` (the default) the child replaces that
method by the same logic with the one-line fix ``param.to_vector(param.to_value(x))``; with
``"off"`` it passes no special values at all. The ``init`` reply says which was done.

**One seed, one run**: the child iterates sets of strings somewhere in mlos-core, SMAC or
ConfigSpace, so with Python's per-process string hashing the same seed gave different runs
from the first model-based suggestion on (2026-12-04: four runs of TATP-20, seed 0, 20
trials, four different endings). The child runs with ``PYTHONHASHSEED`` = the run's seed:
the same seed, the same configurations; another seed, another draw of the ordering too.
Its thread limit (``bridge.thread_env``) does not change them: SMAC's forest predicts the
same with one thread as with two, only about twice as fast here.

**Registering on all-numeric spaces**: the LlamaTune adapter finds the low-dimensional point
of a suggestion by looking the suggested ``Configuration`` up in a dict, but hands the
suggestion out as a pandas Series, which upcasts a space of int and float knobs to floats;
registering it builds a ``Configuration`` of floats (``233.0``) that is not the stored one
(``233``), and mlos-core 0.6.2 refuses it ("was not suggested by the optimizer"). Found on
PostgreSQL-5, TPC-C-100 and YCSB-100 of the suite (``bench/peers/mlos.py`` gives categorical
knobs as value indices, so a float knob among them makes the whole Series float); a space of
ints only keeps int dtype and one with string choices object dtype, which is why
SYSBENCH-5 here and ``bench.llamatune``'s runs (string choices) never hit it. The child wraps
``LlamaTuneAdapter.inverse_transform`` to give integer knobs their int values back before
the lookup, and categorical knobs (choices are value indices here) their int choices
(``_patch_integer_lookup``); nothing else changes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __name__ == "__main__":  # the child, run as a script: bench.bridge is a sibling file
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import bridge

if TYPE_CHECKING:  # the child runs without the project's packages
    from bench.hdbo import KnobProblem

CHILD = Path(__file__).resolve()
DEFAULT_PYTHON = CHILD.parent / ".venv-mlos" / "bin" / "python"
PACKAGES = ("mlos-core", "smac", "ConfigSpace", "numpy", "pandas", "scikit-learn")
N_RANDOM_INIT = 10
MAX_UNIQUE_VALUES = 10_000
SPECIAL_BIAS = 0.2
SPECIAL_MODES = ("patch", "off")


class PeerUnavailable(RuntimeError):
    """The peer environment is missing or does not start."""


class PeerError(RuntimeError):
    """The peer failed while running (its message and stderr tail attached)."""


class MlosPeer:
    """One mlos-core optimizer in a child process; ``suggest``/``register`` one trial at a time.

    Args:
        python: The peer environment's interpreter.
        setup: The ``init`` message: ``knobs`` (knob dictionaries), ``seed`` (>= 1),
            ``budget``, ``num_low_dims``, ``special_values`` (``patch`` or ``off``).
        threads: Threads for the child's numerical libraries (None: their default).
    """

    def __init__(self, python: Path, setup: dict[str, Any], threads: int | None = None) -> None:
        if not Path(python).exists():
            raise PeerUnavailable(f"{python} not found: run bench/setup_mlos.sh")
        if int(setup["seed"]) < 1:
            raise ValueError("mlos-core's SMAC wrapper turns seed 0 into a random seed: use >= 1")
        env = bridge.thread_env(threads)
        env["PYTHONHASHSEED"] = str(setup["seed"])  # module doc: "One seed, one run"
        self._child = bridge.ChildProcess([str(python), str(CHILD)], "mlos peer", PeerError, env)
        self.info = self._child.call({"op": "init", **setup})

    def suggest(self) -> dict[str, Any]:
        """The next configuration, in the original (high-dimensional) space."""
        return self.suggest_point()[1]

    def suggest_point(self) -> tuple[int, dict[str, Any]]:
        """The next configuration and its id, for registering it out of order."""
        reply = self._child.call({"op": "suggest"})
        return int(reply["id"]), dict(reply["config"])

    def register(self, score: float, point: int | None = None) -> None:
        """Report the score (to be minimized) of suggestion ``point`` (None: the last one)."""
        message: dict[str, Any] = {"op": "register", "score": float(score)}
        if point is not None:
            message["id"] = point
        self._child.call(message)

    def close(self) -> None:
        """Stop the child (idempotent)."""
        self._child.close()

    def __enter__(self) -> MlosPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def probe(python: Path = DEFAULT_PYTHON) -> dict[str, Any]:
    """The peer environment's package versions; raises ``PeerUnavailable`` with the reason."""
    versions = bridge.probe(python, CHILD, "bench/setup_mlos.sh", "mlos-core")
    if isinstance(versions, str):
        raise PeerUnavailable(versions)
    return versions


def setup(problem: KnobProblem, seed: int, budget: int, dims: int, special: str) -> dict[str, Any]:
    """The ``init`` message of one run; SMAC's seed is ``seed + 1`` (its wrapper turns 0 random)."""
    return {
        "knobs": list(problem.knobs),
        "seed": seed + 1,
        "budget": budget,
        "num_low_dims": dims,
        "special_values": special,
    }


def run(
    problem: KnobProblem,
    seed: int,
    budget: int,
    dims: int,
    python: Path = DEFAULT_PYTHON,
    special: str = "patch",
    threads: int | None = None,
    on_eval: Callable[[], None] | None = None,
) -> list[float]:
    """One run of the peer on ``problem``: the values it was measured at, in order.

    The configurations come from the child; ``problem.evaluate`` runs here, and the child is
    told ``problem.sign * value`` (mlos-core minimizes).
    """
    values = []
    with MlosPeer(python, setup(problem, seed, budget, dims, special), threads) as peer:
        for _ in range(budget):
            value = problem.evaluate(peer.suggest())
            values.append(value)
            peer.register(problem.sign * value)
            if on_eval is not None:
                on_eval()
    return values


def describe(
    problems: list[tuple[KnobProblem, int]], python: Path = DEFAULT_PYTHON, special: str = "patch"
) -> dict[str, Any]:
    """Versions and special-value handling of the peer, from a throwaway child per problem.

    Args:
        problems: ``(problem, embedding dimension)`` pairs.
    """
    info: dict[str, Any] = {"special_values": {}}
    for problem, dims in problems:
        with MlosPeer(python, setup(problem, 0, 20, dims, special)) as peer:
            info["versions"] = peer.info["versions"]
            info["special_values"][problem.name] = {
                "handling": peer.info["special_values"],
                "knobs": peer.info["special_knobs"],
            }
    return info


# -- child side (runs in bench/.venv-mlos) ---------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Serve the JSON-lines protocol on stdin/stdout (``--probe``: print versions and exit)."""
    state: dict[str, Any] = {}

    pending: dict[int, Any] = {}  # suggestion id -> suggestion not yet registered

    def init(message: dict[str, Any]) -> dict[str, Any]:
        state["optimizer"], reply = _build(message)
        state["suggested"] = 0
        return reply

    def suggest(message: dict[str, Any]) -> dict[str, Any]:
        point = state["suggested"]
        state["suggested"] = point + 1
        pending[point] = state["optimizer"].suggest()
        return {"config": {k: _plain(v) for k, v in pending[point].config.items()}, "id": point}

    def register(message: dict[str, Any]) -> dict[str, Any]:
        import pandas as pd

        point = int(message.get("id", state["suggested"] - 1))
        score = pd.Series({"score": message["score"]})
        state["optimizer"].register(pending.pop(point).complete(score))
        return {"ok": True}

    handlers = {"init": init, "suggest": suggest, "register": register}
    return bridge.serve(handlers, _probe_reply, argv)


def _probe_reply() -> dict[str, Any]:
    import mlos_core  # noqa: F401  (fails here when the environment is broken)

    return _versions()


def _build(message: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The optimizer of an ``init`` message, and the reply describing it."""
    import ConfigSpace as CS
    from mlos_core.optimizers import OptimizerFactory, OptimizerType
    from mlos_core.spaces.adapters import SpaceAdapterType

    seed = int(message["seed"])
    space = CS.ConfigurationSpace(seed=seed)
    space.add([_hyperparameter(CS, knob) for knob in message["knobs"]])
    mode = message.get("special_values", "patch")
    if mode not in SPECIAL_MODES:
        raise ValueError(f"special_values must be one of {SPECIAL_MODES}, got {mode!r}")
    special: dict[str, list[tuple[int, float]]] = {}
    embed = message.get("num_low_dims") is not None  # None: SMAC on the knobs, no LlamaTune
    if mode == "patch" and embed:
        special = {
            k["name"]: [(int(v), SPECIAL_BIAS) for v in k["special_values"]]
            for k in message["knobs"]
            if k.get("special_values")
        }
        if special:
            _patch_special_value_scaler()
    if embed:
        _patch_integer_lookup()
    optimizer = OptimizerFactory.create(
        parameter_space=space,
        optimization_targets=["score"],
        optimizer_type=OptimizerType.SMAC,
        optimizer_kwargs={
            "seed": seed,
            "max_trials": int(message["budget"]),
            "n_random_init": N_RANDOM_INIT,
            "max_ratio": 1.0,
        },
        space_adapter_type=SpaceAdapterType.LLAMATUNE if embed else SpaceAdapterType.IDENTITY,
        space_adapter_kwargs={
            "num_low_dims": int(message["num_low_dims"]),
            "special_param_values": special or None,
            "max_unique_values_per_param": MAX_UNIQUE_VALUES,
        }
        if embed
        else None,
    )
    state = "patched" if special else ("none" if mode == "patch" else "off")
    reply = {
        "versions": _versions(),
        "adapter": "llamatune" if embed else "identity",
        "special_values": state,
        "special_knobs": sorted(special),
        "n_random_init": N_RANDOM_INIT,
        "max_unique_values": MAX_UNIQUE_VALUES,
    }
    return optimizer, reply


def _hyperparameter(CS: Any, knob: dict[str, Any]) -> Any:
    kind, name = knob["kind"], knob["name"]
    log = bool(knob.get("log", False))
    if kind == "float":
        return CS.Float(name, (float(knob["low"]), float(knob["high"])), log=log)
    if kind == "int":
        return CS.Integer(name, (int(knob["low"]), int(knob["high"])), log=log)
    if kind == "categorical":
        return CS.Categorical(name, list(knob["choices"]))
    raise ValueError(f"knob {name}: kind {kind!r} is not supported by the mlos peer")


def _patch_integer_lookup() -> None:
    """Give int and categorical knobs their own values back before the LlamaTune adapter's
    lookup (module doc)."""
    import ConfigSpace as CS
    import pandas as pd
    from mlos_core.spaces.adapters.llamatune import LlamaTuneAdapter

    original = LlamaTuneAdapter.inverse_transform
    if getattr(original, "integer_lookup", False):
        return

    def typed(parameter: Any, value: Any) -> Any:
        if isinstance(parameter, CS.UniformIntegerHyperparameter):
            return int(round(value))  # noqa: RUF046 (numpy<2 rounds np.float64 to a float)
        if isinstance(parameter, CS.CategoricalHyperparameter):
            return next((choice for choice in parameter.choices if choice == value), value)
        return value

    def inverse_transform(self: Any, configuration: Any) -> Any:
        space = self.orig_parameter_space
        values = {name: typed(space[name], v) for name, v in configuration.dropna().items()}
        return original(self, pd.Series(values, dtype=object))

    inverse_transform.integer_lookup = True  # type: ignore[attr-defined]
    LlamaTuneAdapter.inverse_transform = inverse_transform


def _patch_special_value_scaler() -> None:
    """Fix mlos-core 0.6.2's special-value biasing (llamatune_db.md §3.4b) in this process."""
    from mlos_core.spaces.adapters.llamatune import LlamaTuneAdapter

    def scaler(self: Any, param: Any, input_value: float) -> float:
        total = 0.0
        for special_value, share in self._special_param_values_dict[param.name]:
            total += share
            if input_value < total:
                return float(param.to_vector(special_value))
        rescaled = (input_value - total) / (1 - total)
        return float(param.to_vector(param.to_value(rescaled)))  # 0.6.2: to_vector(rescaled)

    LlamaTuneAdapter._special_param_value_scaler = scaler


def _versions() -> dict[str, str | None]:
    return bridge.versions(PACKAGES)


def _plain(value: Any) -> Any:
    """numpy scalars as Python scalars (JSON)."""
    return value.item() if hasattr(value, "item") else value


if __name__ == "__main__":
    raise SystemExit(main())
