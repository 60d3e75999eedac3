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
    assert all(len(r["cpu_seconds"]) == 1 and r["cpu_seconds"][0] > 0 for r in rows)
    assert (tmp_path / "startup.png").stat().st_size > 0


def test_an_unknown_command_is_refused_naming_the_choices() -> None:
    with pytest.raises(SystemExit):
        startup._parser().parse_args(["--commands", "help,plot"])


def test_the_median_interval_is_the_order_statistics_of_the_binomial() -> None:
    values = [float(v) for v in range(1, 16)]  # n = 15: the 4th and 12th values at 95 %
    assert startup.median_interval(values) == (4.0, 12.0)
    assert startup.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few: the range


def test_reading_a_given_database_times_the_reading_commands_on_it(tmp_path: Path) -> None:
    seed = tmp_path / "seed.csv"
    seed.write_text("x,y\n0.1,1\n0.5,3\n0.9,2\n", encoding="utf-8")
    study = tmp_path / "s.toml"
    study.write_text(startup.STUDY.replace('name = "s"', 'name = "theirs"', 1), encoding="utf-8")
    db = tmp_path / "given.db"
    startup.timed([str(startup.BIN / "tuner"), "create", str(study), "--db", str(db)])
    startup.timed([str(startup.BIN / "tuner"), "import", "theirs", "--csv", str(seed),
                   "--db", str(db)])  # fmt: skip
    out = tmp_path / "out"
    argv = ["--rounds", "1", "--db", str(db), "--study", "theirs", "--out", str(out)]
    assert startup.main([*argv, "--commands", "studies,best"]) == 0
    data = json.loads((out / "startup.json").read_text())
    assert {(r["command"], r["side"]) for r in data["rows"]} == {
        ("studies", "ours"), ("studies", "optuna"), ("best", "ours"), ("best", "optuna")
    }  # fmt: skip
    assert len(data["meta"]["load_average_end"]) == 3
    with pytest.raises(SystemExit):  # a given database is only read
        startup.main([*argv, "--commands", "ask --db"])
