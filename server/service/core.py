"""The state every part of the service shares: storage, the per-study locks and specs, the
designer, leases, and the record of requests answered before.

``ServiceCore`` holds it; the parts that answer requests (``suggestions``, ``results``,
``reads``) are its subclasses and ``server.service.TuningService`` joins them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from server.best import study_best
from server.records import LeasePolicy
from server.service.queue import Queue
from server.storage import Request, Storage
from server.suggest import Designer, InlineDesigner
from tuner.confirmation import Best
from tuner.errors import NotFoundError, StateError, ValidationError
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

if TYPE_CHECKING:
    from tuner.designer import FitCache

log = logging.getLogger("server.service")


class ServiceCore:
    """The state the service's parts share (module doc); the arguments are
    ``TuningService``'s."""

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
        self._queues: dict[str, Queue] = {}  # studies with a designer run in progress

    @property
    def fit_cache(self) -> FitCache:
        """Warm starts of the model fits, made on the first suggestion (the designer's
        import, torch among it, is paid by the first call that needs it)."""
        if self._fit_cache is None:
            from tuner.designer import FitCache

            self._fit_cache = FitCache()
        return self._fit_cache

    def close(self, wait_s: float = 5.0) -> None:
        """Stop the designer (calls waiting for it get an error), give the calls storing
        their suggestions up to ``wait_s`` seconds, then close the storage."""
        self._designer.close()
        end = time.monotonic() + wait_s
        with self._asking:
            while self._queues and (left := end - time.monotonic()) > 0:
                self._asking.wait(left)
        self.storage.close()

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

    def _source(self, study: str) -> tuple[StudySpec, list[Trial]] | None:
        """A transfer source's spec and trials as stored now (``tuner.transfer.read_sources``),
        or None when no such study exists (deleted, or never created)."""
        try:
            spec = self.storage.get_study(study).spec
            return spec, self.storage.list_trials(study)
        except NotFoundError:
            return None

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
