"""``python -m bench.suite`` end to end on a tiny run (no timing asserted).

Runs the ``random`` runner of ``bench/peers/`` where it exists, else ``ours``, with budget 3
and one seed on two small develop problems, then checks the runs log, resume, ``--redo``,
``--logged-only`` and the results files. Skipped when ``../shared/benchdata`` is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import suite, suite_problems
from bench.common import data_absent
from bench.contract import Measurement, MethodRun

PROBLEMS = "hdbo:hartmann6-d20,cloud:spark_lr_huge:cost_usd"
pytestmark = pytest.mark.skipif(
    not suite_problems.DATA.is_dir(), reason=data_absent(suite_problems.DATA)
)


def _method() -> str:
    return "random" if "random" in suite.runners() else "ours"


def _main(out: Path, *extra: str) -> int:
    argv = ["--half", "develop", "--budget", "3", "--seeds", "1", "--problems", PROBLEMS]
    return suite.main([*argv, "--methods", _method(), "--out", str(out), *extra])


def _log(out: Path, name: str = suite.RUNS_LOG) -> list[dict]:
    return [json.loads(line) for line in (out / name).read_text().splitlines()]


def test_a_tiny_run_logs_every_run_and_writes_the_tables(tmp_path: Path) -> None:
    assert _main(tmp_path) == 0
    logged = _log(tmp_path)
    assert {(r["problem"], r["seed"], r["method"]) for r in logged} == {
        ("hdbo:hartmann6-d20", 0, _method()),
        ("cloud:spark_lr_huge:cost_usd", 0, _method()),
    }
    assert all(len(r["configs"]) == len(r["reported"]) == 3 for r in logged)
    scored = _log(tmp_path, suite.CURVES_LOG)
    assert [(r["problem"], r["seed"], r["method"]) for r in scored] == [
        (r["problem"], r["seed"], r["method"]) for r in logged
    ]
    assert all(len(r["curve"]) == 3 for r in scored)
    data = json.loads((tmp_path / "suite.json").read_text())
    assert data["meta"]["half"] == "develop" and not data["meta"]["failed"]
    summary = data["summary"]["cloud:spark_lr_huge:cost_usd"]
    assert summary["checkpoints"] == [3] and summary["optimum"] > 0
    assert (tmp_path / "suite.png").stat().st_size > 0

    assert _main(tmp_path, "--resume") == 0  # nothing left to run
    assert len(_log(tmp_path)) == 2
    assert _main(tmp_path, "--logged-only") == 0
    assert _main(tmp_path, "--resume", "--redo", _method()) == 0  # dropped, then run again
    assert len(_log(tmp_path)) == len(_log(tmp_path, suite.CURVES_LOG)) == 2

    # a runs log without its curves (written before the curves log existed) is scored once
    (tmp_path / suite.CURVES_LOG).unlink()
    assert _main(tmp_path, "--logged-only") == 0
    assert len(_log(tmp_path, suite.CURVES_LOG)) == 2
    rescored = json.loads((tmp_path / "suite.json").read_text())["summary"]
    rescored = rescored["cloud:spark_lr_huge:cost_usd"]
    assert rescored["worst"] == summary["worst"]  # the same seeded runs, scored again
    assert rescored["methods"][_method()]["at"] == summary["methods"][_method()]["at"]
    assert _main(tmp_path, "--logged-only") == 0
    assert len(_log(tmp_path, suite.CURVES_LOG)) == 2


def test_logged_runs_keep_the_current_budget_and_the_last_entry(tmp_path: Path) -> None:
    def run(seed: int, n: int, seconds: float) -> MethodRun:
        configs = [{"x": 0.5}] * n
        return MethodRun(
            "random",
            "hdbo:toy",
            seed,
            configs,
            [Measurement("infeasible")] * n,
            [None] * n,
            seconds,
        )

    log = tmp_path / suite.RUNS_LOG
    lines = [run(0, 3, 1.0), run(0, 3, 2.0), run(1, 5, 1.0)]
    log.write_text("".join(suite.run_to_json(r) + "\n" for r in lines))
    done = suite.logged_runs(log, {"hdbo:toy": 3})
    assert (
        list(done) == [("hdbo:toy", 0, "random")] and done[("hdbo:toy", 0, "random")].seconds == 2
    )
    assert done[("hdbo:toy", 0, "random")].measurements[0] == Measurement("infeasible")
    assert suite.drop_logged(log, ["random"], ["hdbo:other"]) == 0
    assert suite.drop_logged(log, ["random"], ["hdbo:toy"]) == 3 and log.read_text() == ""


def test_unknown_methods_and_empty_filters_stop_with_a_message(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown method 'nope'"):
        suite.main(["--half", "develop", "--methods", "nope", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="matches no develop problem"):
        suite.main(["--half", "develop", "--problems", "db:tpcc-20", "--out", str(tmp_path)])


def test_also_takes_the_runs_logged_in_another_folder(tmp_path: Path) -> None:
    here, beside = tmp_path / "here", tmp_path / "beside"
    assert _main(here) == 0  # seed 0
    assert _main(beside, "--first-seed", "1") == 0  # seed 1, by "another process"
    assert _main(here, "--seeds", "2", "--logged-only", "--also", str(beside)) == 0
    data = json.loads((here / "suite.json").read_text())
    assert data["summary"]["hdbo:hartmann6-d20"]["methods"][_method()]["seeds"] == [0, 1]
    assert len(_log(here, suite.CURVES_LOG)) == 2  # nothing was copied or run
    with pytest.raises(SystemExit, match=r"--also .*no suite-curves\.jsonl"):
        _main(here, "--logged-only", "--also", str(tmp_path / "nowhere"))


def test_missing_lists_the_runs_not_logged_without_running_or_scoring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main(tmp_path) == 0  # seed 0 of both problems
    (tmp_path / "suite.json").unlink()
    capsys.readouterr()
    assert _main(tmp_path, "--seeds", "2", "--missing", "--markdown") == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[1:] == [
        f"| {_method()} | cloud:spark_lr_huge:cost_usd | 1 |",
        f"| {_method()} | hdbo:hartmann6-d20 | 1 |",
    ]
    assert len(_log(tmp_path)) == 2  # nothing ran
    assert not (tmp_path / "suite.json").exists()  # nothing was scored into tables
