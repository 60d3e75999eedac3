"""A small Python client for ``tuner.v1.TunerService``, speaking in domain types.

``TunerClient`` mirrors ``TuningService`` method for method, so code written against the
service runs unchanged against a remote server: it takes and returns ``StudySpec``,
``StudyInfo`` and ``Trial``, and raises the same ``tuner.errors`` classes, rebuilt from the
status code by the inverse of the server's error table (``server.errors.error_from_rpc``).
Failures that are not the server's verdict (it cannot be reached, a deadline passed) stay
``grpc.RpcError``.

Calls that find the server UNAVAILABLE (restarting, not up yet, its disk briefly locked) are
retried with exponential backoff and jitter until ``retry_for`` seconds have passed, each
attempt with the deadline ``timeout``. A server too busy to take a call (RESOURCE_EXHAUSTED
from ``OverloadedError``: every designer slot taken) did nothing with it: it is sent again
after the delay the server asked for, also within ``retry_for``. Retrying a write is safe: every
``suggest_trials``, ``complete_trial`` and ``import_trials`` carries a fresh request id, the
same on each retry, and the server answers a retried request as it answered the first one.
``add_measurements`` has no request id (AddMeasurements would store a retried request's
measurements twice), so it is never retried: it waits up to ``timeout`` for a server that
is not up yet (nothing has been sent then) and raises an UNAVAILABLE as it comes.

Listings (``list_studies``, ``list_trials``, ``list_measurements``, ``get_pareto_front``)
follow the server's pages (``server.paging``) and return the whole list, however large the
study; a server from before paging answers in one reply, which ends the loop.

Example::

    with TunerClient("127.0.0.1:50051") as client:
        client.wait_ready(10)
        info, created = client.create_study(spec)
        (trial,) = client.suggest_trials(spec.name, 1, client_id="worker-1")
        client.complete_trial(spec.name, trial.id, {"tps": 1234.0})
"""

from __future__ import annotations

import ipaddress
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server import convert
from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.errors import error_from_rpc
from server.records import ImportedTrial, StudyInfo
from tuner.errors import OverloadedError, ValidationError
from tuner.stopping import Decision
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, Trial, TrialStatus

_Reply = TypeVar("_Reply")
_FIRST_PAUSE_S = 0.1
_MAX_PAUSE_S = 5.0
#: Items asked for per page: the most a server gives (``server.paging.MAX_PAGE_SIZE``);
#: it ends a page earlier where the reply would grow past what a client accepts.
_PAGE_SIZE = 10_000

log = logging.getLogger(__name__)

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["TunerService"].full_name


