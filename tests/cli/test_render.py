"""What ``tuner tune`` prints at the end of a session: ``cli.render.print_result`` (what the
session measured), then ``cli.verdict.print_verdict`` (the study's answer, last)."""

from __future__ import annotations

import pytest

from cli import render, verdict
from runner.session import SessionResult, summarize
from tuner.confirmation import best_of
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


def session_end(result: SessionResult, confirming: bool = False) -> None:
    render.print_result(result, confirming)
    best = best_of(result.spec, result.trials, result.measurements)
    verdict.print_verdict(result.spec, best, result.trials)


def test_no_feasible_configuration_names_the_constraints_it_was_judged_by(
    capsys: pytest.CaptureFixture[str],
) -> None:
    slow = Trial(1, {"x": 0.5}, TrialStatus.COMPLETED, metrics={"tps": 10.0, "p95_ms": 31.0})
    session_end(SessionResult(SPEC, [slow], default=slow, best=None, ratio=None))
    text = " ".join(capsys.readouterr().out.split())
    assert text.endswith("no feasible configuration found under p95_ms <= 20"), text


def test_a_best_that_is_worse_than_the_default_is_not_called_an_improvement(
    capsys: pytest.CaptureFixture[str],
) -> None:
    default = Trial(1, {"x": 0.5}, TrialStatus.COMPLETED, metrics={"tps": 100.0, "p95_ms": 5.0},
                    step=StepKind.DEFAULT)  # fmt: skip
    other = Trial(2, {"x": 0.9}, TrialStatus.COMPLETED, metrics={"tps": 87.0, "p95_ms": 5.0})
    result = SessionResult(SPEC, [default, other], default=default, best=other, ratio=0.87)
    session_end(result, confirming=True)
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "no trial beat the default (tps by single samples); the best of the others, trial 2, "
        "is 0.87x the default" in text
    )
    assert "improvement" not in text
    # the answer comes last: keep the default, which changes nothing
    assert text.endswith("is the best by measured value, the model's outliers set aside "
                         "under p95_ms <= 20 "
                         "(unconfirmed: the study has no confirmation rounds) the default "
                         "configuration"), text  # fmt: skip
    assert text.count("keep the default") == 1


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
    session_end(result)
    text = " ".join(capsys.readouterr().out.split())
    # the bound as resolved against the default's 10963.6, to 6 digits
    assert "only the default is feasible under tps >= 10854: no other trial met it" in text
    assert text.endswith("keep the default: no other trial met tps >= 10854 the default "
                         "configuration"), text  # fmt: skip
    assert "no feasible configuration found" not in text


def test_the_best_of_a_study_without_noise_is_its_best_measurement(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A replayed table: the repeated measurements agree exactly, so the best is the best
    measured value, said so, whatever a model would smooth it to."""
    from tuner.trial import Measurement, MeasurementKind

    default = Trial(1, {"x": 0.5}, TrialStatus.COMPLETED, metrics={"tps": 100.0, "p95_ms": 5.0},
                    step=StepKind.DEFAULT)  # fmt: skip
    others = [Trial(i, {"x": x}, TrialStatus.COMPLETED, {"tps": v, "p95_ms": 5.0})
              for i, x, v in ((2, 0.1, 101.0), (3, 0.2, 99.0), (4, 0.3, 100.0), (5, 0.45, 140.0),
                              (6, 0.55, 98.0), (7, 0.9, 100.0))]  # fmt: skip
    # the default measured three times (its trial and two controls), the same each time
    controls = [Measurement({"tps": 100.0, "p95_ms": 5.0}, MeasurementKind.CONTROL, at, 0, 1)
                for at in (1.0, 2.0, 3.0)]  # fmt: skip
    trials = [default, *others]
    best = best_of(SPEC, trials, controls)
    assert best.trial is others[3] and best.basis.value == "measured values"
    verdict.print_verdict(SPEC, best, trials)
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("best measured value under p95_ms <= 20: trial 5, tps 140 (single "
                           "sample), 1.40x the default (single samples); the study's repeated "
                           "measurements agree exactly"), text  # fmt: skip
