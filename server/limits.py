"""How big a study may grow, and what one request may add to it: the bounds that keep
every reply under the size a gRPC client accepts and every study loadable.

Each field has its own bound (``server.service``'s ``MAX_*``, the domain's), but a study's
total had none: two imports with a 2.5 MB source, or two studies of 10,000 choices x 250
characters, made ``tuner studies --server`` fail for everyone ("Received message larger
than max"). Listings now page (``server.paging``); this module bounds the rest:

* **A spec**: at most ``MAX_SPEC_CHARS`` (1 MiB) of JSON as stored. Its wire form is at
  most twice that (a number takes 9 bytes on the wire and may take 3 characters in JSON;
  text is never longer on the wire than escaped in JSON), so a study always fits in one
  reply, and so does a trial (one value of each knob of the spec, plus bounded fields).
* **A study in all**: ``MAX_STUDY_CHARS`` (64 Mi characters, as ``Storage.stored_size``
  counts them: about bytes, since stored text is JSON and short fields). Why 64 Mi: the
  service reads the whole study for every suggestion and every GetStudy, and a study of
  10,000 trials x 100 knobs (19 M characters) took 8 s and 416 MB of memory to read on the
  2-CPU test machine under load, so 64 Mi is about half a minute and 1.4 GB: the most one
  study should cost a server, and over three times the largest study a GP designer can use.
  Each unfinished trial keeps ``RESULT_RESERVE`` characters for its result, so that
  CompleteTrial, which is not checked while its result is that small (a measured result is
  not refused, and reading the study's size on every result would cost every worker), still
  cannot take a study past the limit.
* **A SuggestTrials reply**: ``count`` trials of the largest size the spec allows must fit
  in ``REPLY_BYTES``; the error says how many do.

A request that would pass a bound is ``ValidationError`` (INVALID_ARGUMENT) naming the field
and the limit, not ``OverloadedError`` (RESOURCE_EXHAUSTED): the errors table
(``server.errors``) keeps RESOURCE_EXHAUSTED for a server too busy *now*, which the client
retries after a delay, and a full study does not empty with time. The sizes of what a request
adds are estimates made before it is stored, in the units ``stored_size`` counts.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from server.storage import ROW_CHARS, FinishedTrial, Storage, storable_tree
from tuner.errors import ValidationError
from tuner.space import BoolKnob, FloatKnob, IntKnob, Knob
from tuner.study import StudySpec
from tuner.trial import Measurement

#: JSON characters of a spec as stored.
MAX_SPEC_CHARS = 2**20
#: Characters a study may hold in all (``Storage.stored_size``).
MAX_STUDY_CHARS = 64 * 2**20
#: Characters an unfinished trial keeps for its result: a CompleteTrial adding more is
#: checked against the study's room (reasons, metrics and a few repeats stay under it).
RESULT_RESERVE = 4096
#: Bytes a reply may take: the 4 MiB every gRPC client accepts by default.
REPLY_BYTES = 4 * 2**20
# A new trial's own fields in a reply (id, study, status, times, step, source, warning) and
# in storage (its row, its event): a generous allowance; the values are counted apart.
_TRIAL_BYTES = 1024
_TRIAL_CHARS = 256


def check_spec(spec: StudySpec) -> None:
    """Refuse a spec with text no backend can store, or larger than ``MAX_SPEC_CHARS``.

    Raises:
        ValidationError: naming the field (``spec.knobs[2].choices[1]``) or ``spec``.
    """
    data = spec.to_dict()
    storable_tree(data, "spec")  # a knob's choice, unit, description...
    chars = len(json.dumps(data, allow_nan=False))  # as storage writes it
    if chars > MAX_SPEC_CHARS:
        raise ValidationError(
            "spec",
            f"takes {chars:,} characters as stored (JSON), more than a spec may",
            f"at most {MAX_SPEC_CHARS:,}: fewer or shorter knobs, choices or candidates",
        )


def check_suggestion(spec: StudySpec, count: int, client_id: str) -> None:
    """Refuse a SuggestTrials ``count`` whose trials, at their largest, would not fit in
    one reply (``REPLY_BYTES``); the error says how many do."""
    each = _sizes(spec).config_bytes + len(spec.name) + len(client_id.encode()) + _TRIAL_BYTES
    if count * each > REPLY_BYTES:
        raise ValidationError(
            "count",
            f"{count} trials of study {spec.name!r} may take {count * each:,} bytes, more "
            f"than a reply carries ({REPLY_BYTES:,})",
            f"at most {max(1, REPLY_BYTES // each)} trials per call for this study",
        )


def check_new_trials(storage: Storage, spec: StudySpec, count: int, client_id: str) -> None:
    """Refuse ``count`` new trials that would take the study past ``MAX_STUDY_CHARS``
    (each with its configuration at its largest and its result's reserve)."""
    each = _sizes(spec).config_chars + 2 * len(client_id) + _TRIAL_CHARS + RESULT_RESERVE
    check_room(storage, spec.name, "count", count * each, many(count, "new trial"))


def check_imports(storage: Storage, study: str, trials: Sequence[FinishedTrial]) -> None:
    """Refuse imported trials that would take the study past ``MAX_STUDY_CHARS``."""
    adding = 0
    for trial in trials:
        adding += sum(
            len(name) + len(json.dumps(v)) + ROW_CHARS for name, v in trial.config.items()
        )
        adding += sum(len(name) + ROW_CHARS for name in trial.metrics)
        adding += 2 * (len(trial.source) + len(trial.reason)) + _TRIAL_CHARS  # row and event
    check_room(storage, study, "trials", adding, many(len(trials), "trial"))


def check_measurements(storage: Storage, study: str, items: Sequence[Measurement]) -> None:
    """Refuse measurements that would take the study past ``MAX_STUDY_CHARS``."""
    adding = _measurements_chars(items)
    check_room(storage, study, "measurements", adding, many(len(items), "measurement"))


def check_result(
    storage: Storage,
    study: str,
    metrics: Mapping[str, float],
    spread: Mapping[str, float],
    reason: str,
    repeats: Sequence[Measurement],
) -> None:
    """Refuse a CompleteTrial result that would take the study past ``MAX_STUDY_CHARS``:
    only one larger than ``RESULT_RESERVE``, the room its trial kept (most results are
    smaller, and are stored without reading the study's size)."""
    adding = (
        sum(len(name) + ROW_CHARS for name in metrics)
        + len(json.dumps(dict(spread)))
        + 2 * len(reason)  # the trial's and its event's
        + _measurements_chars(repeats)
        + ROW_CHARS
    )
    if adding > RESULT_RESERVE:
        field_ = "measurements" if repeats else "metrics"
        check_room(storage, study, field_, adding - RESULT_RESERVE, "this result")


def check_room(storage: Storage, study: str, field_: str, adding: int, what: str) -> None:
    """Refuse a request that would take ``study`` past ``MAX_STUDY_CHARS``.

    Args:
        storage: Where the study is.
        study: Its name.
        field_: The request's field that adds to it, named in the error.
        adding: Characters the request would add (an estimate, in ``stored_size``'s units).
        what: The request's additions for people ("3 new trials").

    Raises:
        ValidationError: The study would hold more than ``MAX_STUDY_CHARS``.
    """
    size = storage.stored_size(study)
    held = size.chars + size.unfinished * RESULT_RESERVE
    if held + adding <= MAX_STUDY_CHARS:
        return
    raise ValidationError(
        field_,
        f"{what} would add about {adding:,} characters to study {study!r}, which holds "
        f"{size.chars:,} and keeps {size.unfinished * RESULT_RESERVE:,} for the results of "
        f"its {many(size.unfinished, 'unfinished trial')}: past a study's limit of "
        f"{MAX_STUDY_CHARS:,} characters",
        "a new study for further trials",
    )


def many(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural but for one: "1 trial", "3 trials"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _measurements_chars(measurements: Sequence[Measurement]) -> int:
    return sum(len(json.dumps(dict(m.metrics))) + ROW_CHARS for m in measurements)


# -- private helpers -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Sizes:
    config_chars: int  # at most, a configuration's parameter rows in storage
    config_bytes: int  # at most, a configuration's parameters in a reply


_CACHE: OrderedDict[int, tuple[StudySpec, _Sizes]] = OrderedDict()
_CACHE_GUARD = threading.Lock()


def _sizes(spec: StudySpec) -> _Sizes:
    """``spec``'s largest configuration, measured once per spec object (the cache holds the
    spec itself, so its ``id`` is not reused while cached)."""
    with _CACHE_GUARD:
        hit = _CACHE.get(id(spec))
        if hit is not None and hit[0] is spec:
            _CACHE.move_to_end(id(spec))
            return hit[1]
    knobs = spec.space.knobs
    chars = sum(len(k.name) + _value_chars(k) + ROW_CHARS for k in knobs)
    # a Parameter: its tag and length (4), its name's (2) and its Value's tag and length (3)
    wire = sum(len(k.name) + _value_bytes(k) + 10 for k in knobs)
    if spec.embedding is not None:  # the embedded point: at most one double per knob
        chars += 25 * len(knobs)
        wire += 9 * len(knobs) + 4
    sizes = _Sizes(chars, wire)
    with _CACHE_GUARD:
        _CACHE[id(spec)] = (spec, sizes)
        while len(_CACHE) > 64:
            _CACHE.popitem(last=False)
    return sizes


def _value_chars(knob: Knob) -> int:
    """The longest JSON text of a value of ``knob``."""
    if isinstance(knob, FloatKnob):
        return 24  # repr of any double: "-2.2250738585072014e-308"
    if isinstance(knob, IntKnob):
        return max(len(str(int(knob.low))), len(str(int(knob.high))))
    if isinstance(knob, BoolKnob):
        return 5
    return max(len(json.dumps(c)) for c in getattr(knob, "choices", ("",)))


def _value_bytes(knob: Knob) -> int:
    """The most bytes a ``Value`` of ``knob`` takes on the wire."""
    if isinstance(knob, FloatKnob | IntKnob):
        return 11  # a tag and a double (9) or a zigzag varint (at most 10)
    if isinstance(knob, BoolKnob):
        return 2
    return max(
        len(c.encode("utf-8", "replace")) + 3 if isinstance(c, str) else 11  # tag, length
        for c in getattr(knob, "choices", ("",))
    )
