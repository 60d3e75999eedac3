"""The tuning service: studies, suggestions and results over a storage backend, without gRPC.

``TuningService`` is what the gRPC servicer, the in-process CLI session and most tests call.
It validates requests, serializes the work on each study behind a per-study lock (but for
results: storage stores those of different trials side by side), asks the study's designer
for configurations and records everything in storage, which stays the only source of
truth: a restarted service over the same file continues where it stopped.

The designer runs outside the study's lock (in a server, in worker processes:
``server.suggest``), so completions, heartbeats and reads never wait for a model fit. A
study has at most one designer run at a time: SuggestTrials calls that arrive while one is
in progress wait for it, then share the next run, which suggests for all of them at once
with every stored trial in view. At most ``max_waiting`` calls wait; one more is refused
with ``OverloadedError`` (RESOURCE_EXHAUSTED, with the delay after which to send it again).
Leases are judged by the time a request arrived, not the time it got the study's lock.

Suggestions follow OSS Vizier's ``client_id`` semantics: a client that still holds ACTIVE
trials gets those back before anything new is generated, so a worker that crashed and
retried its request resumes its trial instead of leaking it.

With a ``LeasePolicy`` every handed-out trial holds a lease of ``ttl_s`` seconds, renewed by
``heartbeat`` (and by asking for suggestions again with the same client id). A worker that
vanishes for good loses its trials when their leases run out: each becomes ABANDONED and
its configuration is queued again as a new PENDING trial, handed out before anything new
is suggested (or, with ``on_expiry = "fail"``, it becomes FAILED and is not re-offered).
Expiry is checked, against the service's clock, whenever the study is read or written.
A worker that was only slow still gets its result stored: the first report after expiry
is accepted and marked ``reported_late`` (and a re-offer nobody has taken yet is dropped).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from server import limits
from server.best import study_best
from server.records import ImportedTrial, LeasePolicy, StudyInfo
from server.storage import (
    FinishedTrial,
    LeaseLapsed,
    NewBatch,
    NewTrial,
    Request,
    Storage,
    check_holder,
    storable,
)
from server.suggest import Designer, InlineDesigner
from tuner.config_key import config_key, key_text
from tuner.confirmation import Best
from tuner.constraints import METRIC_NAME
from tuner.errors import (
    AlreadyExistsError,
    NotFoundError,
    OverloadedError,
    StateError,
    TakenError,
    ValidationError,
)
from tuner.loop import new_trial
from tuner.space import Config

if TYPE_CHECKING:
    from tuner.designer import FitCache, Suggestion
from tuner.study import StudySpec
from tuner.trial import (
    Measurement,
    MeasurementKind,
    Trial,
    TrialStatus,
    pareto_front,
    repeat_summary,
)

log = logging.getLogger(__name__)

MAX_SUGGESTIONS = 100
#: Designer runs again after another writer stored a run's configurations first: each race
#: lost means another writer made progress, so a few settle even many replicas at once.
MAX_TAKEN_RETRIES = 8
#: Knob values one SuggestTrials call may create (count x knobs): every value is stored and
#: sent, so a call on a many-knob study asks for fewer trials at a time.
MAX_SUGGESTED_VALUES = 50_000
MAX_CLIENT_ID = 256
MAX_REQUEST_ID = 256
MAX_REASON = 4096
#: Characters of an imported trial's source ("import:<file name or study>").
MAX_SOURCE = 1024
MAX_IMPORT = 10_000
MAX_MEASUREMENTS = 1_000
#: Metrics one trial or measurement may report (the study's and extra readings).
MAX_METRICS = 256
#: Statuses a client may report, and whether each needs a reason.
REPORTABLE = {
    TrialStatus.COMPLETED: False,
    TrialStatus.INFEASIBLE: True,
    TrialStatus.FAILED: True,
    TrialStatus.TIMED_OUT: True,
    TrialStatus.ABANDONED: True,
}


class TuningService:
    """Studies and trials over one storage backend; safe to call from many threads.

    Args:
        storage: Where everything is kept; the only source of truth.
        fit_cache: Warm starts of the model fits (a new one by default).
        leases: Leases of handed-out trials (None: trials never expire).
        clock: Wall-clock time, for leases.
        designer: Where the designer runs (``server.suggest``): in the calling thread by
            default; a ``WorkerPool`` in a server.
        max_waiting: SuggestTrials calls that may be in progress at once; one more is
            refused with ``OverloadedError`` (0: no limit). A server keeps it below its
            gRPC threads, so the threads left always answer health, reads and results.
    """

    def __init__(
        self,
        storage: Storage,
        fit_cache: FitCache | None = None,
        leases: LeasePolicy | None = None,
        clock: Callable[[], float] = time.time,
        designer: Designer | None = None,
        max_waiting: int = 0,
    ) -> None:
        self.storage = storage
        self._fit_cache = fit_cache
        self.leases = leases
        self.max_waiting = max_waiting
        self._clock = clock
        self._designer: Designer = designer if designer is not None else InlineDesigner()
        self._locks: dict[str, threading.Lock] = {}
        self._specs: dict[str, StudySpec] = {}  # a study's spec never changes once stored
        self._locks_guard = threading.Lock()
        # SuggestTrials bookkeeping (``suggest_trials``, ``_new_trials``), under one condition:
        self._asking = threading.Condition()
        self._suggesting = 0  # calls in progress
        self._callers: set[tuple[str, str]] = set()  # (study, client) with a call in progress
        self._queues: dict[str, _Queue] = {}  # studies with a designer run in progress

    # -- studies ------------------------------------------------------------------------
    @property
    def fit_cache(self) -> FitCache:
        """Warm starts of the model fits, made on the first suggestion (the designer's
        import, torch among it, is paid by the first call that needs it)."""
        if self._fit_cache is None:
            from tuner.designer import FitCache

            self._fit_cache = FitCache()
        return self._fit_cache

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
                        f"(differs in: {', '.join(_differences(existing, spec))}); "
                        "choose another name or send the stored spec"
                    ) from None
                return self.get_study(spec.name), False

    def get_study(self, name: str) -> StudyInfo:
        stored = self.storage.get_study(_study_name(name))
        self._expire(stored.name)
        trials = self.storage.list_trials(stored.name)
        best = None if stored.spec.multi_objective else self._best(stored.spec, trials).trial
        counts = Counter(t.status.value for t in trials)
        return StudyInfo(stored.spec, stored.created_at, dict(counts), best.id if best else None)

    def list_studies(self, offset: int = 0, limit: int | None = None) -> list[StudyInfo]:
        """The studies, oldest first: at most ``limit`` from the ``offset``-th on."""
        return [self.get_study(s.name) for s in self.storage.list_studies(offset, limit)]

    # -- trials -------------------------------------------------------------------------
    def suggest_trials(
        self, study: str, count: int, client_id: str = "", request_id: str = ""
    ) -> list[Trial]:
        """Trials for ``client_id`` to run: its ACTIVE ones first, then new suggestions.

        A repeated call with the same ``request_id`` returns the trials the first one
        returned (as they are now) and creates nothing. Calls of one client on one study
        are answered one after the other (a second waits for the first, then gets what
        the first left it); new suggestions for calls of different clients come from one
        designer run (``_new_trials``).

        Raises:
            OverloadedError: ``max_waiting`` calls are already waiting for suggestions;
                nothing was done, and the error says when to try again.
        """
        arrived = self._clock()
        study = _study_name(study)
        if (
            isinstance(count, bool)
            or not isinstance(count, int)
            or not 1 <= count <= MAX_SUGGESTIONS
        ):
            raise ValidationError(
                "count", f"got {count!r}", f"an integer in [1, {MAX_SUGGESTIONS}]"
            )
        client_id = _text(client_id, "client_id", MAX_CLIENT_ID)
        request = _request(request_id, "SuggestTrials", study, count, client_id)
        caller = (study, client_id or (f"request:{request_id}" if request_id else ""))
        with self._asking:
            if self.max_waiting and self._suggesting >= self.max_waiting:
                wait = self._designer.retry_after()
                raise OverloadedError(
                    f"{self._suggesting} SuggestTrials calls are already waiting for the "
                    f"designer (at most {self.max_waiting}); nothing was done: send the same "
                    f"request again in {wait:.1f} s",
                    wait,
                )
            self._suggesting += 1
            while caller[1] and caller in self._callers:  # the same caller's earlier call
                self._asking.wait()
            if caller[1]:
                self._callers.add(caller)
        try:
            with self._lock(study):
                knobs = len(self._spec(study).space)
                if count * knobs > MAX_SUGGESTED_VALUES:
                    raise ValidationError(
                        "count",
                        f"{count} trials of {knobs} knobs are {count * knobs} knob values, "
                        f"more than one call creates ({MAX_SUGGESTED_VALUES})",
                        f"at most {max(1, MAX_SUGGESTED_VALUES // knobs)} trials per call "
                        "for this study",
                    )
                limits.check_suggestion(self._spec(study), count, client_id)
                if request is not None and (known := self._replay(study, request)) is not None:
                    return known
                self._expire(study, arrived)
                lease = self._lease_end()
                mine = self.storage.active_trials(study, client_id) if client_id else []
                if lease is not None:  # asking again is a sign of life
                    mine = [self.storage.renew_lease(study, t.id, lease) for t in mine]
                if len(mine) < count:
                    mine += self.storage.claim_trials(study, client_id, count - len(mine), lease)
                if len(mine) >= count:
                    mine = mine[:count]
                    if request is not None:
                        try:
                            self.storage.add_trials(study, [], request, [t.id for t in mine])
                        except AlreadyExistsError:
                            return self._replayed(study, request)
                    return mine
            need = count - len(mine)
            limits.check_new_trials(self.storage, self._spec(study), need, client_id)
            ask = _Ask(need, client_id, request, [t.id for t in mine])
            new = self._new_trials(study, ask)
            if ask.replayed is not None:
                return ask.replayed
        finally:
            with self._asking:
                self._suggesting -= 1
                self._callers.discard(caller)
                self._asking.notify_all()
        for trial in new:
            if trial.warning:
                log.warning("study %s trial %d: %s", study, trial.id, trial.warning,
                            extra={"study": study, "trial": trial.id})  # fmt: skip
        return mine + new

    def _new_trials(self, study: str, ask: _Ask) -> list[Trial]:
        """New trials for ``ask``, from the study's next designer run.

        Calls that need new suggestions while a run for their study is in progress wait
        for it to end; then one of them leads the next run, for all of them at once (the
        designer sees every trial stored so far, the earlier runs' ones pending). So each
        study has at most one designer run at a time, and concurrent callers share it.
        """
        with self._asking:
            queue = self._queues.setdefault(study, _Queue())
            queue.waiting.append(ask)
            if not queue.running:
                queue.running = ask.leads = True
            while not ask.leads and not ask.done:
                self._asking.wait()
            if ask.done:
                return _answer(ask)
            batch, queue.waiting = queue.waiting, []
        try:
            self._run_batch(study, batch)
        finally:
            with self._asking:
                for each in batch:
                    each.done = True
                if queue.waiting:
                    queue.waiting[0].leads = True
                else:
                    queue.running = False
                    del self._queues[study]
                self._asking.notify_all()
        return _answer(ask)

    def _run_batch(self, study: str, batch: list[_Ask]) -> None:
        """One designer run for every call in ``batch``; each call's trials are stored with
        its own client, lease and request record, all in one transaction (so completions
        on the study wait for one write, not one per call).

        Another writer on the same database (a replica, a session on the same file) may
        have read the same trials and chosen the same configurations meanwhile: storage
        refuses those (``TakenError``, nothing stored), and the designer runs again with
        the other writer's trials in view and a salt of its own, so that its next draws
        are not the other writer's next draws too (``History.salt``). After
        ``MAX_TAKEN_RETRIES`` such races the calls are refused as overloaded."""
        try:
            spec = self._spec(study)
            need = sum(ask.need for ask in batch)
            salt = 0
            for attempt in range(MAX_TAKEN_RETRIES + 1):
                trials = self.storage.list_trials(study)  # a snapshot: no lock needed
                since = trials[-1].id if trials else 0
                suggestions = self._designer.propose(spec, trials, need, self.fit_cache, salt)
                try:
                    self._store_batch(study, spec, batch, suggestions, since)
                    return
                except TakenError as taken:
                    log.info("study %s: suggesting again (%d): %s", study, attempt + 1, taken,
                             extra={"study": study})  # fmt: skip
                    salt = secrets.randbits(31) | 1
            wait = self._designer.retry_after()
            raise OverloadedError(
                f"study {study!r}: other writers stored the configurations suggested for "
                f"this call first, {MAX_TAKEN_RETRIES + 1} times in a row; nothing was "
                f"stored: send the same request again in {wait:.1f} s",
                wait,
            )
        except Exception as error:  # every call of the batch gets it, not only the leader
            for ask in batch:
                ask.error = error

    def _store_batch(
        self,
        study: str,
        spec: StudySpec,
        batch: list[_Ask],
        suggestions: list[Suggestion],
        since: int,
    ) -> None:
        """Store ``batch``'s share of ``suggestions`` (chosen from the trials up to trial
        ``since``) for each of its calls, or raise ``TakenError`` storing nothing."""
        with self._lock(study):
            lease = self._lease_end()
            batches = []
            for ask in batch:
                part, suggestions = suggestions[: ask.need], suggestions[ask.need :]
                made = [new_trial(0, s, ask.client_id) for s in part]  # storage numbers them
                new = [
                    NewTrial(t.config, t.client_id, t.source, t.warning, embedded=t.embedded,
                             lease_expires_at=lease, step=t.step, key=_key(spec, t.config))
                    for t in made
                ]  # fmt: skip
                batches.append(NewBatch(new, ask.request, ask.mine))
            added = self.storage.add_trial_batches(study, batches, since)
            for ask, trials_added in zip(batch, added, strict=True):
                if trials_added is None:
                    # retried on another server, which answered first: that answer
                    # stands (nothing of this one was stored); the batch goes on
                    ask.replayed = self._replayed(study, cast(Request, ask.request))
                else:
                    ask.trials = trials_added

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
        ``_holder``); ``override_holder`` lets an operator finish it by hand. None
        (the default) is an in-process caller, which is not checked; the gRPC servicer
        always passes the request's client id.

        A trial measured several times reports each repeat in ``measurements`` instead of
        ``metrics``: every repeat is stored, and the trial's metrics become their means (its
        ``spread`` their standard deviations, ``repeats`` their number).

        A repeated call with the same ``request_id`` returns the trial as the first call
        left it and stores nothing (without one, a repeat is a StateError: already final).
        """
        arrived = self._clock()
        study = _study_name(study)
        status = _reportable(status)
        reason = _text(reason, "reason", MAX_REASON)
        if REPORTABLE[status] and not reason.strip():
            raise ValidationError(
                "reason", f"a {status.value} trial needs a reason", "non-empty text"
            )
        metrics = dict(metrics or {})
        repeats = _repeats(measurements, metrics, status)
        request = _request(
            request_id, "CompleteTrial", study, trial_id, status.value, sorted(metrics.items()),
            reason, [(sorted(m.metrics.items()), m.at) for m in repeats],
        )  # fmt: skip
        holder = _holder(client_id, override_holder)
        # not under the study's lock: results for different trials of a study are stored
        # side by side (storage locks the one trial), so a burst of completions, as when
        # one designer run answered many workers, does not queue behind itself
        spec = self._spec(study)
        for i, repeat in enumerate(repeats):
            _check_metrics(spec, repeat.metrics, status, f"measurements[{i}].metrics")
        spread: dict[str, float] = {}
        if repeats:
            metrics, spread = repeat_summary(repeats)
        _check_metrics(spec, metrics, status)
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
        study = _study_name(study)
        items = list(trials)
        if not 1 <= len(items) <= MAX_IMPORT:
            raise ValidationError("trials", f"got {len(items)}", f"1 to {MAX_IMPORT} trials")
        request = _request(
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
        status = _reportable(item.status, f"{where}.status")
        config = spec.space.validate_config(dict(item.config), f"{where}.config")
        if spec.candidates and config not in spec.candidates:
            raise ValidationError(f"{where}.config", "is not one of the study's candidates")
        metrics = dict(item.metrics)
        try:
            _check_metrics(spec, metrics, status)
        except ValidationError as error:
            raise ValidationError(f"{where}.{error.field}", str(error).split(": ", 1)[1]) from None
        reason = _text(item.reason, f"{where}.reason", MAX_REASON)
        if REPORTABLE[status] and not reason.strip():
            raise ValidationError(
                f"{where}.reason", f"a {status.value} trial needs a reason", "non-empty text"
            )
        source = _text(item.source, f"{where}.source", MAX_SOURCE)
        return FinishedTrial(
            config, status, metrics, reason, source or "import", _key(spec, config)
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
        study = _study_name(study)
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
            _check_metrics(None, item.metrics, TrialStatus.COMPLETED, f"measurements[{i}].metrics")
        request = _request(
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
            _study_name(study), trial_id, kinds, offset=offset, limit=limit
        )

    def heartbeat(
        self,
        study: str,
        trial_id: int,
        client_id: str | None = None,
        override_holder: bool = False,
    ) -> Trial:
        """Renew the lease of an ACTIVE trial: its worker is still measuring it. Only the
        client it was handed to may (``client_id``, ``override_holder``: ``_holder``).

        Raises:
            StateError: The trial is not ACTIVE (finished, or its lease expired: the message
                says when and which trial re-offers it).
        """
        arrived = self._clock()
        study = _study_name(study)
        holder = _holder(client_id, override_holder)
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

    def list_trials(
        self,
        study: str,
        statuses: Collection[TrialStatus] | None = None,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Trial]:
        """The study's trials in id order (only those in ``statuses`` when given): at most
        ``limit`` of those with an id above ``after``."""
        self._expire(_study_name(study))
        return self.storage.list_trials(study, statuses, after, limit)

    def get_trial(self, study: str, trial_id: int) -> Trial:
        self._expire(_study_name(study))
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
        spec = self._spec(_study_name(study))
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
        spec = self._spec(_study_name(study))
        return pareto_front(spec, self.storage.list_trials(study, [TrialStatus.COMPLETED]))

    def close(self, wait_s: float = 5.0) -> None:
        """Stop the designer (calls waiting for it get an error), give the calls storing
        their suggestions up to ``wait_s`` seconds, then close the storage."""
        self._designer.close()
        end = time.monotonic() + wait_s
        with self._asking:
            while self._queues and (left := end - time.monotonic()) > 0:
                self._asking.wait(left)
        self.storage.close()

    # -- private ------------------------------------------------------------------------
    def _best(self, spec: StudySpec, trials: list[Trial]) -> Best:
        """``best`` of ``trials``: the same for ``GetStudy`` (``tuner studies``) as for
        ``GetBestTrial``; a model fit only when the results changed since the last one."""
        return study_best(self.storage, spec, trials, self.storage.list_measurements(spec.name))

    def _replayed(self, study: str, request: Request) -> list[Trial]:
        """The earlier answer to a request whose record another call stored first."""
        known = self._replay(study, request)
        if known is None:  # the record was there a moment ago; requests are kept a week
            raise StateError(f"request {request.request_id!r} was answered and then forgotten")
        return known

    def _replay(self, study: str, request: Request) -> list[Trial] | None:
        """The trials an earlier request with ``request``'s id answered, or None if there
        was none (``_known``)."""
        known = self._known(study, request)
        return (
            None if known is None else [self.storage.get_trial(study, i) for i in known.answer_ids]
        )

    def _known(self, study: str, request: Request) -> Request | None:
        """The stored record of an earlier request with ``request``'s id, or None.

        Raises:
            ValidationError: The id was used for a different request (``request_id``).
        """
        known = self.storage.find_request(study, request.request_id)
        if known is None:
            return None
        if (known.method, known.digest) != (request.method, request.digest):
            raise ValidationError(
                "request_id",
                f"{request.request_id!r} was already used for a different {known.method} request",
                "a new id for every request; the same id only to retry the same request",
            )
        log.info("study %s: %s %s retried; answered as before", study, request.method,
                 request.request_id)  # fmt: skip
        return known

    def _spec(self, study: str) -> StudySpec:
        """The study's spec (NotFoundError for an unknown study), read from storage once."""
        spec = self._specs.get(study)
        if spec is None:
            spec = self._specs[study] = self.storage.get_study(study).spec
        return spec

    def _lease_end(self) -> float | None:
        return None if self.leases is None else self._clock() + self.leases.ttl_s

    def _expire(self, study: str, now: float | None = None) -> None:
        """Give up the study's trials whose lease ran out before ``now`` (the time the
        request arrived; default: the clock's time) — nothing without leases."""
        if self.leases is None:
            return
        reoffer = self.leases.on_expiry == "reoffer"
        status = TrialStatus.ABANDONED if reoffer else TrialStatus.FAILED
        now = self._clock() if now is None else now
        for trial in self.storage.expire_leases(study, now, status, reoffer):
            again = f"; re-offered as trial {trial.reoffered_as}" if trial.reoffered_as else ""
            fields = {"study": study, "trial": trial.id, "client": trial.client_id}
            log.warning(
                "study %s trial %d: %s%s", study, trial.id, trial.reason, again, extra=fields
            )

    def _lock(self, study: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(study, threading.Lock())


@dataclass
class _Ask:
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
class _Queue:
    """A study's calls waiting for its next designer run."""

    waiting: list[_Ask] = field(default_factory=list)
    running: bool = False


def _answer(ask: _Ask) -> list[Trial]:
    if ask.error is not None:
        raise ask.error
    return ask.trials


def _request(request_id: object, method: str, *asked: object) -> Request | None:
    """The record of a request with an id (None without one): its method and a digest of
    what it asked, so that a retry can be told from a reuse of the id."""
    request_id = _text(request_id, "request_id", MAX_REQUEST_ID)
    if not request_id:
        return None
    text = json.dumps([method, *asked], separators=(",", ":"), default=str)
    return Request(request_id, method, hashlib.sha256(text.encode()).hexdigest())


def _key(spec: StudySpec, config: Config) -> str:
    """The identity storage keeps with a trial of ``config`` (``tuner.config_key``)."""
    return key_text(config_key(spec.space, config))


def _holder(client_id: str | None, override: bool) -> str | None:
    """Whom storage lets finish or renew a trial (``check_holder``): a trial handed to a
    client is that client's (an empty ``client_id`` is nobody's), unless ``override`` (an
    operator's explicit choice, logged). None: anyone (``override``, or an in-process
    caller, which is trusted)."""
    if client_id is None or override:
        return None
    return _text(client_id, "client_id", MAX_CLIENT_ID)


def _study_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValidationError("study", "a study name is required", "the name of an existing study")
    return storable(name, "study")


def _text(value: object, field_: str, limit: int) -> str:
    """``value`` if it is text of at most ``limit`` characters that storage can hold
    (``storable``: no NUL, no unpaired surrogate, the same verdict on every backend)."""
    if not isinstance(value, str):
        raise ValidationError(field_, f"must be text, got {type(value).__name__}")
    if len(value) > limit:
        raise ValidationError(field_, f"is {len(value)} characters long", f"at most {limit}")
    return storable(value, field_)


def _reportable(status: object, field_: str = "status") -> TrialStatus:
    parsed = next((s for s in REPORTABLE if s == status), None)
    if parsed is None:
        raise ValidationError(field_, f"cannot report {status!r}", [s.value for s in REPORTABLE])
    return parsed


def _check_metrics(
    spec: StudySpec | None,
    metrics: Mapping[str, float],
    status: TrialStatus,
    where: str = "metrics",
) -> None:
    """At most ``MAX_METRICS`` metrics, each with a valid name and a finite number; a
    COMPLETED trial has every metric of ``spec``. Metrics the study does not declare are
    stored too (a target's extra readings), within the same bounds."""
    if not isinstance(metrics, Mapping):
        raise ValidationError(where, f"must map names to numbers, got {type(metrics).__name__}")
    if len(metrics) > MAX_METRICS:
        raise ValidationError(where, f"has {len(metrics)} metrics", f"at most {MAX_METRICS}")
    for name, value in metrics.items():
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
            shown = repr(name) if len(str(name)) <= 64 else f"{str(name)[:64]!r}..."
            raise ValidationError(
                f"{where}[{shown}]",
                f"invalid metric name ({len(str(name))} characters)",
                f"a name matching {METRIC_NAME.pattern}",
            )
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValidationError(f"{where}.{name}", f"got {value!r}", "a finite number")
    if spec is not None and status is TrialStatus.COMPLETED:
        missing = [m for m in spec.metric_names if m not in metrics]
        if missing:
            raise ValidationError(
                f"{where}.{missing[0]}",
                "is missing; a COMPLETED trial reports the objective and every constrained metric",
                spec.metric_names,
            )


def _repeats(
    measurements: Sequence[Measurement], metrics: Mapping[str, float], status: TrialStatus
) -> list[Measurement]:
    """The checked repeats of a trial being completed (``complete_trial``)."""
    items = list(measurements)
    if not items:
        return []
    if metrics:
        raise ValidationError(
            "metrics", "give a trial's metrics or its measurements, not both",
            "empty metrics when measurements are given (the metrics are their means)",
        )  # fmt: skip
    if status is not TrialStatus.COMPLETED:
        raise ValidationError("measurements", f"a {status.value} trial has no measurements", "none")
    if len(items) > MAX_MEASUREMENTS:
        raise ValidationError(
            "measurements", f"got {len(items)}", f"1 to {MAX_MEASUREMENTS} measurements"
        )
    for i, item in enumerate(items):
        if not isinstance(item, Measurement):
            raise ValidationError(f"measurements[{i}]", f"got {type(item).__name__}")
        if item.kind != MeasurementKind.REPEAT:
            raise ValidationError(
                f"measurements[{i}].kind",
                f"got {getattr(item.kind, 'value', item.kind)!r} "
                "(controls and confirmations go to AddMeasurements)",
                [MeasurementKind.REPEAT.value],
            )
    names = set(items[0].metrics)
    for i, item in enumerate(items[1:], start=1):
        if set(item.metrics) != names:
            raise ValidationError(
                f"measurements[{i}].metrics",
                f"names {sorted(item.metrics)} differ from the first repeat's",
                sorted(names),
            )
    return items


def _differences(a: StudySpec, b: StudySpec) -> list[str]:
    left, right = a.to_dict(), b.to_dict()
    return [k for k in left if left[k] != right.get(k)] or ["spec"]
