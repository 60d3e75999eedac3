"""``server.best``: the model's ranking, made once by a writer and kept for readers without
the model, as long as the results it saw are unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

import server.best
from server.best import RANKED, study_best
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.confirmation import Basis
from tuner.study import StudySpec

SPEC = StudySpec.from_dict(
    {
        "name": "ranked",
        "knobs": [{"name": "x", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5}],
        "objectives": [{"name": "tps", "goal": "maximize"}],
        "designer": {"algorithm": "sobol", "seed": 2, "initial_trials": 8},
    }
)


def values(x: float) -> float:
    return 100.0 + 40.0 * x - 30.0 * x * x


def make(db: Path, trials: int) -> None:
    with SQLiteStorage(db) as storage:
        service = TuningService(storage)
        service.create_study(SPEC)
        for trial in service.suggest_trials(SPEC.name, trials, "w"):
            service.complete_trial(SPEC.name, trial.id, {"tps": values(trial.config["x"])})
        service.close()


def test_a_writer_ranks_once_and_a_reader_takes_the_stored_ranking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "t.db"
    make(db, 6)
    with SQLiteStorage(db) as storage:
        service = TuningService(storage)
        ranked = service.best(SPEC.name)
        assert ranked.basis is Basis.SCREENED and ranked.trial is not None
        event = storage.last_event(SPEC.name, RANKED)
        assert event is not None and event.trial_id == ranked.trial.id
        again = service.best(SPEC.name)  # the same results: stored, not ranked again
        assert again.trial == ranked.trial
        assert len([e for e in storage.trial_events(SPEC.name, ranked.trial.id)
                    if e.event == RANKED]) == 1  # fmt: skip
        service.close()

    def no_model(*_: object) -> None:
        raise AssertionError("a reader fitted the model")

    monkeypatch.setattr(server.best, "model_ranking", no_model)
    with SQLiteStorage(db, read_only=True) as storage:
        trials, measurements = storage.list_trials(SPEC.name), storage.list_measurements(SPEC.name)
        read = study_best(storage, SPEC, trials, measurements)
    assert (read.trial, read.basis) == (ranked.trial, Basis.SCREENED)


def test_a_reader_of_changed_results_ranks_by_trial_means_and_says_so(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    make(db, 6)
    with SQLiteStorage(db) as storage:
        service = TuningService(storage)
        service.best(SPEC.name)  # ranked and stored
        [trial] = service.suggest_trials(SPEC.name, 1, "w")
        service.complete_trial(SPEC.name, trial.id, {"tps": 500.0})  # the results changed
        service.close()
    with SQLiteStorage(db, read_only=True) as storage:
        trials = storage.list_trials(SPEC.name)
        read = study_best(storage, SPEC, trials, storage.list_measurements(SPEC.name))
    assert read.basis is Basis.TRIAL_MEANS and read.trial is not None
    assert read.trial.id == trial.id  # the best trial mean, not the stale ranking
