"""Studies created and read; trials, measurements, the best and the Pareto front read."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection

from server import limits
from server.records import StudyInfo
from server.service.checks import differences, study_name
from server.service.core import ServiceCore
from tuner.confirmation import Best
from tuner.errors import AlreadyExistsError, NotFoundError, StateError
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, Trial, TrialStatus, pareto_front

log = logging.getLogger("server.service")


class Reads(ServiceCore):
    """``create_study`` and every read of studies, trials and measurements."""

    def create_study(self, spec: StudySpec) -> tuple[StudyInfo, bool]:
        """Create the study, or load it when one with the same name and spec exists.

        Returns:
            The study and whether it was created by this call.

        Raises:
            AlreadyExistsError: A study of that name exists with a different spec.
        """
        limits.check_spec(spec)
        with self._lock(spec.name):
            try:
                self.storage.create_study(spec)
                log.info("created study %s", spec.name)
                return self.get_study(spec.name), True
            except AlreadyExistsError:
                existing = self.storage.get_study(spec.name).spec
                if existing.fingerprint() != spec.fingerprint():
                    raise AlreadyExistsError(
                        f"study {spec.name!r} already exists with a different spec "
                        f"(differs in: {', '.join(differences(existing, spec))}); "
                        "choose another name or send the stored spec"
                    ) from None
                return self.get_study(spec.name), False

    def get_study(self, name: str) -> StudyInfo:
        stored = self.storage.get_study(study_name(name))
        self._expire(stored.name)
        trials = self.storage.list_trials(stored.name)
        best = None if stored.spec.multi_objective else self._best(stored.spec, trials).trial
        counts = Counter(t.status.value for t in trials)
        return StudyInfo(stored.spec, stored.created_at, dict(counts), best.id if best else None)

    def list_studies(self, offset: int = 0, limit: int | None = None) -> list[StudyInfo]:
        """The studies, oldest first: at most ``limit`` from the ``offset``-th on."""
        return [self.get_study(s.name) for s in self.storage.list_studies(offset, limit)]

    def list_measurements(
        self,
        study: str,
        trial_id: int | None = None,
        kinds: Collection[MeasurementKind] | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> list[Measurement]:
        """The study's stored measurements (repeats, controls, confirmation rounds) in the
        order they were stored; one trial's, or some kinds only, when given; at most
        ``limit`` from the ``offset``-th on."""
        return self.storage.list_measurements(
            study_name(study), trial_id, kinds, offset=offset, limit=limit
        )

    def list_trials(
        self,
        study: str,
        statuses: Collection[TrialStatus] | None = None,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Trial]:
        """The study's trials in id order (only those in ``statuses`` when given): at most
        ``limit`` of those with an id above ``after``."""
        self._expire(study_name(study))
        return self.storage.list_trials(study, statuses, after, limit)

    def get_trial(self, study: str, trial_id: int) -> Trial:
        self._expire(study_name(study))
        return self.storage.get_trial(study, trial_id)

    def get_best_trial(self, study: str) -> Trial:
        """The best feasible trial as a session reports it (``best``); NotFoundError while
        there is none, StateError when the study has several objectives."""
        found = self.best(study).trial
        if found is None:
            raise NotFoundError(f"study {study!r} has no feasible completed trial yet")
        return found

    def best(self, study: str) -> Best:
        """The study's best and how it was chosen (``server.best.study_best``: the
        confirmed best, else the best measured of the stable trials the model does not call
        outliers, ranked once per
        set of results and kept for readers without the model). StateError when the study
        has several objectives."""
        spec = self._spec(study_name(study))
        if spec.multi_objective:
            names = ", ".join(o.name for o in spec.objectives)
            raise StateError(
                f"study {study!r} has {len(spec.objectives)} objectives ({names}) and no single "
                "best trial; ask for its Pareto front (GetParetoFront, `tuner front`)"
            )
        self._expire(spec.name)
        return self._best(spec, self.storage.list_trials(spec.name))

    def get_pareto_front(self, study: str) -> list[Trial]:
        """Feasible trials no other feasible trial dominates (``tuner.trial.pareto_front``)."""
        spec = self._spec(study_name(study))
        return pareto_front(spec, self.storage.list_trials(study, [TrialStatus.COMPLETED]))
