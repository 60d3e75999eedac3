"""The ``tuner`` command line, end to end on a small real SQLite target.

Sessions run for real (a 1 MiB database, 0.2 s measurements, real BoTorch fits) in-process,
against a gRPC server on 127.0.0.1, and in a subprocess that receives SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.main import main
from cli.render import unsafe_settings
from runner.config import load_config, parse_config
from server.app import build_server, stop_server
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.errors import ValidationError
from tuner.trial import MeasurementKind, StepKind, TrialStatus

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
[study]
name = "{name}"
objectives = [{{ name = "ops_per_s", goal = "maximize" }}]
outcome_constraints = ["p95_ms <= 50"]
[study.designer]
seed = 1
initial_trials = 3

[target]
kind = "sqlite"
db_mb = 1
measure_s = {measure_s}
warmup_s = 0.05
knobs = ["journal_mode", "synchronous", "cache_size", "temp_store"]
workdir = "{workdir}"

[session]
trials = {trials}
db = "{db}"
plot = "{plot}"
"""


def write_config(
    tmp_path: Path, name: str = "cli", trials: int = 5, measure_s: float = 0.2
) -> Path:
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    path = tmp_path / f"{name}.toml"
    path.write_text(
        CONFIG.format(
            name=name,
            trials=trials,
            measure_s=measure_s,
            workdir=workdir,
            db=tmp_path / "runs" / "tuner.db",
            plot=tmp_path / "runs" / f"{name}.png",
        )
    )
    return path


#: How the study's answer, the session's last lines but the changes, begins.
VERDICT = re.compile(
    r"^(confirmed: trial \d+ (is|meets)|not beyond noise: trial \d+ is|not confirmed: |"
    r"keep the default: |best by confirmed mean: trial \d+|"
    r"best (by measured value, the model's outliers set aside|measured value|by trial means)"
    r"[^:]*: trial \d+)"
)


def verdict_tail(out: str) -> list[str]:
    """The session's last lines from its headline on: the headline, then what the chosen
    configuration changes from the default (a table, or "the default configuration")."""
    lines = out.rstrip().splitlines()
    starts = [i for i, line in enumerate(lines) if VERDICT.match(line)]
    assert starts, out
    tail = lines[starts[-1] :]
    assert tail[-1].endswith(("as in the default", "the default configuration")), out
    return tail


def finished(db: Path, study: str) -> list:
    with SQLiteStorage(db, read_only=True) as storage:
        return [t for t in storage.list_trials(study) if t.status.is_final]


