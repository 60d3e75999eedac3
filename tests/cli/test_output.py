"""How commands end and print, through real pipes and processes: a reader that goes away,
tables into a pipe, install hints as printed, and a ``--server`` that nobody answers."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli import common
from cli.main import main
from cli.parser import build_parser
from server.records import ImportedTrial
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.study import StudySpec
from tuner.trial import TrialStatus

ROOT = Path(__file__).resolve().parents[2]
KNOBS = 40
ROWS = 600  # every format is far more than a pipe holds (64 KiB)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study of 40 knobs and 600 trials; trial 3 failed with brackets in its reason."""
    path = tmp_path_factory.mktemp("output") / "t.db"
    spec = StudySpec.from_dict(
        {
            "name": "wide",
            "knobs": [
                {"name": f"knob_number_{i}", "kind": "int", "low": 0, "high": 999, "default": 5}
                for i in range(KNOBS)
            ],
            "objectives": [{"name": "tps", "goal": "maximize"}],
            "designer": {"algorithm": "sobol", "seed": 1},
        }
    )
    rows = [
        ImportedTrial({f"knob_number_{i}": (7 * i + j) % 1000 for i in range(KNOBS)},
                      metrics={"tps": float(j)})
        for j in range(ROWS)
    ]  # fmt: skip
    rows[2] = ImportedTrial(rows[2].config, TrialStatus.FAILED, reason="[/opt/x] not found [ok]")
    with SQLiteStorage(path) as storage:
        service = TuningService(storage)
        service.create_study(spec)
        service.import_trials("wide", rows)
    return path


def run(shell: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    """``shell`` under bash, ``tuner`` being this checkout's CLI, COLUMNS unset."""
    environ = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    environ.update(PYTHONPATH=str(ROOT), **env)
    tuner = f"{sys.executable} -m cli.main"
    return subprocess.run(
        ["bash", "-c", shell.replace("tuner ", f"{tuner} ")], cwd=cwd, capture_output=True,
        text=True, timeout=300, env=environ,
    )  # fmt: skip


@pytest.mark.parametrize("unbuffered", ["", "1"])
@pytest.mark.parametrize("options", ["", "--all", "--format json", "--format csv"])
def test_every_format_ends_141_without_a_word_when_the_reader_goes_away(
    wide: Path, options: str, unbuffered: str
) -> None:
    """``| head -c 100`` reads a little and exits; the rest cannot be written. Unbuffered
    (PYTHONUNBUFFERED=1, as the systemd unit sets it) Python would drop it silently."""
    done = run(
        f"tuner show wide --db {wide} {options} | head -c 100 > /dev/null; exit ${{PIPESTATUS[0]}}",
        PYTHONUNBUFFERED=unbuffered,
    )
    assert (done.returncode, done.stderr) == (141, "")


def test_a_piped_table_has_every_cell_whole_one_row_a_line(wide: Path) -> None:
    """Into a pipe, ``show --all`` of 40 knobs is as wide as its cells (rich would squeeze
    it into 80 columns: 2 characters a knob), so grep and cut see one trial per line."""
    done = run(f"tuner show wide --db {wide} --all | cat")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if "knob_number_0" in line)
    cells = [c.strip() for c in header.split("┃")[1:-1]]
    assert cells[-KNOBS - 1 :] == [f"knob_number_{i}" for i in range(KNOBS)] + ["reason"]
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == ROWS  # none folded onto a second line
    third = [c.strip() for c in rows[2].split("│")[1:-1]]
    assert third[:2] == ["3", "FAILED"] and third[-1] == "[/opt/x] not found [ok]"
    assert third[-KNOBS - 1 : -1] == [str((7 * i + 2) % 1000) for i in range(KNOBS)]


def test_a_terminal_width_in_columns_still_applies_to_a_pipe(wide: Path) -> None:
    done = run(f"tuner show wide --db {wide} | cat", COLUMNS="100")
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 100


def hint_of(command: str, blocked: str, cwd: Path, tmp_path: Path) -> str:
    """stderr of ``tuner COMMAND`` run in ``cwd`` as if ``blocked`` were not installed."""
    probe = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        f"from cli.main import main\nsys.exit(main({command.split()!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    return " ".join(done.stderr.split())


