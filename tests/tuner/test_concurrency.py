"""Suggestions share no process-wide state: concurrent studies get their serial results.

The server suggests for many studies at once in its worker threads. Every random choice of
a suggestion takes the study's seed (samplers, starts, Thompson samples), the fit retries
nothing from torch's global generator, the thread count is set at start-up only, and one
model-based step computes at a time per process (``bo.MODEL_LOCK``); so two studies
suggested at the same time give exactly what each gives alone, and torch's global generator
is left as it was. (Without the lock the continuous study's L-BFGS-B answer moved in the
16th digit in about half of the rounds.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tuner.designer import Suggestion, make_designer
from tuner.designer.acquisition.criteria import OptimizerSettings
from tuner.designer.steps.bo import BODesigner
from tuner.designer.steps.embedded import EmbeddedDesigner
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

FAST = OptimizerSettings(num_restarts=2, raw_samples=64, maxiter=30)


def _study(name: str, knobs: list[dict[str, Any]], **extra: Any) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": knobs,
            "objectives": [{"name": "y", "goal": "minimize"}],
            "designer": {"initial_trials": 4, "seed": 11},
            **extra,
        }
    )


CONTINUOUS = _study(
    "box",
    [{"name": f"x{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(3)],
    outcome_constraints=["c <= 0.8"],
    parameter_constraints=["x0 + x1 <= 1.5"],
)
MIXED = _study(
    "mixed",
    [
        {"name": "n", "kind": "int", "low": 1, "high": 40},
        {"name": "mode", "kind": "categorical", "choices": ["a", "b", "c"]},
        {"name": "r", "kind": "float", "low": 0.01, "high": 10.0, "log": True},
    ],
)
TWO_OBJECTIVES = StudySpec.from_dict(
    {
        "name": "pareto",
        "knobs": [{"name": f"x{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(2)],
        "objectives": [{"name": "y", "goal": "minimize"}, {"name": "c", "goal": "maximize"}],
        "designer": {"initial_trials": 4, "seed": 11},
    }
)
EMBEDDED = _study(
    "llama",
    [{"name": f"k{i}", "kind": "float", "low": 0.0, "high": 1.0} for i in range(12)],
    embedding={"kind": "llamatune", "dims": 3},
)


def _value(config: dict[str, Any]) -> float:
    numbers = [float(v) for v in config.values() if not isinstance(v, str)]
    return sum((v - 0.3) ** 2 for v in numbers) + 0.1 * (config.get("mode") == "b")


def _history(spec: StudySpec, n: int) -> list[Trial]:
    """``n`` finished trials of the study, made by its own designer (as a server would)."""
    designer = make_designer(spec)
    trials: list[Trial] = []
    for i in range(n):
        (s,) = designer.suggest(1, trials, [])
        y = _value(s.config)
        trials.append(
            Trial(i + 1, s.config, TrialStatus.COMPLETED, {"y": y, "c": y / 2},
                  source=s.step.value, step=s.step, embedded=s.embedded)
        )  # fmt: skip
    return trials


def _designer(spec: StudySpec) -> Callable[[list[Trial]], list[Suggestion]]:
    if spec.embedding is not None:
        embedded = EmbeddedDesigner(spec, settings=FAST)
        return lambda trials: embedded.suggest(2, trials, [])
    bo = BODesigner(spec, settings=FAST)
    return lambda trials: bo.suggest(2, trials, [])


@pytest.fixture(scope="module")
def histories() -> dict[str, list[Trial]]:
    return {spec.name: _history(spec, 9) for spec in (CONTINUOUS, MIXED, EMBEDDED, TWO_OBJECTIVES)}


def test_a_suggestion_leaves_torchs_global_generator_alone(
    histories: dict[str, list[Trial]],
) -> None:
    for spec in (CONTINUOUS, MIXED, EMBEDDED, TWO_OBJECTIVES):
        state = torch.get_rng_state()
        threads = torch.get_num_threads()
        _designer(spec)(histories[spec.name])
        assert torch.equal(torch.get_rng_state(), state), spec.name
        assert torch.get_num_threads() == threads


def test_concurrent_studies_get_their_serial_suggestions(
    histories: dict[str, list[Trial]],
) -> None:
    specs = (CONTINUOUS, MIXED, EMBEDDED)
    serial = {spec.name: _designer(spec)(histories[spec.name]) for spec in specs}
    assert serial == {spec.name: _designer(spec)(histories[spec.name]) for spec in specs}
    for _ in range(2):  # two rounds of all three at once
        assert _concurrently(specs, histories) == serial


def _concurrently(
    specs: tuple[StudySpec, ...], histories: dict[str, list[Trial]]
) -> dict[str, list[Suggestion]]:
    results: dict[str, list[Suggestion]] = {}
    barrier = threading.Barrier(len(specs) + 1)

    def work(spec: StudySpec) -> None:
        barrier.wait()
        results[spec.name] = _designer(spec)(histories[spec.name])

    threads = [threading.Thread(target=work, args=(s,)) for s in specs]
    for thread in threads:
        thread.start()
    barrier.wait()
    torch.rand(1000)  # another user of the global generator, meanwhile
    for thread in threads:
        thread.join()
    return results
