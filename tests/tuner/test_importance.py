"""Knob importance from the study's GP (``tuner.designer.models.importance``) and
``tuner importance``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from server.records import ImportedTrial
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.designer.models.importance import MIN_TRIALS, importance
from tuner.errors import StateError, ValidationError
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

LEVELS = ("lz4", "zstd", "none")


def make_spec() -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "imp",
            "knobs": [
                {"name": "strong", "kind": "float", "low": 0.0, "high": 1.0},
                {"name": "weak", "kind": "float", "low": 0.0, "high": 1.0},
                {"name": "idle", "kind": "int", "low": 1, "high": 64},
                {"name": "codec", "kind": "categorical", "choices": list(LEVELS)},
            ],
            "objectives": [{"name": "latency_ms", "goal": "minimize"}],
            "outcome_constraints": ["errors <= 1"],
        }
    )


def response(config: dict[str, object]) -> float:
    """``strong`` moves it most, ``codec`` next (zstd costs 1), ``weak`` a little, ``idle``
    not at all; plus an interaction of strong and weak."""
    s, w = float(config["strong"]), float(config["weak"])  # type: ignore[arg-type]
    return 10 + 6 * s + 1.0 * (config["codec"] == "zstd") + 0.5 * w + 0.5 * s * w


def measured(count: int, seed: int = 0) -> list[Trial]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        config = {
            "strong": float(rng.random()),
            "weak": float(rng.random()),
            "idle": int(rng.integers(1, 65)),
            "codec": LEVELS[int(rng.integers(0, 3))],
        }
        metrics = {"latency_ms": response(config), "errors": 0.0}
        out.append(Trial(i + 1, config, TrialStatus.COMPLETED, metrics=metrics))
    return out


def test_the_knobs_are_ranked_by_how_much_they_move_the_metric() -> None:
    found = importance(make_spec(), measured(40), samples=512)
    assert [k.knob for k in found] == ["strong", "codec", "weak", "idle"]
    by = {k.knob: k for k in found}
    assert by["strong"].total > 0.7  # 6 of a range of about 7.5
    assert by["idle"].total < 0.02 and by["idle"].first < 0.02  # not in the response
    for k in found:
        assert 0.0 <= k.first <= 1.0 and 0.0 <= k.total <= 1.0
        assert k.first <= k.total + 3 * max(k.first_se, k.total_se, 0.01)
        assert k.total_se < 0.1 and k.first_se < 0.1
    # the main effects explain nearly everything (the interaction is small)
    assert 0.85 < sum(k.first for k in found) < 1.1


def test_another_metric_and_too_little_data_are_explained() -> None:
    trials = measured(MIN_TRIALS - 1)
    with pytest.raises(StateError, match=f"at least {MIN_TRIALS} completed trials"):
        importance(make_spec(), trials)
    with pytest.raises(ValidationError) as caught:
        importance(make_spec(), measured(10), metric="tps")
    assert caught.value.field == "metric" and "latency_ms" in str(caught.value)
    with pytest.raises(StateError, match="same 'errors'"):
        importance(make_spec(), measured(10), metric="errors")  # always 0


def test_the_command_ranks_the_knobs_of_a_stored_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    with SQLiteStorage(db) as storage:
        service = TuningService(storage)
        service.create_study(make_spec())
        service.import_trials(
            "imp", [ImportedTrial(t.config, metrics=t.metrics) for t in measured(30, seed=1)]
        )
    assert main(["importance", "imp", "--db", str(db), "--samples", "256", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["metric"] == "latency_ms"
    assert shown["knobs"][0]["knob"] == "strong"
    assert main(["importance", "imp", "--db", str(db), "--samples", "256"]) == 0
    table = capsys.readouterr().out
    assert "strong" in table and "█" in table and "share of the variance" in table
    assert main(["importance", "imp", "--db", str(db), "--metric", "nope"]) == 1
    assert "metric" in capsys.readouterr().err
