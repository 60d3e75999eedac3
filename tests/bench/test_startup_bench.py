"""bench.startup: ours and Optuna's commands run as fresh processes, each timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import startup


def test_a_tiny_run_times_both_clis_on_each_command(tmp_path: Path) -> None:
    code = startup.main(
        ["--rounds", "1", "--commands", "help,show,tell --db", "--out", str(tmp_path)]
    )
    assert code == 0
    rows = json.loads((tmp_path / "startup.json").read_text())["rows"]
    seen = {(r["command"], r["side"]): r["seconds"] for r in rows}
    assert set(seen) == {("help", "ours"), ("help", "optuna"), ("show", "ours"),
                         ("show", "optuna"), ("tell --db", "ours")}  # fmt: skip
    assert all(len(v) == 1 and v[0] > 0 for v in seen.values())
    assert (tmp_path / "startup.png").stat().st_size > 0


def test_an_unknown_command_is_refused_naming_the_choices() -> None:
    with pytest.raises(SystemExit):
        startup._parser().parse_args(["--commands", "help,plot"])
