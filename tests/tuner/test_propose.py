"""``tuner.loop``: how a suggestion is made from a study's trials, and the trial it becomes."""

from __future__ import annotations

from tuner.loop import new_trial, propose
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, TrialStatus, with_resolved_constraints

SPEC = StudySpec.from_dict(
    {
        "name": "propose",
        "knobs": [{"name": "a", "kind": "int", "low": 0, "high": 20, "default": 10}],
        "objectives": [{"name": "tps", "goal": "maximize"}],
        "outcome_constraints": ["p95 <= 0.9 * default"],
        "designer": {"initial_trials": 3, "seed": 5},
    }
)


def test_the_first_suggestion_becomes_an_active_default_trial() -> None:
    trial = new_trial(1, propose(SPEC, [], 1)[0], client_id="w")
    assert (trial.id, trial.status, trial.client_id) == (1, TrialStatus.ACTIVE, "w")
    assert trial.step is StepKind.DEFAULT and trial.source == StepKind.DEFAULT.value
    assert trial.config == {"a": 10}


def test_relative_constraints_resolve_against_the_measured_default() -> None:
    """``p95 <= 0.9 * default``: the default measured p95 = 20, so the model must see the
    bound 18 (propose resolves it, as the service does)."""
    default = new_trial(1, propose(SPEC, [], 1)[0])
    done = Trial(1, default.config, TrialStatus.COMPLETED, {"tps": 130.0, "p95": 20.0},
                 step=StepKind.DEFAULT)  # fmt: skip
    resolved = with_resolved_constraints(SPEC, [done])
    assert [str(c) for c in resolved.outcome_constraints] == ["p95 <= 18"]
    [later] = propose(SPEC, [done], 1)
    assert later.step is StepKind.SOBOL
