"""One trial loop: suggest, measure, complete — storing what the service stores.

The service (``server.service.TuningService``) and everything that drives a designer without
the service (the benchmarks, the tests) go through the same two functions:

* ``propose`` is how a suggestion is made from a study's trials: relative outcome
  constraints take their bounds from the measured default (``with_resolved_constraints``),
  the designer sees the finished trials and the pending ones;
* ``new_trial`` is the trial a suggestion becomes: its step kind, its label, its warning and
  its point in the embedding.

``run_trials`` is the loop itself, in memory: ``budget`` trials, ``batch`` suggested at a
time (the earlier ones of a batch pending while the later ones are measured, as parallel
workers see them), each measured and completed with its status, metrics and reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus, with_resolved_constraints

if TYPE_CHECKING:  # the designer (torch) is imported when a suggestion is made
    from tuner.designer import FitCache, Suggestion


class Outcome(Protocol):
    """What measuring a configuration gave (``targets.base.TrialOutcome`` is one)."""

    @property
    def status(self) -> TrialStatus: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...

    @property
    def reason(self) -> str: ...


def propose(
    spec: StudySpec,
    trials: Sequence[Trial],
    count: int,
    cache: FitCache | None = None,
    salt: int = 0,
) -> list[Suggestion]:
    """``count`` new suggestions for a study with these trials (fewer when the space runs out).

    ``salt``: 0, or a number for draws unlike those another call with these trials made
    (``tuner.designer.base.History.salt``).

    Raises:
        StateError: Nothing can be suggested: the search space is exhausted.
    """
    completed = [t for t in trials if t.status.is_final]
    pending = [t for t in trials if not t.status.is_final]
    from tuner.designer import make_designer

    designer = make_designer(with_resolved_constraints(spec, completed), cache)
    return designer.suggest(count, completed, pending, salt)


def new_trial(trial_id: int, suggestion: Suggestion, client_id: str = "") -> Trial:
    """The ACTIVE trial a suggestion becomes."""
    return Trial(
        id=trial_id,
        config=suggestion.config,
        status=TrialStatus.ACTIVE,
        client_id=client_id,
        source=suggestion.step.value,
        warning=suggestion.warning,
        embedded=suggestion.embedded,
        step=suggestion.step,
    )


def run_trials(
    spec: StudySpec,
    measure: Callable[[Config], Outcome],
    budget: int,
    *,
    batch: int = 1,
    cache: FitCache | None = None,
    trials: Sequence[Trial] = (),
    on_trial: Callable[[Trial], None] | None = None,
) -> list[Trial]:
    """Run the study until it has ``budget`` trials; returns all of them, in id order.

    Args:
        measure: Measures one configuration.
        batch: Suggestions asked for at a time (parallel workers).
        cache: Warm starts of the model fits, as the service keeps one (default: a new one
            for this run).
        trials: Trials the study already has (a warm start, or a resumed run).
        on_trial: Called with each finished trial (progress).
    """
    if batch < 1:
        raise ValueError(f"batch: got {batch!r}; allowed: an integer >= 1")
    out = list(trials)
    if cache is None:
        from tuner.designer import FitCache

        cache = FitCache()
    while len(out) < budget:
        suggestions = propose(spec, out, min(batch, budget - len(out)), cache)
        first = len(out)
        out += [new_trial(first + i + 1, s) for i, s in enumerate(suggestions)]
        for index in range(first, len(out)):
            outcome = measure(out[index].config)
            out[index] = replace(
                out[index],
                status=outcome.status,
                metrics=dict(outcome.metrics),
                reason=outcome.reason,
            )
            if on_trial is not None:
                on_trial(out[index])
    return out
