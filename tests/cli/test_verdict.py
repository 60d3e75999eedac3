"""One best for every reader (``cli.verdict``): the session's headline, ``tuner best``,
``tuner studies``, the dashboard and the plot name the same trial, the confirmation's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import dashboard
from cli.main import main
from cli.verdict import headline, reported_best
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind

SPEC = StudySpec.from_dict(
    {
        "name": "verdict",
        "knobs": [{"name": "x", "kind": "int", "low": 0, "high": 9, "default": 0}],
        "objectives": [{"name": "tps", "goal": "maximize"}],
        "designer": {"algorithm": "sobol", "seed": 1, "initial_trials": 4},
    }
)


@pytest.fixture
def confirmed(tmp_path: Path) -> Iterator[tuple[Path, dict[str, int]]]:
    """A study whose best measured trial (a lucky single sample) lost the confirmation to
    another: the default and both candidates in three interleaved rounds."""
    db = tmp_path / "t.db"
    with SQLiteStorage(db) as storage:
        service = TuningService(storage)
        service.create_study(SPEC)
        made = service.suggest_trials(SPEC.name, 3, "w")
        assert made[0].step is StepKind.DEFAULT
        ids = {"default": made[0].id, "lucky": made[1].id, "steady": made[2].id}
        session = {"default": 100.0, "lucky": 200.0, "steady": 150.0}
        rounds = {"default": (100.0, 98.0, 101.0), "lucky": (104.0, 97.0, 99.0),
                  "steady": (149.0, 151.0, 148.0)}  # fmt: skip
        for name, trial_id in ids.items():
            service.complete_trial(SPEC.name, trial_id, {"tps": session[name]})
            service.add_measurements(SPEC.name, trial_id, [
                Measurement({"tps": v}, MeasurementKind.CONFIRM, 0.0, r + 1)
                for r, v in enumerate(rounds[name])
            ])  # fmt: skip
        service.close()
        yield db, ids


def test_every_reader_names_the_confirmed_best_not_the_best_measured(
    confirmed: tuple[Path, dict[str, int]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db, ids = confirmed
    steady = ids["steady"]
    with SQLiteStorage(db, read_only=True) as storage:
        service = TuningService(storage)
        view = dashboard.study_view(service, SPEC.name)
        listed = dashboard.studies_view(service)
        trials = service.list_trials(SPEC.name)
        best = reported_best(service, SPEC.name, SPEC, trials,
                             service.list_measurements(SPEC.name))  # fmt: skip
        service.close()
    assert best.trial is not None and best.trial.id == steady
    assert view["best"] == steady and listed[0]["best_trial"] == steady
    text, tone = headline(SPEC, best, trials)
    assert text.startswith(f"confirmed: trial {steady} is 1.50x (") and tone == "good"
    assert view["verdict"]["text"] == text and view["verdict"]["confirmed"] is True
    assert view["confirmation"]["best_trial"] == steady

    capsys.readouterr()
    assert main(["best", SPEC.name, "--db", str(db), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["id"], found["basis"], found["verdict"]) == (steady, "confirmation", text)
    assert main(["studies", "--db", str(db), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["best_trial"] == steady
    assert main(["best", SPEC.name, "--db", str(db)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # the answer, then what it changes from the default, last
    assert any(line.startswith(f"confirmed: trial {steady} is 1.50x") for line in lines)
    assert lines[-1].endswith("0 other knobs as in the default")
    assert main(["plot", SPEC.name, "--db", str(db), "--out", str(tmp_path / "p.png")]) == 0


def test_the_session_best_of_single_samples_is_labelled_as_such(
    confirmed: tuple[Path, dict[str, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    db, _ = confirmed
    capsys.readouterr()
    assert main(["best", SPEC.name, "--db", str(db)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the session's measurements (single samples)" in out