@pytest.mark.slow
def test_tune_runs_a_session_and_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    assert main(["tune", str(config)]) == 0
    out = capsys.readouterr().out
    assert "default configuration: trial 1 (COMPLETED): ops_per_s=" in out
    # the session's own best, its single samples said so (or, when no other trial beat the
    # default on this machine, that), then the confirmation's rounds
    flat = " ".join(out.split())
    assert re.search(r"the session's best by the model: trial \d+, ops_per_s \S+, \S+x the "
                     r"default's \(single samples, unconfirmed", flat) or (
        "no trial beat the default (ops_per_s by single samples)" in flat), flat  # fmt: skip
    assert "interleaved repeats each" in flat or "not confirmed: no candidate" in flat
    # the last lines: one answer, the confirmation's, and what it changes from the default
    tail = verdict_tail(out)
    assert tail[0].startswith(("confirmed:", "not beyond noise:", "not confirmed:")), tail
    chosen = re.search(r"trial (\d+)", tail[0])
    # which knobs mattered, from the study's model, and the command that lists them all (not
    # after the answer)
    assert "knobs that move ops_per_s most (share of the model's variance):" in flat
    assert not any("knobs that move" in line or "plot" in line for line in tail)
    assert f"tuner importance cli --db {tmp_path / 'runs' / 'tuner.db'}" in flat
    # not a terminal (captured): one line per finished trial, with its metrics
    lines = [line for line in out.splitlines() if line.startswith("trial ")]
    assert [line.split()[1] for line in lines] == ["1", "2", "3", "4", "5"]
    assert "[1/5] COMPLETED default: ops_per_s=" in lines[0] and "p95_ms=" in lines[0]
    assert (tmp_path / "runs" / "cli-confirm.json").is_file()
    db = str(tmp_path / "runs" / "tuner.db")
    assert main(["best", "cli", "--db", db, "--json"]) == 0
    named = json.loads(capsys.readouterr().out)  # the best the session named at its end
    assert chosen is not None and named["id"] == int(chosen.group(1)), (named, tail)
    assert named["basis"] == "confirmation"
    png = tmp_path / "runs" / "cli.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trials = finished(tmp_path / "runs" / "tuner.db", "cli")
    assert len(trials) == 5
    assert trials[0].step is StepKind.DEFAULT
    assert trials[0].config["journal_mode"] == "delete"
    assert {t.step for t in trials[1:4]} == {StepKind.SOBOL}
    assert all(t.status is TrialStatus.COMPLETED for t in trials)
    assert not list((tmp_path / "work").iterdir()), "the target left files behind"

    # the same config again continues the study: the budget is already spent
    assert main(["tune", str(config)]) == 0
    assert len(finished(tmp_path / "runs" / "tuner.db", "cli")) == 5
    assert main(["tune", str(config), "--trials", "6"]) == 0
    assert len(finished(tmp_path / "runs" / "tuner.db", "cli")) == 6
    capsys.readouterr()
    # each run confirmed again, its rounds numbered on from the stored ones, never mixed
    with SQLiteStorage(tmp_path / "runs" / "tuner.db", read_only=True) as storage:
        rounds = [(m.trial_id, m.round) for m in storage.list_measurements("cli")
                  if m.kind is MeasurementKind.CONFIRM]  # fmt: skip
    assert len(rounds) == len(set(rounds)) and max(r for _, r in rounds) > 7

    db = str(tmp_path / "runs" / "tuner.db")
    assert main(["studies", "--db", db]) == 0
    assert "cli" in capsys.readouterr().out
    assert main(["best", "cli", "--db", db, "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert best["status"] == "COMPLETED" and best["metrics"]["p95_ms"] <= 50

    assert main(["show", "cli", "--db", db, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [t["id"] for t in shown["trials"]] == [1, 2, 3, 4, 5, 6]
    # every trial once by default, the default too (max_repeats = 1: no racing repeats)
    default = shown["trials"][0]
    assert default["repeats"] == 1 and default["spread"] == {}
    assert all(t["repeats"] == 1 for t in shown["trials"])
    assert shown["study"]["name"] == "cli"
    out_png = tmp_path / "again.png"
    assert main(["plot", "cli", "--db", db, "--out", str(out_png)]) == 0
    # the plot the session wrote, controls, best and confirmed interval included: one
    # function draws both from what is stored
    assert out_png.read_bytes() == png.read_bytes()


def test_tune_searches_a_llamatune_embedding_when_the_config_asks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, name="llama", trials=4, measure_s=0.1)
    text = config.read_text().replace(
        "[target]", '[study.embedding]\nkind = "llamatune"\ndims = 2\n\n[target]'
    )
    config.write_text(text)
    assert main(["tune", str(config)]) == 0
    capsys.readouterr()
    db = str(tmp_path / "runs" / "tuner.db")
    assert main(["show", "llama", "--db", db, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["study"]["embedding"]["dims"] == 2
    trials = shown["trials"]
    assert trials[0]["source"] == "default" and "embedded" not in trials[0]
    assert all(len(t["embedded"]) == 2 for t in trials[1:]) and len(trials) == 4


@pytest.fixture
def grpc_server(tmp_path: Path) -> Iterator[tuple[str, SQLiteStorage]]:
    storage = SQLiteStorage(tmp_path / "server.db")
    service = TuningService(storage)
    server, port = build_server(service, "127.0.0.1", 0)
    server.start()
    try:
        yield f"127.0.0.1:{port}", storage
    finally:
        stop_server(server, 1).wait()
        storage.close()


@pytest.mark.slow
def test_tune_against_a_server(
    tmp_path: Path, grpc_server: tuple[str, SQLiteStorage], capsys: pytest.CaptureFixture[str]
) -> None:
    address, storage = grpc_server
    config = write_config(tmp_path, name="remote", trials=4)
    assert main(["tune", str(config), "--server", address]) == 0
    verdict_tail(capsys.readouterr().out)
    trials = storage.list_trials("remote")
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 4
    assert not (tmp_path / "runs" / "tuner.db").exists(), "remote sessions keep no local file"
    assert main(["best", "remote", "--server", address]) == 0


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (('kind = "sqlite"', 'kind = "oracle"'), "target.kind"),
        (('name = "ops_per_s"', 'name = "tps"'), "study.objectives[0].name"),
        (('goal = "maximize"', 'goal = "up"'), "goal"),
        (("p95_ms <= 50", "p95_ms << 50"), "outcome_constraints"),
        (("db_mb = 1", "db_mb = -1"), "target.db_mb"),
        (("initial_trials = 3", "initial_trials = 0"), "designer.initial_trials"),
    ],
)
def test_bad_config_exits_1_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str], fragment: str
) -> None:
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(*edit))
    assert main(["tune", str(config)]) == 1
    err = capsys.readouterr().err
    assert "ValidationError" in err and fragment in err


