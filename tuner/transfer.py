"""What a study learns from earlier studies: its ``transfer_from`` sources, read as evidence.

A study names earlier studies of related workloads (``StudySpec.transfer_from``; the same
database under another workload, the same model on another GPU). Before each suggestion the
service reads every source's spec and trials once (``read_sources``) and hands the designer a
``SourceStudy`` per source: the source's measured configurations, in *this* study's knob
names, with its objective's values. What the designer does with them is
``tuner/designer/models/transfer.py``.

Matching (the issue's rules, decided here):

* knobs are matched by name, or by the source's ``knobs`` table (this study's name -> the
  source's); a knob of this study the source lacks, or one whose kind differs (a number
  against a choice), is not seen in that source's evidence, and a source knob this study
  lacks is ignored;
* the objective is the source's first one; goals may differ (a source minimizing latency for
  a study maximizing throughput): the model orients each source by the stored goals, never
  by the values' scale;
* a source's COMPLETED trials with a finite objective value are its evidence; failures and
  stopped trials are not (a stopped trial holds a part of a measurement); its best is the
  best of those that met its outcome constraints.

A source that no longer exists is a warning on the suggestions, not an error: the study goes
on with the others (``read_sources`` names it in ``SourceProblems``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tuner.space import Config, FloatKnob, IntKnob, Knob
from tuner.study import Goal, StudySpec, TransferSource
from tuner.trial import Trial, TrialStatus, is_feasible, with_resolved_constraints


@dataclass(frozen=True)
class SourceStudy:
    """One source's evidence, in the target study's terms.

    Attributes:
        name: The source study's name.
        goal: The source objective's goal.
        objective: The source objective's metric name (for messages).
        knobs: This study's knobs the source's evidence holds.
        points: ``(configuration, value)`` per measured trial; configurations hold ``knobs``
            only, under this study's names.
        best: The source's best trial's configuration (``knobs`` only): the best objective
            among its trials that met its outcome constraints; None without one.
        digest: A hash of all of the above: equal digests, equal evidence (the designer caches
            a source's fitted model under it).
    """

    name: str
    goal: Goal
    objective: str
    knobs: tuple[str, ...]
    points: tuple[tuple[Config, float], ...]
    best: Config | None = None
    digest: str = field(default="", compare=False)


def source_study(target: StudySpec, source: TransferSource, spec: StudySpec,
                 trials: Sequence[Trial]) -> SourceStudy:  # fmt: skip
    """``spec``'s trials as evidence for ``target`` (module doc: matching)."""
    theirs = {k.name: k for k in spec.space.knobs}
    knobs = []
    for knob in target.space.knobs:
        other = theirs.get(source.source_name(knob.name))
        if other is not None and _same_kind(knob, other):
            knobs.append(knob.name)
    objective = spec.objective.name
    resolved = with_resolved_constraints(spec, trials)
    sign = 1.0 if spec.objective.goal is Goal.MAXIMIZE else -1.0
    points, best, best_value = [], None, -math.inf
    for trial in trials:
        value = trial.metrics.get(objective)
        if trial.status is not TrialStatus.COMPLETED or value is None or not math.isfinite(value):
            continue
        config = {k: trial.config[source.source_name(k)] for k in knobs
                  if source.source_name(k) in trial.config}  # fmt: skip
        if len(config) < len(knobs):
            continue
        points.append((config, float(value)))
        if is_feasible(resolved, trial) and sign * value > best_value:
            best, best_value = config, sign * value
    blob = json.dumps(
        [source.study, spec.objective.goal.value, objective, knobs,
         [[sorted(c.items(), key=lambda kv: kv[0]), v] for c, v in points],
         sorted((best or {}).items())],
        default=str,
    )  # fmt: skip
    digest = hashlib.sha256(blob.encode()).hexdigest()
    return SourceStudy(
        source.study, spec.objective.goal, objective, tuple(knobs), tuple(points), best, digest
    )


@dataclass(frozen=True)
class SourceProblems:
    """What kept sources out of a suggestion: ``missing`` names studies not found."""

    missing: tuple[str, ...] = ()

    def warning(self) -> str:
        if not self.missing:
            return ""
        names = ", ".join(repr(n) for n in self.missing)
        return f"transfer_from: study {names} not found; learning from the other sources only"


def read_sources(
    spec: StudySpec, read: Callable[[str], tuple[StudySpec, Sequence[Trial]] | None]
) -> tuple[list[SourceStudy], SourceProblems]:
    """The sources of ``spec``, each read with ``read(name)`` (None: no such study)."""
    found, missing = [], []
    for source in spec.transfer_from:
        got = read(source.study)
        if got is None:
            missing.append(source.study)
            continue
        found.append(source_study(spec, source, *got))
    return found, SourceProblems(tuple(missing))


def _same_kind(a: Knob, b: Knob) -> bool:
    """Whether values of ``b`` can be read as values of ``a``: both numbers, or both
    choices (a value outside ``a``'s choices is dropped where it is encoded)."""
    numeric = (FloatKnob, IntKnob)
    return isinstance(a, numeric) == isinstance(b, numeric)