class TunerClient:
    """A connection to a tuner server.

    Args:
        target: The server's address, ``host:port`` (any gRPC target string), or several
            replicas' (servers sharing one PostgreSQL database), comma-separated IP
            addresses ``10.0.0.5:50051,10.0.0.6:50051``: calls are spread over those that
            are up (gRPC's ``round_robin``), so one going away costs only the calls in
            flight to it.
        timeout: Deadline in seconds of each attempt of a call, as given.
        retry_for: Seconds during which an UNAVAILABLE or refused call is tried again (0:
            never); a new attempt starts only within them.
        tls_ca: PEM certificate(s) to trust for a server started with ``--tls-cert`` (the
            server's own certificate when it is self-signed); None: plain text.
        token: Bearer token for a server started with ``--token-file``.
    """

    def __init__(
        self,
        target: str,
        timeout: float = 30.0,
        retry_for: float = 60.0,
        tls_ca: bytes | None = None,
        token: str | None = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.retry_for = retry_for
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        channel_target, options = _channel_target(target)
        if tls_ca is None:
            self._channel = grpc.insecure_channel(channel_target, options)
        else:
            credentials = grpc.ssl_channel_credentials(root_certificates=tls_ca)
            self._channel = grpc.secure_channel(channel_target, credentials, options)
        self._stub = pb_grpc.TunerServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        # (study, trial id) -> the client id this client got the trial with
        self._holders: dict[tuple[str, int], str] = {}
        self._holders_guard = threading.Lock()

    # -- connection --------------------------------------------------------------------
    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the server's health service reports the tuner SERVING.

        Raises:
            TimeoutError: The server did not report SERVING within ``timeout`` seconds.
        """
        request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        try:
            reply = self._health.Check(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as error:
            cause = error
            if error.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                cause = self._connect_error(request) or error
            raise TimeoutError(
                f"tuner server at {self.target} not ready after {timeout:g} s: {_describe(cause)}"
            ) from None
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            raise TimeoutError(f"tuner server at {self.target} is {status}")

    def _connect_error(self, request: health_pb2.HealthCheckRequest) -> grpc.RpcError | None:
        """Why the channel does not connect ("Connection refused", a name that does not
        resolve): the error of one check that does not wait for a connection."""
        try:
            self._health.Check(request, timeout=1.0)
        except grpc.RpcError as error:
            return error
        return None

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> TunerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- studies -----------------------------------------------------------------------
    def create_study(self, spec: StudySpec) -> tuple[StudyInfo, bool]:
        """Create ``spec``'s study, or load it when an identical one exists.

        Returns:
            ``(info, created)``; ``created`` is False when the study already existed.
        """
        request = pb.CreateStudyRequest(spec=convert.spec_to_proto(spec))
        reply = self._call(self._stub.CreateStudy, request)
        return convert.study_from_proto(reply.study), reply.created

    def get_study(self, name: str) -> StudyInfo:
        """The study named ``name`` (``NotFoundError`` if none)."""
        reply = self._call(self._stub.GetStudy, pb.GetStudyRequest(name=name))
        return convert.study_from_proto(reply)

    def list_studies(self) -> list[StudyInfo]:
        """Every study on the server."""
        pages = self._pages(self._stub.ListStudies, pb.ListStudiesRequest(), "studies")
        return [convert.study_from_proto(s) for s in pages]

    # -- trials ------------------------------------------------------------------------
    def suggest_trials(self, study: str, count: int, client_id: str = "") -> list[Trial]:
        """Up to ``count`` trials for ``client_id``: its ACTIVE trials first, then new ones.

        An empty ``client_id`` is an anonymous worker: every call gets new trials.
        """
        request = pb.SuggestTrialsRequest(
            study=study, count=count, client_id=client_id, request_id=_request_id()
        )
        reply = self._call(self._stub.SuggestTrials, request)
        trials = [convert.trial_from_proto(t) for t in reply.trials]
        with self._holders_guard:
            self._holders.update({(study, t.id): t.client_id for t in trials})
        return trials

    def complete_trial(
        self,
        study: str,
        trial_id: int,
        metrics: Mapping[str, float] | None = None,
        status: TrialStatus = TrialStatus.COMPLETED,
        reason: str = "",
        measurements: Sequence[Measurement] = (),
        client_id: str | None = None,
        override_holder: bool = False,
    ) -> Trial:
        """Finish an ACTIVE trial: COMPLETED with metrics, any other final status with a reason.

        ``client_id`` is the one the trial was suggested to: a trial handed to a client is
        finished by that client only (``PermissionDeniedError`` otherwise), unless an
        operator sets ``override_holder``. None: the client id this ``TunerClient`` got the
        trial with (none, for a trial it did not get).

        A trial measured several times passes its repeats (kind REPEAT) in ``measurements``
        and no ``metrics``: the trial's metrics become their means, its ``spread`` their
        standard deviations and its ``repeats`` their number.

        Raises:
            ValidationError: ``status`` is PENDING or ACTIVE, or a measurement's kind is not
                a ``MeasurementKind`` (checked before any call), or the server rejected the
                metrics, the measurements (``measurements[2].metrics.tps``) or the reason.
            StateError: The trial is already finished.
        """
        request = pb.CompleteTrialRequest(
            study=study,
            trial_id=trial_id,
            metrics=dict(metrics or {}),
            status=convert.outcome_to_proto(status),
            reason=reason,
            request_id=_request_id(),
            measurements=_measurements_to_proto(measurements),
            client_id=self._holder(study, trial_id, client_id),
            override_holder=override_holder,
        )
        return convert.trial_from_proto(self._call(self._stub.CompleteTrial, request))

    def import_trials(self, study: str, trials: Sequence[ImportedTrial]) -> list[Trial]:
        """Add configurations measured elsewhere (a warm start); all or nothing.

        Raises:
            ValidationError: A bad trial (the field names it: ``trials[3].config.x``).
        """
        request = pb.ImportTrialsRequest(
            study=study,
            trials=[convert.imported_to_proto(t) for t in trials],
            request_id=_request_id(),
        )
        reply = self._call(self._stub.ImportTrials, request)
        return [convert.trial_from_proto(t) for t in reply.trials]

    def add_measurements(
        self, study: str, trial_id: int, measurements: Sequence[Measurement]
    ) -> list[Measurement]:
        """Store further measurements (CONTROL or CONFIRM) of a finished trial's configuration.

        Retried like ``complete_trial``: the request carries an id, so a retry after a lost
        reply gets the measurements the first attempt stored and stores nothing twice.

        Returns:
            The measurements as stored, with ``trial_id`` and ``at`` set.

        Raises:
            NotFoundError: Unknown study or trial.
            StateError: The trial is not finished.
            ValidationError: No measurements, a REPEAT, or a metric that is not finite
                (the field names it: ``measurements[2].metrics.tps``).
        """
        request = pb.AddMeasurementsRequest(
            study=study,
            trial_id=trial_id,
            measurements=_measurements_to_proto(measurements),
            request_id=_request_id(),
        )
        reply = self._call(self._stub.AddMeasurements, request)
        return [
            convert.measurement_from_proto(m, f"measurements[{i}]")
            for i, m in enumerate(reply.measurements)
        ]

    def list_measurements(
        self,
        study: str,
        trial_id: int | None = None,
        kinds: Collection[MeasurementKind] | None = None,
    ) -> list[Measurement]:
        """The study's measurements in the order they were stored; only one trial's, or only
        some kinds, when given."""
        request = pb.ListMeasurementsRequest(
            study=study,
            trial_id=trial_id or 0,
            kinds=[convert.measurement_kind_to_proto(k, "kinds") for k in kinds or ()],
        )
        pages = self._pages(self._stub.ListMeasurements, request, "measurements")
        return [
            convert.measurement_from_proto(m, f"measurements[{i}]") for i, m in enumerate(pages)
        ]

    def heartbeat(
        self,
        study: str,
        trial_id: int,
        client_id: str | None = None,
        override_holder: bool = False,
    ) -> Trial:
        """Renew the lease of an ACTIVE trial; the reply carries its new ``lease_expires_at``.
        ``client_id`` as in ``complete_trial``.

        Raises:
            StateError: The trial is finished or its lease has already expired.
            PermissionDeniedError: The trial was handed to another client.
        """
        request = pb.HeartbeatRequest(
            study=study,
            trial_id=trial_id,
            client_id=self._holder(study, trial_id, client_id),
            override_holder=override_holder,
        )
        return convert.trial_from_proto(self._call(self._stub.Heartbeat, request))

    def report_progress(
        self,
        study: str,
        trial_id: int,
        metrics: Mapping[str, float],
        client_id: str | None = None,
        window: int = 0,
    ) -> Decision:
        """Report one window of an ACTIVE trial's measurement; the answer says whether to
        stop measuring now (then complete the trial EARLY_STOPPED with its reason).
        ``client_id`` as in ``complete_trial``; a report renews the trial's lease. With the
        window's number (from 1) a retry after a lost reply stores nothing twice; 0 sends
        it as the next window.

        Raises:
            StateError: The trial is not ACTIVE.
            PermissionDeniedError: The trial was handed to another client.
            ValidationError: A metric name or value that is not allowed.
        """
        request = pb.ReportProgressRequest(
            study=study,
            trial_id=trial_id,
            metrics=dict(metrics),
            client_id=self._holder(study, trial_id, client_id) or "",
            window=window,
        )
        return convert.decision_from_proto(self._call(self._stub.ReportProgress, request))

    def should_stop(self, study: str, trial_id: int) -> Decision:
        """Whether an ACTIVE trial should stop, from the windows it reported so far."""
        request = pb.ShouldStopRequest(study=study, trial_id=trial_id)
        return convert.decision_from_proto(self._call(self._stub.ShouldStop, request))

    def list_trials(
        self, study: str, statuses: Collection[TrialStatus] | None = None
    ) -> list[Trial]:
        """The study's trials in id order, only those in ``statuses`` when given."""
        request = pb.ListTrialsRequest(
            study=study, statuses=[convert.status_to_proto(s) for s in statuses or ()]
        )
        pages = self._pages(self._stub.ListTrials, request, "trials")
        return [convert.trial_from_proto(t) for t in pages]

    def get_trial(self, study: str, trial_id: int) -> Trial:
        """One trial (``NotFoundError`` if the study or the trial does not exist)."""
        request = pb.GetTrialRequest(study=study, trial_id=trial_id)
        return convert.trial_from_proto(self._call(self._stub.GetTrial, request))

    def get_best_trial(self, study: str) -> Trial:
        """The best feasible trial (``NotFoundError`` while there is none)."""
        request = pb.GetBestTrialRequest(study=study)
        return convert.trial_from_proto(self._call(self._stub.GetBestTrial, request))

    def get_pareto_front(self, study: str) -> list[Trial]:
        """The feasible trials no other feasible trial dominates, in id order."""
        request = pb.GetParetoFrontRequest(study=study)
        pages = self._pages(self._stub.GetParetoFront, request, "trials")
        return [convert.trial_from_proto(t) for t in pages]

    # -- private -----------------------------------------------------------------------
    def _holder(self, study: str, trial_id: int, given: str | None) -> str:
        if given is not None:
            return given
        with self._holders_guard:
            return self._holders.get((study, trial_id), "")

    def _pages(self, method: Callable[..., Any], request: Any, field: str) -> Iterator[Any]:
        """The items of every page of a listing, in order: ``request`` is sent with
        ``page_size`` and then with each reply's ``next_page_token`` until one has none
        (each call retried as ``_call`` retries)."""
        request.page_size = _PAGE_SIZE
        while True:
            reply = self._call(method, request)
            yield from getattr(reply, field)
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    def _call(self, method: Callable[..., _Reply], request: Any) -> _Reply:
        """Call ``method``; for ``retry_for`` seconds, try again when the server is UNAVAILABLE
        or answers that it is too busy (``OverloadedError``: nothing was done; after the
        delay the server asked for). Every write is idempotent (CreateStudy, Heartbeat) or
        carries a request id, so a retry after a lost reply gets the first attempt's answer
        and changes nothing twice.

        Every attempt has the deadline ``timeout``, as given: ``retry_for`` only bounds when
        a new attempt may start.
        """
        give_up = time.monotonic() + self.retry_for
        pause = _FIRST_PAUSE_S
        while True:
            try:
                return method(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as error:
                left = give_up - time.monotonic()
                domain = error_from_rpc(error)
                if isinstance(domain, OverloadedError) and left > 0:
                    wait = min(domain.retry_after_s * random.uniform(1.0, 1.5), left)
                    log.info("tuner server %s is busy; retrying in %.1f s", self.target, wait)
                    time.sleep(wait)
                    continue
                if error.code() is grpc.StatusCode.UNAVAILABLE and left > 0:
                    wait = min(pause * random.uniform(0.5, 1.0), left)
                    log.warning("tuner server %s unavailable (%s); retrying in %.1f s",
                                self.target, _describe(error), wait)  # fmt: skip
                    time.sleep(wait)
                    pause = min(2 * pause, _MAX_PAUSE_S)
                    continue
                if domain is error:
                    raise
                raise domain from error


def _channel_target(target: str) -> tuple[str, list[tuple[str, Any]]]:
    """The gRPC target and channel options for ``target``: a comma-separated list of
    replicas becomes an ``ipv4:``/``ipv6:`` list balanced round robin."""
    if "," not in target or ":/" in target or target.startswith(("ipv4:", "ipv6:")):
        balanced = "," in target
        return target, [("grpc.lb_policy_name", "round_robin")] if balanced else []
    parts = [part.strip() for part in target.split(",") if part.strip()]
    for part in parts:
        host = part.rsplit(":", 1)[0].strip("[]")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValidationError(
                "target",
                f"replica {part!r} is not an IP address and port",
                "comma-separated IP:PORT (e.g. 10.0.0.5:50051,10.0.0.6:50051), or one DNS "
                "name for all replicas (dns:///tuner.internal:50051)",
            ) from None
    scheme = "ipv6" if all(part.startswith("[") for part in parts) else "ipv4"
    return f"{scheme}:{','.join(parts)}", [("grpc.lb_policy_name", "round_robin")]


def _request_id() -> str:
    return uuid.uuid4().hex


def _measurements_to_proto(measurements: Sequence[Measurement]) -> list[pb.Measurement]:
    return [
        convert.measurement_to_proto(m, f"measurements[{i}]") for i, m in enumerate(measurements)
    ]


def _describe(error: grpc.RpcError) -> str:
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    if callable(code) and callable(details):
        return f"{code().name}: {details()}"
    return str(error)