PARETO = (
    'objectives = [{ name = "ops_per_s", goal = "maximize" }]\n'
    'outcome_constraints = ["p95_ms <= 50"]',
    'objectives = [{ name = "ops_per_s", goal = "maximize" }, '
    '{ name = "p95_ms", goal = "minimize", reference = 50 }]',
)


def test_tune_with_two_objectives_reports_the_pareto_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, name="pareto", trials=6, measure_s=0.1)
    config.write_text(config.read_text().replace(*PARETO))
    assert main(["tune", str(config)]) == 0
    out = capsys.readouterr().out
    assert "Pareto front of pareto" in out and "improvement:" not in out
    png = tmp_path / "runs" / "pareto.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    db = str(tmp_path / "runs" / "tuner.db")
    assert main(["front", "pareto", "--db", db, "--json"]) == 0
    front = json.loads(capsys.readouterr().out)
    trials = finished(tmp_path / "runs" / "tuner.db", "pareto")
    assert len(trials) == 6 and front
    for member in front:  # no measured trial beats a front member in both objectives
        ops, p95 = member["metrics"]["ops_per_s"], member["metrics"]["p95_ms"]
        assert not any(
            t.metrics["ops_per_s"] >= ops and t.metrics["p95_ms"] <= p95
            and (t.metrics["ops_per_s"], t.metrics["p95_ms"]) != (ops, p95)
            for t in trials
        )  # fmt: skip
    assert main(["best", "pareto", "--db", db]) == 1
    assert "Pareto front" in capsys.readouterr().err
    assert main(["front", "pareto", "--db", db]) == 0
    assert "Pareto front of pareto" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("session", "field"),
    [("confirm = 3", "session.confirm"), ('phases = [{ knobs = ["cache_size"] }]', "phases")],
)
def test_two_objectives_reject_single_best_features(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], session: str, field: str
) -> None:
    config = write_config(tmp_path, name="pareto")
    text = config.read_text().replace(*PARETO)
    if "phases" in session:
        text = text.replace("trials = 5\n", "")
    config.write_text(text.replace("[session]\n", f"[session]\n{session}\n"))
    assert main(["tune", str(config)]) == 1
    err = capsys.readouterr().err
    assert field in err and "objectives" in err


def test_tune_with_a_bound_relative_to_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, name="rel", trials=4, measure_s=0.1)
    config.write_text(config.read_text().replace('"p95_ms <= 50"', '"p95_ms <= 1.5 * default"'))
    assert main(["tune", str(config)]) == 0
    out = capsys.readouterr().out
    trials = finished(tmp_path / "runs" / "tuner.db", "rel")
    default = trials[0]
    assert default.step is StepKind.DEFAULT
    bound = 1.5 * default.metrics["p95_ms"]
    # the default is feasible under its own bound: the summary compares the best with it (a
    # ratio, or, when none of the 3 other trials beat it on this machine, says so)
    assert (
        "the session's best by the model" in out or "no trial beat the default" in out
        or "keep the default: no other trial met" in out
    ), out  # fmt: skip
    verdict_tail(out)
    assert "default configuration is not feasible" not in out
    db = str(tmp_path / "runs" / "tuner.db")
    assert main(["best", "rel", "--db", db, "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    # the best is the confirmation's, among trials that met the resolved bound by their means
    assert best["metrics"]["p95_ms"] <= bound
    confirmed = best.get("confirmation")  # none when only the default met the bound
    assert confirmed is None or (
        confirmed["best_trial"] in (best["id"], None) and confirmed["rounds"] in (0, 5)
    )


def test_phases_reject_bounds_relative_to_each_phase_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, name="rel")
    text = config.read_text().replace('"p95_ms <= 50"', '"p95_ms <= 1.5 * default"')
    text = text.replace("trials = 5\n", "")
    phases = 'phases = [{ knobs = ["cache_size"], trials = 2 }]'
    config.write_text(text.replace("[session]\n", f"[session]\n{phases}\n"))
    assert main(["tune", str(config)]) == 1
    err = capsys.readouterr().err
    assert "session.phases" in err and "p95_ms <= 1.5 * default" in err


def test_read_commands_without_a_database_fail_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["studies", "--db", str(tmp_path / "none.db")]) == 1
    assert "no database" in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_during_a_session_cleans_up_and_the_rerun_resumes(tmp_path: Path) -> None:
    config = write_config(tmp_path, name="term", trials=3, measure_s=30.0)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "tune", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    output: list[bytes] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout or []), daemon=True)
    reader.start()
    work = tmp_path / "work"
    deadline = time.monotonic() + 120
    while not any(work.glob("tuner-sqlite-*/trial-*.db")):  # a trial is being measured
        assert time.monotonic() < deadline, b"".join(output).decode()
        assert proc.poll() is None, b"".join(output).decode()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    reader.join(timeout=10)
    assert proc.stdout is not None
    proc.stdout.close()
    said = " ".join(b"".join(output).decode().split())
    assert f"the study is saved: `tuner tune {config}` resumes it" in said
    assert not list(work.iterdir()), "temporary database left behind after SIGTERM"
    db = tmp_path / "runs" / "tuner.db"
    with SQLiteStorage(db, read_only=True) as storage:
        [trial] = storage.list_trials("term")
    assert trial.status is TrialStatus.ACTIVE and trial.step is StepKind.DEFAULT

    config.write_text(config.read_text().replace("measure_s = 30.0", "measure_s = 0.1"))
    assert main(["tune", str(config)]) == 0
    with SQLiteStorage(db, read_only=True) as storage:
        trials = storage.list_trials("term")
    assert [t.id for t in trials] == [1, 2, 3]
    assert trials[0].status is TrialStatus.COMPLETED, "the interrupted trial was resumed"


