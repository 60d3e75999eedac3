"""Reading results back: ``tuner show``, ``studies``, ``export`` and their formats."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from server.records import ImportedTrial
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.study import StudySpec
from tuner.trial import TrialStatus

ROOT = Path(__file__).resolve().parents[2]
KNOBS = 40  # as wide as a PostgreSQL study: every knob a column would not fit anywhere


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "t.db"
    spec = StudySpec.from_dict(
        {
            "name": "wide",
            "knobs": [
                {"name": f"knob_number_{i}", "kind": "int", "low": 0, "high": 100, "default": 50}
                for i in range(KNOBS)
            ],
            "objectives": [{"name": "tps", "goal": "maximize"}],
            "outcome_constraints": ["p95_ms <= 20"],
            "designer": {"algorithm": "sobol", "seed": 1},
        }
    )
    with SQLiteStorage(path) as storage:
        service = TuningService(storage)
        service.create_study(spec)
        service.import_trials(
            "wide",
            [
                ImportedTrial({f"knob_number_{i}": 50 for i in range(KNOBS)},
                              metrics={"tps": 100.0, "p95_ms": 10.0}),
                ImportedTrial({**{f"knob_number_{i}": 50 for i in range(KNOBS)},
                               "knob_number_7": 90}, metrics={"tps": 150.0, "p95_ms": 31.0}),
                ImportedTrial({f"knob_number_{i}": 50 for i in range(KNOBS)} | {"knob_number_3": 1},
                              TrialStatus.FAILED, reason="crashed"),
            ],
        )  # fmt: skip
    return path


def test_show_fits_80_columns_without_cutting_a_value(
    db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli import common

    monkeypatch.setattr(common.out, "_width", 80)
    assert main(["show", "wide", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    flat = "".join(text.split())
    assert "knob_number_7=90" in flat and "knob_number_3=1" in flat  # what each trial changed
    assert "crashed" in flat and "ok:meetsp95_ms<=20" in flat
    rows = [line for line in text.splitlines() if line.startswith("│ ")]
    first = [cell.strip() for cell in rows[0].split("│")[1:-1]]
    assert first[:5] == ["1", "COMPLETED", "import", "yes", "1"]


def test_show_as_csv_has_every_knob_and_metric_and_feasibility(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "wide", "--db", str(db), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["feasible"] for r in rows] == ["yes", "no", ""]
    assert rows[1]["knob_number_7"] == "90" and rows[1]["tps"] == "150.0"
    assert rows[2]["status"] == "FAILED" and rows[2]["reason"] == "crashed"
    assert len(rows[0]) == 5 + 2 * 2 + KNOBS + 2


def test_listings_speak_json_and_csv(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["studies", "--db", str(db), "--format", "json"]) == 0
    [study] = json.loads(capsys.readouterr().out)
    assert study == {"study": "wide", "goal": "maximize", "objective": "tps", "knobs": KNOBS,
                     "trials": 3, "best_trial": 1}  # fmt: skip
    assert main(["studies", "--db", str(db), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"wide,maximize,tps,{KNOBS},3,1"
    assert main(["best", "wide", "--db", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == 1


def test_export_reads_into_pandas_as_documented(db: Path, tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    out = tmp_path / "wide.csv"
    assert main(["export", "wide", "--db", str(db), "--out", str(out)]) == 0
    frame = pandas.read_csv(out)  # README: pandas.read_csv("wide.csv")
    assert list(frame["id"]) == [1, 2, 3]
    assert frame.loc[frame["id"] == 2, "knob_number_7"].item() == 90
    assert main(["export", "wide", "--db", str(db), "--format", "json", "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["study"]["name"] == "wide" and len(document["trials"]) == 3


def test_a_reader_that_stops_early_ends_the_command_quietly(db: Path) -> None:
    with SQLiteStorage(db) as storage:  # far more output than a pipe holds (64 KiB)
        TuningService(storage).import_trials(
            "wide",
            [ImportedTrial({f"knob_number_{i}": (i + j) % 100 for i in range(KNOBS)},
                           metrics={"tps": float(j), "p95_ms": 1.0}) for j in range(400)],
        )  # fmt: skip
    shell = (
        f"{sys.executable} -m cli.main show wide --db {db} --format json | head -c 20; "
        "exit ${PIPESTATUS[0]}"
    )
    done = subprocess.run(
        ["bash", "-c", shell], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode in (0, 141)


def test_best_is_shown_as_its_changes_from_the_default(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SQLiteStorage(db) as storage:  # a feasible trial better than the default
        TuningService(storage).import_trials(
            "wide",
            [ImportedTrial({f"knob_number_{i}": 50 for i in range(KNOBS)} | {"knob_number_9": 64},
                           metrics={"tps": 200.0, "p95_ms": 12.0})],
        )  # fmt: skip
    assert main(["best", "wide", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in text.splitlines() if line.startswith("│")}  # fmt: skip
    assert rows["knob_number_9"] == ["50", "64", ""]
    assert f"{KNOBS - 1} other knobs as in the default" in text
    assert rows["tps"] == ["100", "200", "2x"]


def test_a_knob_a_trial_leaves_unused_is_not_listed_as_a_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With 3 queues the fourth queue's ratio does nothing: not a change worth reading."""
    path = tmp_path / "q.db"
    spec = StudySpec.from_dict(
        {
            "name": "queues",
            "knobs": [
                {"name": "num_queues", "kind": "int", "low": 1, "high": 5, "default": 4},
                {"name": "ratio_4", "kind": "float", "low": 1.1, "high": 100.0, "default": 2.0,
                 "active_when": "num_queues >= 5"},
            ],
            "objectives": [{"name": "jct_s", "goal": "minimize"}],
        }
    )  # fmt: skip
    with SQLiteStorage(path) as storage:
        service = TuningService(storage)
        service.create_study(spec)
        service.import_trials(
            "queues",
            [ImportedTrial({"num_queues": 4, "ratio_4": 2.0}, metrics={"jct_s": 100.0}),
             ImportedTrial({"num_queues": 3, "ratio_4": 50.0}, metrics={"jct_s": 80.0})],
        )  # fmt: skip
    assert main(["show", "queues", "--db", str(path)]) == 0
    flat = "".join(capsys.readouterr().out.split())
    assert "num_queues=3" in flat and "ratio_4" not in flat
    assert main(["show", "queues", "--db", str(path), "--all"]) == 0
    assert "50(unused)" in "".join(capsys.readouterr().out.split())
    assert main(["best", "queues", "--db", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "unused in this configuration: ratio_4" in out
    assert main(["show", "queues", "--db", str(path), "--format", "csv"]) == 0
    assert "50.0" in capsys.readouterr().out  # the data keeps every value
