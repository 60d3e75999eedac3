"""A study's best for every reader, with the model's ranking kept for readers without it.

``tuner.confirmation.best_of`` decides the best from the stored trials and measurements:
the confirmation's verdict when the study has one (plain Python, any install); else the
best measured value among the trials the objective GP does not call outliers, which
needs torch. What needs the model is computed where
the model is, once, and stored: ``study_best`` ranks with it when this process has it,
and appends a ``ranked_best`` event (``RANKED``) to the trial it chose, with a digest of
the evidence the ranking saw (every trial's id, status, update time and repeat count, and
every measurement). Only a writer ranks: the session at its end, the server (on
``GetBestTrial`` and ``GetStudy``, once per set of results). A reader (the commands
that open a file read-only, in either install) fits no model, so that it starts fast and
needs no torch: it takes the stored answer as long as the evidence is unchanged, and only
when there is none ranks by the trial means, and says so (``Basis.TRIAL_MEANS``).

The answer is kept as a trial event rather than in a table of its own: the events are the
append-only record of what happened to a trial, every backend has them, and a database
written by an older tuner needs no schema upgrade before a read-only command reads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence

from server.storage import Storage
from tuner.confirmation import Basis, Best, best_of, model_ranking
from tuner.errors import TunerError
from tuner.study import StudySpec
from tuner.trial import Measurement, Trial

log = logging.getLogger(__name__)

#: The trial event that records the model's choice of the best (``study_best``).
RANKED = "ranked_best"


def study_best(
    storage: Storage,
    spec: StudySpec,
    trials: Sequence[Trial],
    measurements: Sequence[Measurement],
) -> Best:
    """``best_of`` the study, ranking by the model stored for this evidence, else
    by the model where this process has it (and storing its choice where it may write)."""
    evidence = digest(trials, measurements)
    by_id = {t.id: t for t in trials}

    def rank(
        resolved: StudySpec, all_trials: Sequence[Trial], among: Sequence[Trial]
    ) -> list[Trial] | None:
        stored = _stored(storage, spec.name, evidence)
        if stored is not None and any(t.id == stored for t in among):
            return [by_id[stored], *(t for t in among if t.id != stored)]
        if getattr(storage, "read_only", False):
            return None  # a reader: it fits no model (module doc)
        ranking = model_ranking(resolved, all_trials, among)
        if ranking:
            _store(storage, spec.name, ranking[0].id, evidence)
        return ranking

    return best_of(spec, trials, measurements, rank)


def digest(trials: Sequence[Trial], measurements: Sequence[Measurement]) -> str:
    """What a ranking depends on, as 16 hex digits: a changed, added or finished trial or
    a new measurement changes it."""
    data = [
        [[t.id, t.status.value, t.updated_at, t.repeats] for t in trials],
        [[m.trial_id, m.kind.value, m.round, m.at] for m in measurements],
    ]
    text = json.dumps(data, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _stored(storage: Storage, study: str, evidence: str) -> int | None:
    """The trial the model chose for exactly this evidence, if one was stored."""
    event = storage.last_event(study, RANKED)
    if event is None:
        return None
    try:
        detail = json.loads(event.detail)
    except ValueError:
        return None
    return (
        event.trial_id if isinstance(detail, dict) and detail.get("evidence") == evidence else None
    )


def _store(storage: Storage, study: str, trial_id: int, evidence: str) -> None:
    detail = json.dumps({"basis": Basis.SCREENED.value, "evidence": evidence})
    try:
        storage.add_trial_event(study, trial_id, RANKED, detail)
    except TunerError as exc:  # a full disk or a read-only file: the answer still stands
        log.warning("study %s: could not store the model's choice of the best (%s)", study, exc)