def test_the_main_job_keeps_exclusive_locking_out_and_the_summary_names_unsafe_values() -> None:
    """The main job's study is safe: ``locking_mode`` (whose ``exclusive`` locks every other
    connection out) is left at its default; naming it there is an error; with
    ``allow_unsafe = true`` a best configuration that uses it is named in the summary."""
    config = load_config(ROOT / "examples" / "sqlite.toml", {})
    try:
        assert "locking_mode" not in config.spec.space.names
        assert "journal_mode" in config.spec.space.names
    finally:
        config.target.close()
    data = tomllib.loads((ROOT / "examples" / "sqlite.toml").read_text())
    data["target"]["knobs"] = ["locking_mode", "cache_size"]
    with pytest.raises(ValidationError) as info:
        parse_config(data, {})
    assert info.value.field == "knobs.locking_mode.unsafe_values"
    data["study"]["allow_unsafe"] = True
    allowed = parse_config(data, {})
    try:
        best = {"locking_mode": "exclusive", "cache_size": 2048}
        assert unsafe_settings(allowed.spec, best) == ["locking_mode = exclusive"]
        assert unsafe_settings(allowed.spec, {**best, "locking_mode": "normal"}) == []
    finally:
        allowed.target.close()


def test_a_renamed_run_plots_to_its_own_file_beside_the_configured_one() -> None:
    config = load_config(ROOT / "examples" / "sqlite.toml", {})
    renamed = load_config(ROOT / "examples" / "sqlite.toml", {"name": "sqlite-b"})
    assert config.plot == Path("runs/sqlite-oltp.png")
    assert renamed.plot == Path("runs/sqlite-b.png")
    chosen = load_config(ROOT / "examples" / "sqlite.toml", {"name": "b", "plot": "x/p.png"})
    assert chosen.plot == Path("x/p.png")


@pytest.mark.parametrize(
    ("change", "field", "fragment"),
    [
        ({"knobs": [{"name": "a", "kind": "float", "low": 2.0, "high": 1.0}]},
         "study.knobs[0].high", "knob 'a': high (1.0) must be greater than low (2.0)"),
        ({"knobs": [{"name": "a", "kind": "float", "low": 0.0, "high": 1.0},
                    {"name": "b", "kind": "int", "low": 0, "high": 9, "default": 20}]},
         "study.knobs[1].default", "int knob 'b'"),
        ({"knobs": [{"name": "a", "kind": "strange"}]}, "study.knobs[0].kind", "unknown knob kind"),
        ({"objectives": [{"name": "y", "goal": "lowest"}]},
         "study.objectives[0].goal", "objective 'y': unknown goal 'lowest'"),
        ({"outcome_constraints": ["y <"]}, "study.outcome_constraints[0]", "cannot parse"),
    ],
)  # fmt: skip
def test_a_config_error_names_the_field_by_its_place_in_the_file(
    change: dict[str, object], field: str, fragment: str
) -> None:
    """Every error of a study in a config file has one kind of path, as the file has it:
    ``study.knobs[1].default``, not ``knobs.b.default`` beside ``study.knobs[0].kind``."""
    study = {"name": "paths", "objectives": [{"name": "y", "goal": "minimize"}]}
    study["knobs"] = [{"name": "a", "kind": "float", "low": 0.0, "high": 1.0}]
    data = {
        "study": study | change,
        "target": {"kind": "command", "command": ["echo", "y=1"], "metrics": ["y"]},
    }
    with pytest.raises(ValidationError) as info:
        parse_config(data, {})
    assert info.value.field == field
    assert fragment in str(info.value)
