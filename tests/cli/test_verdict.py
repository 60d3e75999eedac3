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


def test_a_default_that_broke_a_bound_in_the_selection_is_counted_over_every_round(
    tmp_path: Path,
) -> None:
    """The default broke p95_ms <= 10 in the one selection round, not in the three that
    estimate: the verdict counts its rounds over both (3 of 4), not the estimate's alone."""
    spec = StudySpec.from_dict({**SPEC.to_dict(), "outcome_constraints": ["p95_ms <= 10"]},
                               knobs=SPEC.space.knobs)  # fmt: skip
    with SQLiteStorage(tmp_path / "t.db") as storage:
        service = TuningService(storage)
        service.create_study(spec)
        default, chosen, other = service.suggest_trials(spec.name, 3, "w")
        for trial, tps in ((default, 100.0), (chosen, 150.0), (other, 140.0)):
            service.complete_trial(spec.name, trial.id, {"tps": tps, "p95_ms": 5.0})
        rows = {default.id: [(100.0, 50.0), (99.0, 5.0), (101.0, 5.0), (100.0, 5.0)],
                chosen.id: [(150.0, 5.0), (149.0, 5.0), (152.0, 5.0), (151.0, 5.0)],
                other.id: [(120.0, 5.0)]}  # fmt: skip
        for trial_id, runs in rows.items():
            service.add_measurements(spec.name, trial_id, [
                Measurement({"tps": tps, "p95_ms": p95}, MeasurementKind.CONFIRM, 0.0, r + 1)
                for r, (tps, p95) in enumerate(runs)
            ])  # fmt: skip
        best = service.best(spec.name)
        trials = service.list_trials(spec.name)
        service.close()
    assert best.confirmation is not None and best.confirmation.default_rounds() == (3, 4)
    text, _ = headline(spec, best, trials)
    assert text.startswith(f"confirmed: trial {chosen.id} meets p95_ms <= 10 in every round, "
                           "the default in 3 of 4; tps 1.51x (1.50–1.51)"), text  # fmt: skip
