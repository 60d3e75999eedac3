"""``tuner tune`` on a real PostgreSQL target: a short session, and a SIGTERM in the middle.

Scale 1, two clients, one-second windows, four knobs, and a short closing confirmation (one
round of the default and the three best that chooses one, then two rounds of the default
and that one: 8 measurements instead of the default protocol's 18). Skipped where
PostgreSQL is not installed (``scripts/system_packages.sh`` installs it; CI requires it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.main import main
from runner.config import load_config
from server.storage import SQLiteStorage
from targets.db.postgres.tools import DIR_PREFIX, find_tools
from tuner.errors import TargetError, ValidationError
from tuner.trial import MeasurementKind, StepKind, TrialStatus

ROOT = Path(__file__).resolve().parents[2]


def _installed() -> bool:
    try:
        find_tools()
    except TargetError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not _installed(),
    reason="system package postgresql is not installed (initdb, postgres, pgbench)",
)

CONFIG = """
[study]
name = "{name}"
objectives = [{{ name = "tps", goal = "maximize" }}]
outcome_constraints = ["p95_ms <= 1000"]
[study.designer]
seed = 2
initial_trials = 3

[target]
kind = "postgres"
scale = 1
clients = 2
threads = 1
warmup_s = 0
measure_s = {measure_s}
knobs = ["shared_buffers", "work_mem", "random_page_cost", "checkpoint_completion_target"]
workdir = "{workdir}"

[session]
trials = {trials}
db = "{db}"
plot = "{plot}"
confirm = {confirm}
confirm_select = 1
"""


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory the ``postgres`` OS user can enter (pytest's own tmp is 0700 for root)."""
    path = Path(tempfile.mkdtemp(prefix="tuner-pgsession-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_config(
    tmp_path: Path, workdir: Path, name: str, trials: int = 5, measure_s: int = 1, confirm: int = 2
) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        CONFIG.format(
            name=name,
            trials=trials,
            measure_s=measure_s,
            confirm=confirm,
            workdir=workdir,
            db=tmp_path / "runs" / "tuner.db",
            plot=tmp_path / "runs" / f"{name}.png",
        )
    )
    return path


def servers_in(workdir: Path) -> list[int]:
    """Processes started with a data directory under ``workdir`` (a postmaster of ours)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(workdir) in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_tune_runs_a_postgres_session_and_stores_the_trials(
    tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, workdir, "pg")
    assert main(["tune", str(config)]) == 0
    out = capsys.readouterr().out
    assert "target postgres" in out
    # the session's best by the model, or that none beat the default (none may), then the answer
    assert re.search(r"the session's best by the model: trial|no trial beat the default|"
                     r"keep the default: no other trial met", out)  # fmt: skip
    with SQLiteStorage(tmp_path / "runs" / "tuner.db", read_only=True) as storage:
        trials = storage.list_trials("pg")
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 5, [t.reason for t in trials]
    assert trials[0].step is StepKind.DEFAULT
    assert trials[0].config["shared_buffers"] == 16384
    assert {t.step for t in trials[1:4]} == {StepKind.SOBOL}
    for trial in trials:
        assert trial.metrics["tps"] > 0 and trial.metrics["p95_ms"] > 0
    # the confirmation ran its rounds on the target too
    assert "confirmation rounds" in out
    with SQLiteStorage(tmp_path / "runs" / "tuner.db", read_only=True) as storage:
        confirming = storage.list_measurements("pg", kinds=[MeasurementKind.CONFIRM])
    assert len(confirming) >= 4 and all(m.metrics["tps"] > 0 for m in confirming)
    assert trials[0].id in {m.trial_id for m in confirming}
    assert not list(workdir.iterdir()), "the target left a cluster behind"
    assert servers_in(workdir) == []


@pytest.mark.slow
def test_sigterm_during_a_postgres_session_stops_the_server(tmp_path: Path, workdir: Path) -> None:
    config = write_config(tmp_path, workdir, "pgterm", trials=3, measure_s=600)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "tune", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env=env,
    )
    output: list[bytes] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not list(workdir.glob(DIR_PREFIX + "*/pgbench_log.*")):  # measuring
            assert time.monotonic() < deadline, b"".join(output).decode()
            assert proc.poll() is None, b"".join(output).decode()
            time.sleep(0.1)
        [data] = workdir.glob(DIR_PREFIX + "*/data")
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        assert postmaster in servers_in(workdir)  # with pgbench, whose log is there too
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143, b"".join(output).decode()
    finally:
        if proc.poll() is None:  # a failed check: still let the session clean up
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    with pytest.raises(ProcessLookupError):
        os.kill(postmaster, 0)
    assert servers_in(workdir) == []
    assert not list(workdir.iterdir()), "the cluster's directory survived the SIGTERM"
    with SQLiteStorage(tmp_path / "runs" / "tuner.db", read_only=True) as storage:
        [trial] = storage.list_trials("pgterm")
    assert trial.status is TrialStatus.ACTIVE and trial.step is StepKind.DEFAULT


def test_the_example_tunes_every_safe_catalog_knob_through_llamatune() -> None:
    config = load_config(ROOT / "examples" / "postgres.toml", {})
    try:
        names = config.spec.space.names
        assert len(names) == 110  # 113 less the three bools whose one safe value is left
        assert "full_page_writes" not in names and "data_sync_retry" not in names
        assert "autovacuum" not in names
        assert config.spec.embedding is not None and config.spec.embedding.dims == 16
        assert [str(c) for c in config.spec.outcome_constraints] == ["p95_ms <= 20"]
    finally:
        config.target.close()


def test_naming_an_unsafe_bool_knob_in_a_safe_study_is_an_error(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "postgres.toml").read_text()
    text = text.replace(
        'kind = "postgres"', 'kind = "postgres"\nknobs = ["work_mem", "full_page_writes"]'
    )
    path = tmp_path / "unsafe.toml"
    path.write_text(text)
    with pytest.raises(ValidationError) as err:
        load_config(path, {})
    assert err.value.field == "knobs.full_page_writes.unsafe_values"


@pytest.mark.slow
def test_a_llamatune_session_over_many_postgres_knobs(
    tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    many = (
        '["shared_buffers", "work_mem", "random_page_cost", "checkpoint_completion_target", '
        '"wal_buffers", "commit_delay", "bgwriter_lru_maxpages", "effective_io_concurrency", '
        '"max_parallel_workers_per_gather", "enable_hashjoin", "enable_seqscan", "wal_compression"]'
    )
    # no confirmation: the session above confirms on PostgreSQL, and tests/server/test_cli.py
    # a LlamaTune session's (on SQLite)
    config = write_config(tmp_path, workdir, "pg-llama", trials=4, confirm=0)
    text = config.read_text().replace(
        'knobs = ["shared_buffers", "work_mem", "random_page_cost", '
        '"checkpoint_completion_target"]',
        f"knobs = {many}",
    )
    text = text.replace("[target]", '[study.embedding]\nkind = "llamatune"\ndims = 3\n\n[target]')
    config.write_text(text)
    assert main(["tune", str(config)]) == 0
    capsys.readouterr()
    with SQLiteStorage(tmp_path / "runs" / "tuner.db", read_only=True) as storage:
        trials = storage.list_trials("pg-llama")
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 4, [t.reason for t in trials]
    assert trials[0].embedded == ()
    assert all(len(t.embedded) == 3 for t in trials[1:])
    assert not list(workdir.iterdir()), "the target left a cluster behind"
