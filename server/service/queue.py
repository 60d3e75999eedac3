"""SuggestTrials calls waiting for a study's designer run (``server.service.suggestions``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from server.storage import Request
from tuner.trial import Trial


@dataclass
class Ask:
    """A SuggestTrials call waiting for new suggestions (``TuningService._new_trials``)."""

    need: int
    client_id: str
    request: Request | None
    mine: list[int]  # the ids of the trials the call already holds
    leads: bool = False  # this call's thread runs the designer for its batch
    done: bool = False
    trials: list[Trial] = field(default_factory=list)  # the new ones
    error: Exception | None = None
    # another server answered the same request first (a shared database): its whole
    # answer, which replaces this call's
    replayed: list[Trial] | None = None


@dataclass
class Queue:
    """A study's calls waiting for its next designer run."""

    waiting: list[Ask] = field(default_factory=list)
    running: bool = False


def answer_of(ask: Ask) -> list[Trial]:
    if ask.error is not None:
        raise ask.error
    return ask.trials
