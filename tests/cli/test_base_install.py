"""The base install (no torch, no SciPy): the commands that need the optimizer name the full
install, and every command that reads results reads them, from a file and from a server.

The base install is imitated in a subprocess whose imports of torch, SciPy, BoTorch and
GPyTorch fail (a ``sys.meta_path`` finder, as on a machine without them); the results it
reads were made by a real session of the full install in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.main import main
from server.app import build_server, stop_server
from server.service import TuningService
from server.storage import SQLiteStorage

ROOT = Path(__file__).resolve().parents[2]

#: What the base install lacks.
BLOCKED = ("torch", "scipy", "botorch", "gpytorch", "linear_operator", "skopt")

#: Run first in the subprocess: imports of ``BLOCKED`` fail as they do where they are absent.
WITHOUT_FULL = f"""
import importlib.abc, sys

class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Absent())
"""

CONFIG = """
[study]
name = "{name}"
objectives = [{{ name = "ops_per_s", goal = "maximize" }}]
outcome_constraints = ["p95_ms <= 50"]
[study.designer]
seed = 3
initial_trials = 3
[target]
kind = "sqlite"
db_mb = 1
measure_s = 0.1
warmup_s = 0.02
knobs = ["journal_mode", "synchronous", "cache_size", "temp_store"]
workdir = "{workdir}"
[session]
trials = 5
db = "{db}"
plot = "{plot}"
control_every = 2
confirm = {confirm}
confirm_select = 1
"""

#: Every command that reads results, with its options.
READERS = (
    ["studies"],
    ["studies", "--format", "json"],
    ["show", "{study}"],
    ["show", "{study}", "--all"],
    ["best", "{study}"],
    ["best", "{study}", "--json"],
    ["export", "{study}", "--format", "json"],
    ["export", "{study}"],
    ["measurements", "{study}"],
    ["front", "{study}"],
    ["plot", "{study}", "--out", "{png}"],
)


def without_full(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``tuner ARGV`` in a fresh interpreter without the full install's libraries; it
    fails if any of them got loaded all the same."""
    probe = (
        WITHOUT_FULL
        + "from cli.main import main\n"
        + f"code = main({argv!r})\n"
        + f"loaded = [m for m in sys.modules if m.split('.')[0] in {BLOCKED!r}]\n"
        + "assert not loaded, loaded\n"
        + "sys.exit(code)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with two studies from real sessions of the full install: one confirmed,
    one not (``confirm = 0``: its best is the model's, ranked when the session ended)."""
    tmp = tmp_path_factory.mktemp("results")
    db = tmp / "runs" / "tuner.db"
    for name, confirm in (("confirmed", 3), ("unconfirmed", 0)):
        (tmp / name).mkdir()
        config = tmp / f"{name}.toml"
        config.write_text(
            CONFIG.format(
                name=name, workdir=tmp / name, db=db, plot=tmp / f"{name}.png", confirm=confirm
            ),
            encoding="utf-8",
        )
        assert main(["tune", str(config)]) == 0
    return db


@pytest.fixture(scope="module")
def server(results: Path) -> Iterator[str]:
    """``tuner serve`` over the same database (the full install, in this process)."""
    service = TuningService(SQLiteStorage(results))
    grpc_server, port = build_server(service, "127.0.0.1", 0)
    grpc_server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_server(grpc_server, 5).wait()
        service.close()


def test_a_command_that_needs_torch_names_the_full_install(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text(
        '[study]\nname = "s"\n[[study.knobs]]\nname = "x"\nkind = "float"\nlow = 0.0\n'
        'high = 1.0\n[[study.objectives]]\nname = "y"\n',
        encoding="utf-8",
    )
    db = str(tmp_path / "t.db")
    probe = (
        "import sys\n"
        "sys.modules['torch'] = None  # as in an install without the full extra\n"
        "from cli.main import main\n"
        f"assert main(['create', {str(config)!r}, '--db', {db!r}]) == 0\n"
        f"sys.exit(main(['ask', 's', '--db', {db!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr
    text = " ".join(done.stderr.split())
    assert "`tuner ask` needs torch" in text and "pip install -e '.[full]'" in text  # checkout


@pytest.mark.slow
@pytest.mark.parametrize("where", ["db", "server"])
def test_every_reading_command_reads_results_without_torch_or_scipy(
    results: Path, server: str, where: str, tmp_path: Path
) -> None:
    option = ["--db", str(results)] if where == "db" else ["--server", server]
    for study in ("confirmed", "unconfirmed"):
        png = tmp_path / f"{study}.png"
        for reader in READERS:
            argv = [part.format(study=study, png=png) for part in reader] + option
            done = without_full(argv)
            assert done.returncode == 0, (argv, done.stdout, done.stderr)
            assert done.stdout.strip(), argv
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.parametrize("study", ["confirmed", "unconfirmed"])
def test_the_base_install_names_the_best_the_full_install_names(
    results: Path, server: str, study: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same trial and verdict, whichever install reads, from the file or the server;
    the unconfirmed study's by the ranking the session stored at its end (the best measured,
    the model's outliers set aside)."""
    capsys.readouterr()
    assert main(["best", study, "--db", str(results), "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    unconfirmed = "measured, outliers set aside"
    assert full["basis"] == ("confirmation" if study == "confirmed" else unconfirmed)
    for option in (["--db", str(results)], ["--server", server]):
        done = without_full(["best", study, "--json", *option])
        assert done.returncode == 0, done.stderr
        base = json.loads(done.stdout)
        assert (base["id"], base["basis"], base["verdict"]) == (
            full["id"], full["basis"], full["verdict"]
        ), option  # fmt: skip
        listed = without_full(["studies", "--format", "json", *option])
        rows = {row["study"]: row for row in json.loads(listed.stdout)}
        assert rows[study]["best_trial"] == full["id"]
