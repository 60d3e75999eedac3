"""``bench.pairs``: one method's suite runs before and after a change, seed by seed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.pairs import better, compare, main, read_side, sign_test
from bench.suite import CURVES_LOG, scored_to_json
from bench.suite_score import ScoredRun

PROBLEM = "hdbo:branin-d100"  # synthetic: builds without ../shared


def _log(folder: Path, runs: list[ScoredRun]) -> Path:
    folder.mkdir()
    (folder / CURVES_LOG).write_text("".join(scored_to_json(r) + "\n" for r in runs))
    return folder


def _run(seed: int, last: float, method: str = "ours", length: int = 100) -> ScoredRun:
    """A best-so-far curve of a minimization falling from 10 to ``last``."""
    curve: list[float | None] = [None] + [
        10 - (10 - last) * i / (length - 1) for i in range(1, length)
    ]
    return ScoredRun(method=method, problem=PROBLEM, seed=seed, curve=curve, seconds=1.0)


def test_the_sign_test_is_the_exact_binomial_tail() -> None:
    assert sign_test(0, 0) == 1.0
    assert sign_test(5, 5) == 1.0
    assert sign_test(10, 0) == sign_test(0, 10) == pytest.approx(2 / 1024)
    tail = sum(math.comb(23, i) for i in range(7)) / 2**23
    assert sign_test(17, 6) == pytest.approx(2 * tail)
    assert 0.03 < sign_test(17, 6) < 0.04


def test_none_is_worse_than_any_value_and_ties_count_for_neither() -> None:
    assert better(1.0, None, -1.0) and not better(None, 1.0, -1.0)
    assert not better(None, None, 1.0)
    assert better(1.0, 2.0, -1.0) and better(2.0, 1.0, 1.0)
    assert not better(1.0, 1.0, 1.0)


def test_pairs_are_the_seeds_both_sides_ran_and_the_first_folder_wins(tmp_path: Path) -> None:
    first = _log(tmp_path / "a", [_run(0, 3.0), _run(1, 3.0)])
    second = _log(tmp_path / "b", [_run(0, 9.0), _run(2, 1.0), _run(0, 0.5, "random")])
    before = read_side([first, second], "ours")
    assert set(before) == {(PROBLEM, 0), (PROBLEM, 1), (PROBLEM, 2)}
    assert before[(PROBLEM, 0)][-1] == 3.0
    after = read_side(
        [_log(tmp_path / "c", [_run(0, 2.0), _run(1, 4.0), _run(1, 9.0, "x")])], "ours"
    )
    cell = compare(before, after, PROBLEM, range(3), 100, -1.0)
    assert (cell.better, cell.worse, cell.pairs) == (1, 1, 2)
    assert cell.before == pytest.approx(3.0) and cell.after == pytest.approx(3.0)
    short = read_side([_log(tmp_path / "d", [_run(0, 2.0, length=50)])], "ours")
    assert compare(before, short, PROBLEM, range(3), 100, -1.0).pairs == 0
    with pytest.raises(SystemExit, match=r"no suite-curves\.jsonl"):
        read_side([tmp_path / "nowhere"], "ours")


def test_the_command_prints_the_problem_and_the_totals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _log(tmp_path / "before", [_run(s, 3.0) for s in range(3)])
    after = _log(
        tmp_path / "after", [_run(0, 2.0, "new"), _run(1, 2.5, "new"), _run(2, 4.0, "new")]
    )
    argv = [str(before), str(after), "--problems", PROBLEM, "--after-method", "new", "--markdown"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(f"| {PROBLEM}"))
    assert "3 -> 2.833 (2-1)" in row
    total = next(line for line in out.splitlines() if line.startswith("| @100"))
    assert [c.strip() for c in total.strip("|").split("|")] == ["@100", "2", "1", "0", "1.000"]
    with pytest.raises(SystemExit):
        main([str(before), str(after), "--problems", "hdbo:hartmann6-d20"])
