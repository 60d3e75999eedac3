"""YAHPO Gym surrogates for the suite, evaluated in their own pinned virtual environment.

YAHPO Gym 1.0.2 needs ``ConfigSpace<=0.6.1`` and ``numpy<2`` (``shared/benchdata/
yahpo_data_subset``'s README line), which the project's environment cannot take, so it lives
in ``bench/.venv-yahpo`` (``bench/setup_yahpo.sh``, ``bench/yahpo_requirements.txt``). As in
``bench/mlos_peer.py``, this file is both halves of a JSON-lines bridge:

* **parent** (``YahpoBridge``, used by ``bench/suite_problems.py``): starts this file with the
  environment's Python once per process (``shared_bridge``) and asks ``eval`` (scenario,
  instance, configuration) -> the surrogate's metrics; ``close`` at exit. The knobs are read
  here, from the scenario's ``config_space.json`` (plain JSON, ConfigSpace's format), so
  that the problem is defined without the child.
* **child** (``main``): imports only the standard library (and ``bench/bridge.py``, the
  plumbing of both halves) at module level; yahpo_gym and ConfigSpace inside. Its stdout
  carries the protocol only (YAHPO prints its citations).

The search space of a problem ``yahpo:<scenario>-<instance>`` (``scenario_knobs``): the
scenario's hyperparameters minus the instance parameter (``OpenML_task_id`` for lcbench,
``task_id`` otherwise) and the fidelity parameters, which are fixed at their maximum (the
full-budget evaluation): ``epoch = 52`` (lcbench), ``trainsize = 1`` and ``repl = 10``
(rbv2_*), ``trainsize = 1`` (iaml_glmnet); the child checks these names against YAHPO's own
``instance_names`` and ``fidelity_params``. ``uniform_float``/``uniform_int`` become float/int
knobs with their bounds and log flag, ``categorical`` a categorical knob. Knobs carry no
default: ConfigSpace's defaults are range centres, not a deployed configuration, and a
default would hand ours a free first point.

**Conditionals** (rbv2_xgboost only: ``colsample_bylevel``, ``colsample_bytree``, ``eta``,
``gamma``, ``max_depth``, ``min_child_weight`` active for ``booster`` in {gbtree, dart};
``rate_drop``, ``skip_drop`` for dart): every method sees all knobs, always (a flat space);
the child drops the values of the inactive ones before it asks the surrogate
(ConfigSpace's ``deactivate_inactive_hyperparameters``, as YAHPO's check requires), so an
inactive knob's value changes nothing.

Objectives: ``val_accuracy`` (percent, maximize) for lcbench, ``acc`` (maximize) for rbv2_*,
``mmce`` (minimize) for iaml_glmnet. YAHPO's ONNX surrogates are deterministic, so the
problems are noise-free.

Reference: Pfisterer, Schneider, Moosbauer, Binder, Bischl, "YAHPO Gym - An Efficient
Multi-Objective Multi-Fidelity Benchmark for Hyperparameter Optimization", AutoML-Conf 2022.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # the child, run as a script: bench.bridge is a sibling file
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import bridge

CHILD = Path(__file__).resolve()
DEFAULT_PYTHON = CHILD.parent / ".venv-yahpo" / "bin" / "python"
FOLDER = "yahpo_data_subset"
PACKAGES = ("yahpo-gym", "ConfigSpace", "numpy", "onnxruntime")


@dataclass(frozen=True)
class Scenario:
    """How one YAHPO scenario becomes a single-objective problem.

    Attributes:
        instance: The instance parameter's name.
        fidelity: Fidelity parameters, fixed at their maximum.
        objective: The metric to optimize.
        goal: ``maximize`` or ``minimize``.
    """

    instance: str
    fidelity: tuple[str, ...]
    objective: str
    goal: str


SCENARIOS = {
    "lcbench": Scenario("OpenML_task_id", ("epoch",), "val_accuracy", "maximize"),
    "rbv2_xgboost": Scenario("task_id", ("trainsize", "repl"), "acc", "maximize"),
    "rbv2_rpart": Scenario("task_id", ("trainsize", "repl"), "acc", "maximize"),
    "iaml_glmnet": Scenario("task_id", ("trainsize",), "mmce", "minimize"),
}


class BridgeUnavailable(RuntimeError):
    """The YAHPO environment is missing or does not start."""


class BridgeError(RuntimeError):
    """The child failed while running (its message and stderr tail attached)."""


def split_name(name: str) -> tuple[str, str]:
    """``"rbv2_xgboost-16"`` -> ``("rbv2_xgboost", "16")``."""
    scenario, _, instance = name.rpartition("-")
    if scenario not in SCENARIOS or not instance:
        raise ValueError(f"yahpo problem {name!r}: expected <scenario>-<instance>, scenario in "
                         f"{sorted(SCENARIOS)}")  # fmt: skip
    return scenario, instance


def scenario_knobs(
    data_dir: Path, scenario: str, instance: str
) -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
    """The knobs of ``scenario`` and the fixed values (instance, fidelities) from its
    ``config_space.json`` under ``data_dir/yahpo_data_subset``.

    Raises:
        ValueError: The instance is not one of the scenario's, or a parameter kind is unknown.
    """
    rule = SCENARIOS[scenario]
    space = json.loads((data_dir / FOLDER / scenario / "config_space.json").read_text())
    knobs: list[dict[str, Any]] = []
    fixed: dict[str, Any] = {}
    for hp in space["hyperparameters"]:
        name, kind = hp["name"], hp["type"]
        if name == rule.instance:
            if instance not in hp["choices"]:
                raise ValueError(f"{scenario}: no instance {instance!r} in {rule.instance}")
            fixed[name] = instance
        elif name in rule.fidelity:
            fixed[name] = hp["upper"]
        elif kind in ("uniform_float", "uniform_int"):
            knob = {"name": name, "kind": "float" if kind == "uniform_float" else "int"}
            knob.update(low=hp["lower"], high=hp["upper"])
            if hp.get("log"):
                knob["log"] = True
            knobs.append(knob)
        elif kind == "categorical":
            knobs.append({"name": name, "kind": "categorical", "choices": list(hp["choices"])})
        else:
            raise ValueError(f"{scenario}: parameter {name} of kind {kind!r} is not supported")
    missing = {rule.instance, *rule.fidelity} - set(fixed)
    if missing:
        raise ValueError(f"{scenario}: config_space.json has no {sorted(missing)}")
    return tuple(knobs), fixed


class YahpoBridge:
    """One child process serving every YAHPO evaluation of this process.

    Args:
        python: The YAHPO environment's interpreter.
        data_dir: The ``shared/benchdata`` folder.
    """

    def __init__(self, python: Path, data_dir: Path) -> None:
        if not Path(python).exists():
            raise BridgeUnavailable(f"{python} not found: run bench/setup_yahpo.sh")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        argv = [str(python), str(CHILD)]
        self._child = bridge.ChildProcess(argv, "yahpo child", BridgeError, env)
        try:
            self.versions = self._child.call({"op": "init", "data_path": str(data_dir / FOLDER)})
        except BridgeError as err:
            self.close()
            raise BridgeUnavailable(str(err)) from err

    def evaluate(
        self, scenario: str, config: dict[str, Any], fixed: dict[str, Any]
    ) -> dict[str, float]:
        """The surrogate's metrics of ``config`` with the instance and fidelities ``fixed``."""
        rule = SCENARIOS[scenario]
        message = {
            "op": "eval",
            "scenario": scenario,
            "instance": fixed[rule.instance],
            "instance_param": rule.instance,
            "fidelity": list(rule.fidelity),
            "config": {**config, **fixed},
        }
        return {k: float(v) for k, v in self._child.call(message)["metrics"].items()}

    def close(self) -> None:
        """Stop the child (idempotent)."""
        self._child.close()


