"""``bench.generators``: ours' logged steps, one line of letters per run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.generators import LETTERS, letters, main
from bench.peers import RUNNERS
from bench.suite import RUNS_LOG, run_from_json, run_to_json
from tests.bench.test_peers import MIXED, MODEL_BUDGET
from tuner.trial import StepKind


def test_every_step_kind_has_its_own_letter() -> None:
    assert set(LETTERS) == set(StepKind)
    assert len(set(LETTERS.values())) == len(LETTERS)
    assert letters(["sobol", "global", "no-such-step"]) == "SG?"


def test_the_log_of_ours_prints_its_steps_by_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = RUNNERS["ours"].run(MIXED, 0, MODEL_BUDGET)
    runs = [replace(run, seed=1, generators=run.generators[::-1]), run]  # logged out of order
    peer = RUNNERS["random"].run(MIXED, 0, MODEL_BUDGET)
    (tmp_path / RUNS_LOG).write_text("".join(run_to_json(r) + "\n" for r in [*runs, peer]))
    assert run_from_json(run_to_json(run)).generators == run.generators
    assert len(run.generators) == MODEL_BUDGET
    assert run.generators[0] == StepKind.SOBOL.value  # a study starts with its design
    assert any(StepKind(g).model_based for g in run.generators)
    assert main([str(tmp_path), "--problem", MIXED.name, "--seeds", "0,1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("D default, S sobol")
    assert out[1:] == [
        f"ours {MIXED.name} seed {r.seed}  {letters(r.generators)}" for r in reversed(runs)
    ]


def test_a_run_logged_without_steps_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    peer = RUNNERS["random"].run(MIXED, 0, 3)
    (tmp_path / RUNS_LOG).write_text(run_to_json(peer) + "\n")
    assert main([str(tmp_path), "--method", "random", "--problem", MIXED.name]) == 0
    assert "(not logged: an older run)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--problem", "no:such"])
