"""A study kept in memory behind the session's ``TuningAPI``: sessions without a service.

``runner.session.run_session`` drives anything with the service's methods. The service
(``server.service.TuningService``) stores studies in SQLite and checks every request; a
benchmark that runs hundreds of short sessions needs neither, and may not import the
service layer. ``MemoryAPI`` keeps each study's trials and measurements in lists and makes
suggestions through the same two functions the service uses (``tuner.loop.propose`` and
``new_trial``), with a warm-starting fit cache per study, so a session on it suggests,
measures and summarizes exactly as one on the service does.

What it leaves out: leases (a trial stays ACTIVE until completed), request ids, and the
service's validation of what clients send (the session sends only what it measured).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tuner.designer import FitCache
from tuner.errors import NotFoundError, StateError
from tuner.loop import new_trial, propose
from tuner.stopping import Decision, decide, next_window
from tuner.study import StudySpec
from tuner.transfer import read_sources
from tuner.trial import Measurement, MeasurementKind, Trial, TrialStatus, repeat_summary


@dataclass
class _Study:
    spec: StudySpec
    trials: list[Trial] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    cache: FitCache = field(default_factory=FitCache)


class MemoryAPI:
    """The session's ``TuningAPI`` over studies held in memory (module doc)."""

    def __init__(self) -> None:
        self._studies: dict[str, _Study] = {}

    def create_study(self, spec: StudySpec) -> tuple[StudySpec, bool]:
        """The study named ``spec.name``, created when new; True when it was created."""
        if spec.name in self._studies:
            return self._studies[spec.name].spec, False
        self._studies[spec.name] = _Study(spec)
        return spec, True

    def suggest_trials(self, study: str, count: int, client_id: str = "") -> list[Trial]:
        """``client_id``'s ACTIVE trials first (a resumed session gets its trial back),
        then new suggestions, ``count`` in all."""
        found = self._study(study)
        mine = [
            t for t in found.trials if t.status is TrialStatus.ACTIVE and t.client_id == client_id
        ]
        if len(mine) >= count:
            return mine[:count]
        sources, problems = read_sources(found.spec, self._source)
        made = propose(found.spec, found.trials, count - len(mine), found.cache, sources=sources)
        now = time.time()
        new = [
            replace(
                new_trial(len(found.trials) + i + 1, s, client_id, problems.warning()),
                created_at=now,
                updated_at=now,
            )
            for i, s in enumerate(made)
        ]
        found.trials += new
        return mine + new

    def complete_trial(
        self,
        study: str,
        trial_id: int,
        metrics: Mapping[str, float] | None = None,
        status: TrialStatus = TrialStatus.COMPLETED,
        reason: str = "",
        request_id: str = "",
        measurements: Sequence[Measurement] = (),
        client_id: str | None = None,
    ) -> Trial:
        """Finish an ACTIVE trial with ``metrics``, or with the means of ``measurements``
        (stored as its repeats; ``repeats`` and ``spread`` as the service sets them). One
        caller holds every trial in memory, so ``client_id`` is not checked."""
        found = self._study(study)
        trial = self._trial(found, trial_id)
        if trial.status is not TrialStatus.ACTIVE:
            raise StateError(f"trial {trial_id} is {trial.status.value} and cannot be completed")
        now = time.time()
        repeats = [
            replace(m, trial_id=trial_id, at=m.at or now) for m in measurements if status.measured
        ]
        spread: dict[str, float] = {}
        values = dict(metrics or {})
        if repeats:
            values, spread = repeat_summary(repeats)
        found.measurements += repeats
        done = replace(
            trial, status=status, metrics=values, reason=reason, updated_at=now,
            repeats=max(len(repeats), 1), spread=spread, windows=_windows(found, trial_id),
        )  # fmt: skip
        found.trials[trial_id - 1] = done
        return done

    def import_trials(self, study: str, trials: Sequence[Trial]) -> list[Trial]:
        """Add finished trials measured elsewhere (a warm start, or a transfer source made
        in another process): each renumbered after the study's, its configuration checked
        against the study's space, its step IMPORT unless it has one."""
        found = self._study(study)
        added: list[Trial] = []
        for i, trial in enumerate(trials):
            if not trial.status.is_final:
                raise StateError(f"trials[{i}] is {trial.status.value}: only finished trials")
            config = found.spec.space.validate_config(dict(trial.config), f"trials[{i}].config")
            added.append(replace(trial, id=len(found.trials) + len(added) + 1, config=config))
        found.trials += added
        return added

    def add_measurements(
        self, study: str, trial_id: int, measurements: Sequence[Measurement]
    ) -> list[Measurement]:
        """Keep controls and confirmation rounds of a trial."""
        found = self._study(study)
        self._trial(found, trial_id)
        now = time.time()
        added = [replace(m, trial_id=trial_id, at=m.at or now) for m in measurements]
        found.measurements += added
        return added

    def list_measurements(
        self,
        study: str,
        trial_id: int | None = None,
        kinds: Collection[MeasurementKind] | None = None,
    ) -> list[Measurement]:
        return [
            m for m in self._study(study).measurements
            if (trial_id is None or m.trial_id == trial_id) and (kinds is None or m.kind in kinds)
        ]  # fmt: skip

    def list_trials(
        self, study: str, statuses: Collection[TrialStatus] | None = None
    ) -> list[Trial]:
        return [t for t in self._study(study).trials if statuses is None or t.status in statuses]

    def heartbeat(self, study: str, trial_id: int, client_id: str | None = None) -> Trial:
        """Nothing to renew: trials held in memory have no lease."""
        return self._trial(self._study(study), trial_id)

    def report_progress(
        self,
        study: str,
        trial_id: int,
        metrics: Mapping[str, float],
        client_id: str | None = None,
        window: int = 0,
    ) -> Decision:
        """Keep one window of an ACTIVE trial's measurement (a retried window number is not
        kept twice) and decide whether it stops (``tuner.stopping.decide``, as the service
        does)."""
        found = self._study(study)
        trial = self._trial(found, trial_id)
        if trial.status is not TrialStatus.ACTIVE:
            raise StateError(f"trial {trial_id} is {trial.status.value}, not ACTIVE")
        count = _windows(found, trial_id)
        number = next_window(window, count)
        if number > count:
            found.measurements.append(
                Measurement(dict(metrics), MeasurementKind.PROGRESS, time.time(), number, trial_id)
            )
            count = number
        if not found.spec.stopping.stops:
            return Decision(False, "", count)
        return decide(found.spec, trial, found.trials, found.measurements)

    def _source(self, name: str) -> tuple[StudySpec, list[Trial]] | None:
        """A transfer source's spec and trials (``tuner.transfer.read_sources``)."""
        found = self._studies.get(name)
        return None if found is None else (found.spec, list(found.trials))

    def _study(self, name: str) -> _Study:
        if name not in self._studies:
            raise NotFoundError(f"no study named {name!r}")
        return self._studies[name]

    @staticmethod
    def _trial(study: _Study, trial_id: int) -> Trial:
        if not 1 <= trial_id <= len(study.trials):
            raise NotFoundError(f"study {study.spec.name!r} has no trial {trial_id}")
        return study.trials[trial_id - 1]


def _windows(study: _Study, trial_id: int) -> int:
    """How many progress windows ``study`` keeps of trial ``trial_id``."""
    return sum(
        m.trial_id == trial_id and m.kind is MeasurementKind.PROGRESS for m in study.measurements
    )
