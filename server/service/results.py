"""Results: a trial completed (with its repeats), trials imported, and further measurements
of a finished trial."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from server import limits
from server.records import ImportedTrial
from server.service.checks import (
    MAX_IMPORT,
    MAX_MEASUREMENTS,
    MAX_REASON,
    MAX_SOURCE,
    REPORTABLE,
    check_reported_metrics,
    checked_text,
    holder_of,
    repeats_of,
    reportable,
    request_record,
    study_name,
    trial_key,
)
from server.service.core import ServiceCore
from server.storage import FinishedTrial, LeaseLapsed
from tuner.errors import AlreadyExistsError, StateError, ValidationError
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, Trial, TrialStatus, repeat_summary

log = logging.getLogger("server.service")


class Results(ServiceCore):
    """``complete_trial``, ``import_trials``, ``add_measurements``."""

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
        override_holder: bool = False,
    ) -> Trial:
        """Record a trial's outcome: measured metrics, or a failure with its reason.

        A trial handed to a client is finished by that client only (``client_id``; see
        ``holder_of``); ``override_holder`` lets an operator finish it by hand. None
        (the default) is an in-process caller, which is not checked; the gRPC servicer
        always passes the request's client id.

        A trial measured several times reports each repeat in ``measurements`` instead of
        ``metrics``: every repeat is stored, and the trial's metrics become their means (its
        ``spread`` their standard deviations, ``repeats`` their number).

        A repeated call with the same ``request_id`` returns the trial as the first call
        left it and stores nothing (without one, a repeat is a StateError: already final).
        """
        arrived = self._clock()
        study = study_name(study)
        status = reportable(status)
        reason = checked_text(reason, "reason", MAX_REASON)
        if REPORTABLE[status] and not reason.strip():
            raise ValidationError(
                "reason", f"a {status.value} trial needs a reason", "non-empty text"
            )
        metrics = dict(metrics or {})
        repeats = repeats_of(measurements, metrics, status)
        request = request_record(
            request_id, "CompleteTrial", study, trial_id, status.value, sorted(metrics.items()),
            reason, [(sorted(m.metrics.items()), m.at) for m in repeats],
        )  # fmt: skip
        holder = holder_of(client_id, override_holder)
        # not under the study's lock: results for different trials of a study are stored
        # side by side (storage locks the one trial), so a burst of completions, as when
        # one designer run answered many workers, does not queue behind itself
        spec = self._spec(study)
        # checked once, as reported: each repeat, or the metrics; the repeats' means are
        # made of checked numbers under checked names (storage keeps its own contract:
        # no backend stores a non-finite number, whoever calls it)
        spread: dict[str, float] = {}
        if repeats:
            for i, repeat in enumerate(repeats):
                where = f"measurements[{i}].metrics"
                check_reported_metrics(spec, repeat.metrics, status, where)
            metrics, spread = repeat_summary(repeats)
        else:
            check_reported_metrics(spec, metrics, status)
        limits.check_result(self.storage, study, metrics, spread, reason, repeats)
        stored = (study, trial_id, status, metrics, reason, request, repeats, spread, holder)
        try:
            try:
                # the trial's own lease is judged in the transaction that stores the result
                # (the study's other leases, by the calls that hand out or read trials)
                due = None if self.leases is None else arrived
                trial = self.storage.finish_trial(*stored, due=due)
            except LeaseLapsed:  # rare: the result came late, and nothing expired it yet
                self._expire(study, arrived)
                trial = self.storage.finish_trial(*stored)
        except (StateError, AlreadyExistsError):
            # a retry: this request was answered before (maybe by another server on a
            # shared database), so the trial is finished or the request id is taken.
            # Looked for only now: the first try of a request, the common case, costs no
            # lookup.
            if request is None or (known := self._replay(study, request)) is None:
                raise
            return known[0]
        if override_holder and trial.client_id and trial.client_id != client_id:
            log.warning("study %s trial %d: finished by %r overriding its holder %r", study,
                        trial.id, client_id, trial.client_id)  # fmt: skip
        if trial.reported_late:
            log.warning(
                "study %s trial %d: %s reported after its lease expired; stored",
                study,
                trial.id,
                status.value,
            )
        else:
            log.info("study %s trial %d: %s", study, trial.id, status.value,
                     extra={"study": study, "trial": trial.id})  # fmt: skip
        return trial

    def import_trials(
        self, study: str, trials: Sequence[ImportedTrial], request_id: str = ""
    ) -> list[Trial]:
        """Add configurations measured elsewhere, with their outcomes (a warm start).

        Each configuration must be a full, valid configuration of the study's space; a
        COMPLETED one reports every metric of the study. The trials count toward the
        initial design, and the model learns from them from the next suggestion on. All or
        nothing: one bad trial rejects the request, naming it (``trials[i]...``).

        Raises:
            ValidationError: A bad trial, too many, or a study searched in an embedding
                (whose model learns only from points of the embedding).
        """
        study = study_name(study)
        items = list(trials)
        if not 1 <= len(items) <= MAX_IMPORT:
            raise ValidationError("trials", f"got {len(items)}", f"1 to {MAX_IMPORT} trials")
        request = request_record(
            request_id, "ImportTrials", study,
            [(t.config, t.status.value, sorted(t.metrics.items()), t.reason) for t in items],
        )  # fmt: skip
        with self._lock(study):
            spec = self._spec(study)
            if request is not None and (known := self._replay(study, request)) is not None:
                return known
            if spec.embedding is not None:
                raise ValidationError(
                    "trials",
                    f"study {study!r} is searched in a {spec.embedding.kind} embedding, whose "
                    "model learns only from points of the embedding: imported configurations "
                    "would be ignored",
                    "a study without an embedding",
                )
            finished = [self._finished(spec, item, f"trials[{i}]") for i, item in enumerate(items)]
            limits.check_imports(self.storage, study, finished)
            try:
                stored = self.storage.import_trials(study, finished, request)
            except AlreadyExistsError:
                if request is None:
                    raise
                return self._replayed(study, request)  # another server answered it first
        log.info("study %s: imported %d trials", study, len(stored))
        return stored

    def _finished(self, spec: StudySpec, item: ImportedTrial, where: str) -> FinishedTrial:
        status = reportable(item.status, f"{where}.status")
        config = spec.space.validate_config(dict(item.config), f"{where}.config")
        if spec.candidates and config not in spec.candidates:
            raise ValidationError(f"{where}.config", "is not one of the study's candidates")
        metrics = dict(item.metrics)
        try:
            check_reported_metrics(spec, metrics, status)
        except ValidationError as error:
            raise ValidationError(f"{where}.{error.field}", str(error).split(": ", 1)[1]) from None
        reason = checked_text(item.reason, f"{where}.reason", MAX_REASON)
        if REPORTABLE[status] and not reason.strip():
            raise ValidationError(
                f"{where}.reason", f"a {status.value} trial needs a reason", "non-empty text"
            )
        source = checked_text(item.source, f"{where}.source", MAX_SOURCE)
        return FinishedTrial(
            config, status, metrics, reason, source or "import", trial_key(spec, config)
        )

    def add_measurements(
        self,
        study: str,
        trial_id: int,
        measurements: Sequence[Measurement],
        request_id: str = "",
    ) -> list[Measurement]:
        """Store further measurements of a finished trial's configuration: controls measured
        between trials, or the rounds of a confirmation. The trial itself does not change.

        A repeated call with the same ``request_id`` returns the measurements the first one
        stored and stores nothing (without one, a repeat stores them again).

        Raises:
            ValidationError: No measurements, too many, a REPEAT (repeats come with
                ``complete_trial``), or a metric that is not a finite number.
            StateError: The trial is not finished yet.
        """
        study = study_name(study)
        items = list(measurements)
        if not 1 <= len(items) <= MAX_MEASUREMENTS:
            raise ValidationError(
                "measurements", f"got {len(items)}", f"1 to {MAX_MEASUREMENTS} measurements"
            )
        allowed = [MeasurementKind.CONTROL.value, MeasurementKind.CONFIRM.value]
        for i, item in enumerate(items):
            if not isinstance(item, Measurement):
                raise ValidationError(f"measurements[{i}]", f"got {type(item).__name__}")
            if item.kind not in allowed:
                raise ValidationError(
                    f"measurements[{i}].kind",
                    f"got {getattr(item.kind, 'value', item.kind)!r} "
                    "(a trial's repeats are reported by CompleteTrial)",
                    allowed,
                )
            check_reported_metrics(
                None, item.metrics, TrialStatus.COMPLETED, f"measurements[{i}].metrics"
            )
        request = request_record(
            request_id, "AddMeasurements", study, trial_id,
            [(MeasurementKind(m.kind).value, sorted(m.metrics.items()), m.at, m.round)
             for m in items],
        )  # fmt: skip
        limits.check_measurements(self.storage, study, items)
        with self._lock(study):
            try:
                stored = self.storage.add_measurements(study, trial_id, items, request)
            except AlreadyExistsError:  # a retry: answered before, maybe by another server
                if request is None or (known := self._known(study, request)) is None:
                    raise
                return self.storage.list_measurements(study, ids=known.answer_ids)
        log.info("study %s trial %d: %d %s measurements stored", study, trial_id, len(stored),
                 items[0].kind)  # fmt: skip
        return stored