_BRIDGES: dict[tuple[Path, Path], YahpoBridge] = {}


def shared_bridge(python: Path, data_dir: Path) -> YahpoBridge:
    """This process's bridge for ``(python, data_dir)``, started on first use, closed at exit."""
    key = (Path(python), Path(data_dir))
    if key not in _BRIDGES:
        bridge = YahpoBridge(python, data_dir)
        _BRIDGES[key] = bridge
        atexit.register(bridge.close)
    return _BRIDGES[key]


def unavailable(python: Path = DEFAULT_PYTHON) -> str | None:
    """None when the YAHPO environment imports yahpo_gym, else why not."""
    versions = bridge.probe(python, CHILD, "bench/setup_yahpo.sh", "yahpo_gym")
    return versions if isinstance(versions, str) else None


# -- child side (runs in bench/.venv-yahpo) --------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Serve the JSON-lines protocol on stdin/stdout (``--probe``: print versions and exit)."""
    sets: dict[tuple[str, str], Any] = {}

    def init(message: dict[str, Any]) -> dict[str, Any]:
        from yahpo_gym import local_config

        local_config.init_config()
        local_config.set_data_path(message["data_path"])
        return {"versions": bridge.versions(PACKAGES)}

    def evaluate(message: dict[str, Any]) -> dict[str, Any]:
        return {"metrics": _evaluate(sets, message)}

    return bridge.serve({"init": init, "eval": evaluate}, _probe_reply, argv)


def _probe_reply() -> dict[str, Any]:
    import yahpo_gym  # noqa: F401  (fails here when the environment is broken)

    return bridge.versions(PACKAGES)


def _evaluate(sets: dict[tuple[str, str], Any], message: dict[str, Any]) -> dict[str, float]:
    from ConfigSpace.util import deactivate_inactive_hyperparameters
    from yahpo_gym import BenchmarkSet

    key = (message["scenario"], message["instance"])
    if key not in sets:
        bench = BenchmarkSet(message["scenario"], instance=message["instance"])
        names = bench.config.instance_names, sorted(bench.config.fidelity_params)
        if names != (message["instance_param"], sorted(message["fidelity"])):
            raise ValueError(f"{key}: YAHPO's instance/fidelity parameters are {names}")
        sets[key] = bench
    bench = sets[key]
    config = deactivate_inactive_hyperparameters(message["config"], bench.config_space)
    result = bench.objective_function(config.get_dictionary())[0]
    return {k: float(v) for k, v in result.items()}


if __name__ == "__main__":
    raise SystemExit(main())