def test_a_missing_module_names_the_extra_that_brings_it_brackets_and_all(
    wide: Path, tmp_path: Path
) -> None:
    """Printed through rich, ``'.[ray]'`` used to lose its ``[ray]`` to markup."""
    ray = hint_of(f"ray {ROOT / 'examples' / 'ray_sort.toml'}", "ray", ROOT, tmp_path)
    assert ray == (
        "error: `tuner ray` needs ray, which comes with the ray extra (Ray Tune): "
        "pip install -e '.[ray]'"
    )
    board = hint_of(f"dashboard --db {wide} --port 0", "plotly", ROOT, tmp_path)
    assert board.startswith("error: `tuner dashboard` needs plotly, which comes with the "
                            "dashboard extra")  # fmt: skip
    assert board.endswith("pip install -e '.[dashboard]'")
    elsewhere = hint_of(f"dashboard --db {wide} --port 0", "plotly", tmp_path, tmp_path)
    assert elsewhere.endswith(f"pip install -e '{ROOT}[dashboard]'")  # run from elsewhere


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_nobody_answers_is_one_line_naming_it() -> None:
    server = f"127.0.0.1:{free_port()}"
    done = run(f"tuner studies --server {server}")
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: TunerError: tuner server at {server} not ready after 3 s")
    assert "Connection refused" in line and f"tuner serve --port {server.split(':')[1]}" in line


#: A valid command line after ``tuner COMMAND`` for each command with ``--server``.
ARGS = {
    "tune": ["{config}"], "daemon": ["{config}"], "ray": ["{config}"], "create": ["{config}"],
    "confirm": ["{config}"],
    "ask": ["s"], "tell": ["s", "1", "--failed", "why"], "heartbeat": ["s", "1"],
    "report": ["s", "1", "--metric", "tps=1"],
    "import": ["s", "--csv", "{config}"], "studies": [], "show": ["s"], "best": ["s"],
    "front": ["s"], "export": ["s"], "measurements": ["s"], "importance": ["s"],
    "plot": ["s"], "dashboard": ["--port", "0"],
}  # fmt: skip


def commands_with_server() -> list[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(
        name for name, p in sub.choices.items()
        if any("--server" in a.option_strings for a in p._actions)
    )  # fmt: skip


def test_every_command_with_server_is_checked() -> None:
    assert commands_with_server() == sorted(ARGS)


@pytest.mark.parametrize("command", sorted(ARGS))
def test_every_command_says_which_server_does_not_answer(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(common, "READY_WAIT_S", 0.5)  # the same path, sooner
    config = tmp_path / "s.toml"
    config.write_text(
        '[study]\nname = "s"\n[[study.knobs]]\nname = "x"\nkind = "float"\nlow = 0.0\n'
        'high = 1.0\n[[study.objectives]]\nname = "y"\n[target]\nkind = "command"\n'
        f'command = ["true"]\nmetrics = ["y"]\n[session]\ndb = "{tmp_path / "t.db"}"\n',
        encoding="utf-8",
    )
    server = f"127.0.0.1:{free_port()}"
    argv = [command, *(a.format(config=config) for a in ARGS[command]), "--server", server]
    assert main(argv) == 1
    printed = capsys.readouterr()
    [line] = printed.err.splitlines()
    assert line.startswith(f"error: TunerError: tuner server at {server} not ready"), line
    assert "Connection refused" in line


def test_brackets_in_values_print_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """rich reads ``[a]`` as a style and ``[/tmp]`` as a closing tag: a categorical value
    vanished, a failure reason with a path stopped ``show --all`` with MarkupError."""
    path = tmp_path / "b.db"
    spec = StudySpec.from_dict(
        {
            "name": "br",
            "knobs": [{"name": "mode", "kind": "categorical", "choices": ["[a]", "b"],
                       "default": "b"}],
            "objectives": [{"name": "tps", "goal": "maximize"}],
        }
    )  # fmt: skip
    with SQLiteStorage(path) as storage:
        service = TuningService(storage)
        service.create_study(spec)
        service.import_trials(
            "br",
            [ImportedTrial({"mode": "b"}, metrics={"tps": 1.0}),
             ImportedTrial({"mode": "[a]"}, metrics={"tps": 2.0}),
             ImportedTrial({"mode": "b"}, TrialStatus.FAILED, reason="[/tmp] gone")],
        )  # fmt: skip
    assert main(["show", "br", "--db", str(path), "--all"]) == 0
    rows = [[c.strip() for c in line.split("│")[1:-1]]
            for line in capsys.readouterr().out.splitlines() if line.startswith("│")]  # fmt: skip
    assert [r[-2] for r in rows] == ["b", "[a]", "b"] and rows[2][-1] == "[/tmp] gone"
    assert main(["show", "br", "--db", str(path)]) == 0
    assert "mode=[a]" in capsys.readouterr().out
    assert main(["best", "br", "--db", str(path)]) == 0
    cells = [[c.strip() for c in line.split("│")[1:-1]]
             for line in capsys.readouterr().out.splitlines() if line.startswith("│")]  # fmt: skip
    assert ["mode", "b", "[a]", ""] in cells
