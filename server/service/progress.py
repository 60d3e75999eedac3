"""A trial being measured: heartbeats, its measurement reported window by window, and
whether it should stop early (``tuner.stopping``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from server import limits
from server.service.checks import check_reported_metrics, holder_of, study_name
from server.service.core import ServiceCore
from server.storage import check_holder
from tuner.errors import StateError, ValidationError
from tuner.stopping import Decision, decide, next_window
from tuner.trial import Measurement, MeasurementKind, Trial, TrialStatus

log = logging.getLogger("server.service")

#: Windows one trial may report: a measurement of hours in one-second windows.
MAX_WINDOWS = 10_000
#: The kinds of measurement the stopping rule reads besides the trial's own windows: the
#: study's run-to-run noise.
_NOISE_KINDS = (MeasurementKind.REPEAT, MeasurementKind.CONTROL)


class Progress(ServiceCore):
    """``heartbeat``, ``report_progress``, ``should_stop``."""

    def heartbeat(
        self,
        study: str,
        trial_id: int,
        client_id: str | None = None,
        override_holder: bool = False,
    ) -> Trial:
        """Renew the lease of an ACTIVE trial: its worker is still measuring it. Only the
        client it was handed to may (``client_id``, ``override_holder``: ``holder_of``).

        Raises:
            StateError: The trial is not ACTIVE (finished, or its lease expired: the message
                says when and which trial re-offers it).
        """
        arrived = self._clock()
        study = study_name(study)
        holder = holder_of(client_id, override_holder)
        with self._lock(study):
            self._spec(study)
            self._expire(study, arrived)
            lease = self._lease_end()
            if lease is None:
                trial = self.storage.get_trial(study, trial_id)
                check_holder(study, trial_id, trial.client_id, holder, "renew")
                if trial.status is not TrialStatus.ACTIVE:
                    raise StateError(f"trial {trial_id} is {trial.status.value}, not ACTIVE")
            else:
                trial = self.storage.renew_lease(study, trial_id, lease, holder)
        if override_holder and trial.client_id and trial.client_id != client_id:
            log.warning("study %s trial %d: renewed by %r overriding its holder %r", study,
                        trial.id, client_id, trial.client_id)  # fmt: skip
        return trial  # without leases nothing expires: the heartbeat changed nothing

    def report_progress(
        self,
        study: str,
        trial_id: int,
        metrics: Mapping[str, float],
        client_id: str | None = None,
        window: int = 0,
    ) -> Decision:
        """Store one window of an ACTIVE trial's measurement (a PROGRESS measurement, its
        ``round`` the window's number) and say whether the trial should stop now
        (``tuner.stopping.decide``). Only the client the trial was handed to may report
        (``client_id``, as for ``heartbeat``), and a report renews the trial's lease.

        Args:
            window: The window's number from 1 (a window already stored is a retry: nothing
                is stored again); 0: the next one.

        Raises:
            ValidationError: A metric name or value that is not allowed, or a window number
                past the next one.
            StateError: The trial is not ACTIVE.
        """
        study = study_name(study)
        metrics = dict(metrics) if isinstance(metrics, Mapping) else metrics
        check_reported_metrics(None, metrics, TrialStatus.COMPLETED, "metrics")
        trial = self.heartbeat(study, trial_id, client_id)
        with self._lock(study):
            self._spec(study)
            done = self.storage.list_measurements(study, trial_id, [MeasurementKind.PROGRESS])
            number = next_window(window, len(done))
            if number > len(done):  # else a retry of a stored window: nothing to store
                if len(done) >= MAX_WINDOWS:
                    raise ValidationError(
                        "trial_id", f"trial {trial_id} reported {len(done)} windows already",
                        f"at most {MAX_WINDOWS} windows a trial",
                    )  # fmt: skip
                stored = Measurement(dict(metrics), MeasurementKind.PROGRESS, round=number)
                limits.check_measurements(self.storage, study, [stored])
                self.storage.add_measurements(study, trial_id, [stored])
        answer = self._decision(study, trial)
        if answer.stop:
            log.info("study %s trial %d: %s", study, trial_id, answer.reason,
                     extra={"study": study, "trial": trial_id})  # fmt: skip
        return answer

    def should_stop(self, study: str, trial_id: int) -> Decision:
        """Whether an ACTIVE trial should stop, from the windows it reported so far; stores
        nothing (Vizier's ``CheckTrialEarlyStoppingState``).

        Raises:
            StateError: The trial is not ACTIVE.
        """
        study = study_name(study)
        self._spec(study)
        self._expire(study)
        trial = self.storage.get_trial(study, trial_id)
        if trial.status is not TrialStatus.ACTIVE:
            raise StateError(f"trial {trial_id} is {trial.status.value}, not ACTIVE")
        return self._decision(study, trial)

    def _decision(self, study: str, trial: Trial) -> Decision:
        spec = self._spec(study)
        if not spec.stopping.stops:
            count = len(self.storage.list_measurements(study, trial.id, [MeasurementKind.PROGRESS]))
            return Decision(False, "", count)
        trials = self.storage.list_trials(study)
        windows = [MeasurementKind.PROGRESS]
        measurements = [
            *self.storage.list_measurements(study, kinds=_NOISE_KINDS),
            # screening ranks every trial's first windows; the rule alone, this trial's
            *self.storage.list_measurements(
                study, None if spec.stopping.screen_windows else trial.id, windows
            ),
        ]
        return decide(spec, trial, trials, measurements)
