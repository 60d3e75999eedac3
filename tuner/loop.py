"""How a suggestion is made from a study's trials, and the trial it becomes.

The service (``server.service.TuningService``) and the in-memory store of the runner
(``runner.memory.MemoryAPI``, under the one trial loop ``runner.loop``) go through the same
two functions, so a study run in memory stores what the service stores:

* ``propose`` is how a suggestion is made from a study's trials: relative outcome
  constraints take their bounds from the measured default (``with_resolved_constraints``),
  the designer sees the finished trials and the pending ones;
* ``new_trial`` is the trial a suggestion becomes: its step kind, its label, its warning and
  its point in the embedding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus, with_resolved_constraints

if TYPE_CHECKING:  # the designer (torch) is imported when a suggestion is made
    from tuner.designer import FitCache, Suggestion
    from tuner.transfer import SourceStudy


def propose(
    spec: StudySpec,
    trials: Sequence[Trial],
    count: int,
    cache: FitCache | None = None,
    salt: int = 0,
    sources: Sequence[SourceStudy] = (),
) -> list[Suggestion]:
    """``count`` new suggestions for a study with these trials (fewer when the space runs out).

    ``salt``: 0, or a number for draws unlike those another call with these trials made
    (``tuner.designer.base.History.salt``). ``sources``: the study's transfer sources, read
    (``tuner.transfer.read_sources``).

    Raises:
        StateError: Nothing can be suggested: the search space is exhausted.
    """
    completed = [t for t in trials if t.status.is_final]
    pending = [t for t in trials if not t.status.is_final]
    from tuner.designer import make_designer

    designer = make_designer(with_resolved_constraints(spec, completed), cache, sources)
    return designer.suggest(count, completed, pending, salt)


def new_trial(
    trial_id: int, suggestion: Suggestion, client_id: str = "", warning: str = ""
) -> Trial:
    """The ACTIVE trial a suggestion becomes (``warning``: the caller's, after the
    suggestion's own)."""
    return Trial(
        id=trial_id,
        config=suggestion.config,
        status=TrialStatus.ACTIVE,
        client_id=client_id,
        source=suggestion.step.value,
        warning="; ".join(w for w in (suggestion.warning, warning) if w),
        embedded=suggestion.embedded,
        step=suggestion.step,
        transfer=suggestion.transfer,
    )
