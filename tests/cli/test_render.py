"""What ``tuner tune`` prints at the end of a session (``cli.render.print_result``)."""

from __future__ import annotations

import pytest

from cli import render
from runner.session import SessionResult, summarize
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, TrialStatus

SPEC = StudySpec.from_dict(
    {
        "name": "s",
        "knobs": [{"name": "x", "kind": "float", "low": 0.0, "high": 1.0}],
        "objectives": [{"name": "tps", "goal": "maximize"}],
        "outcome_constraints": ["p95_ms <= 20"],
    }
)


def test_no_feasible_configuration_names_the_constraints_it_was_judged_by(
    capsys: pytest.CaptureFixture[str],
) -> None:
    slow = Trial(1, {"x": 0.5}, TrialStatus.COMPLETED, metrics={"tps": 10.0, "p95_ms": 31.0})
    render.print_result(SessionResult(SPEC, [slow], default=slow, best=None, ratio=None))
    text = " ".join(capsys.readouterr().out.split())
    assert "no feasible configuration found under p95_ms <= 20" in text


def test_a_best_that_is_worse_than_the_default_is_not_called_an_improvement(
    capsys: pytest.CaptureFixture[str],
) -> None:
    default = Trial(1, {"x": 0.5}, TrialStatus.COMPLETED, metrics={"tps": 100.0, "p95_ms": 5.0},
                    step=StepKind.DEFAULT)  # fmt: skip
    other = Trial(2, {"x": 0.9}, TrialStatus.COMPLETED, metrics={"tps": 87.0, "p95_ms": 5.0})
    result = SessionResult(SPEC, [default, other], default=default, best=other, ratio=0.87)
    render.print_result(result)
    text = " ".join(capsys.readouterr().out.split())
    assert "no trial beat the default (tps by trial means); the best of the others is 0.87x" in text
    assert "best other trial: trial 2" in text and "keep the default configuration" in text
    assert "improvement" not in text


def test_a_session_where_only_the_default_is_feasible_says_to_keep_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = StudySpec.from_dict(
        {
            "name": "s",
            "knobs": [{"name": "x", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5}],
            "objectives": [{"name": "tps", "goal": "maximize"}],
            "outcome_constraints": ["tps >= 0.99 * default"],
        }
    )
    default = Trial(1, {"x": 0.5}, TrialStatus.COMPLETED, metrics={"tps": 10963.622417768},
                    step=StepKind.DEFAULT)  # fmt: skip
    slower = Trial(2, {"x": 0.1}, TrialStatus.COMPLETED, metrics={"tps": 9000.0})
    result = summarize(spec, [default, slower])
    assert result.best is None and result.default is default
    render.print_result(result)
    text = " ".join(capsys.readouterr().out.split())
    # the bound as resolved against the default's 10963.6, to 6 digits
    assert "only the default is feasible under tps >= 10854: no other trial met it" in text
    assert "keep the default configuration" in text
    assert "no feasible configuration found" not in text
