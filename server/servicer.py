"""The gRPC servicer of ``tuner.v1.TunerService``: a thin shell over ``TuningService``.

Each method converts its request (``server.convert``), calls the service, and converts the
answer back. Nothing else happens here: validation lives in ``convert`` (wire shape) and in
the domain and service (meaning); status codes come from the one table in ``server.errors``,
applied by ``grpc_errors`` to every method. Listings page (``server.paging``), and the two
writes whose replies repeat the request (ImportTrials, AddMeasurements) are refused before
they change anything when the reply would not fit.
"""

from __future__ import annotations

import grpc

from server import convert, paging
from server.api.v1 import tuner_pb2 as pb
from server.api.v1 import tuner_pb2_grpc as pb_grpc
from server.errors import grpc_errors, lenient
from server.observability import Metrics
from server.service import TuningService

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["TunerService"].full_name


def add_to_server(servicer: TunerServicer, server: grpc.Server) -> None:
    """Register ``servicer``'s methods, as the generated ``add_TunerServiceServicer_to_server``
    does, but with request parsers that never raise: bytes that are not the method's
    message reach the method as an ``Undecodable``, answered INVALID_ARGUMENT."""
    described = pb.DESCRIPTOR.services_by_name["TunerService"]
    handlers = {}
    for method in described.methods:
        request = getattr(pb, method.input_type.name)
        reply = getattr(pb, method.output_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=lenient(request.FromString, method.input_type.full_name),
            response_serializer=reply.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(described.full_name, handlers),)
    )


class TunerServicer(pb_grpc.TunerServiceServicer):
    """Serves ``tuner.v1.TunerService`` from a ``TuningService``.

    Args:
        service: The service every call is delegated to. The servicer does not own it:
            whoever built it closes it.
        metrics: Prometheus metrics to record call latencies in (``server.observability``).
    """

    def __init__(self, service: TuningService, metrics: Metrics | None = None) -> None:
        self._service = service
        self.metrics = metrics  # every call's latency goes here (``grpc_errors``)

    @grpc_errors
    def CreateStudy(
        self, request: pb.CreateStudyRequest, context: grpc.ServicerContext
    ) -> pb.CreateStudyResponse:
        info, created = self._service.create_study(convert.spec_from_request(request))
        return pb.CreateStudyResponse(study=convert.study_to_proto(info), created=created)

    @grpc_errors
    def GetStudy(self, request: pb.GetStudyRequest, context: grpc.ServicerContext) -> pb.Study:
        return convert.study_to_proto(self._service.get_study(request.name))

    @grpc_errors
    def ListStudies(
        self, request: pb.ListStudiesRequest, context: grpc.ServicerContext
    ) -> pb.ListStudiesResponse:
        studies, token = paging.fill(
            paging.page_of(request, "ListStudies"),
            lambda offset, n: self._service.list_studies(offset, n),
            convert.study_to_proto,
            lambda offset, _: offset + 1,
            "the studies",
        )
        return pb.ListStudiesResponse(studies=studies, next_page_token=token)

    @grpc_errors
    def SuggestTrials(
        self, request: pb.SuggestTrialsRequest, context: grpc.ServicerContext
    ) -> pb.SuggestTrialsResponse:
        trials = self._service.suggest_trials(
            request.study, request.count, request.client_id, request.request_id
        )
        return pb.SuggestTrialsResponse(
            trials=[convert.trial_to_proto(t, request.study) for t in trials]
        )

    @grpc_errors
    def CompleteTrial(
        self, request: pb.CompleteTrialRequest, context: grpc.ServicerContext
    ) -> pb.Trial:
        trial = self._service.complete_trial(
            request.study,
            request.trial_id,
            metrics=convert.metrics_from_proto(request.metrics),
            status=convert.outcome_from_proto(request.status, "status"),
            reason=request.reason,
            request_id=request.request_id,
            measurements=convert.measurements_from_request(request),
            client_id=request.client_id,
            override_holder=request.override_holder,
        )
        return convert.trial_to_proto(trial, request.study)

    @grpc_errors
    def ImportTrials(
        self, request: pb.ImportTrialsRequest, context: grpc.ServicerContext
    ) -> pb.ImportTrialsResponse:
        paging.check_reply(
            # each stored trial adds its id, study, times, step, repeats and source
            request.ByteSize() + len(request.trials) * (64 + len(request.study.encode())),
            "trials",
            f"{len(request.trials)} trials",
            "fewer trials per request (import them in batches)",
        )
        items = [
            convert.imported_from_proto(t, f"trials[{i}]") for i, t in enumerate(request.trials)
        ]
        trials = self._service.import_trials(request.study, items, request.request_id)
        return pb.ImportTrialsResponse(
            trials=[convert.trial_to_proto(t, request.study) for t in trials]
        )

    @grpc_errors
    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.Trial:
        trial = self._service.heartbeat(
            request.study, request.trial_id, request.client_id, request.override_holder
        )
        return convert.trial_to_proto(trial, request.study)

    @grpc_errors
    def ReportProgress(
        self, request: pb.ReportProgressRequest, context: grpc.ServicerContext
    ) -> pb.StoppingDecision:
        decision = self._service.report_progress(
            request.study, request.trial_id, dict(request.metrics), request.client_id,
            request.window,
        )  # fmt: skip
        return convert.decision_to_proto(decision)

    @grpc_errors
    def ShouldStop(
        self, request: pb.ShouldStopRequest, context: grpc.ServicerContext
    ) -> pb.StoppingDecision:
        return convert.decision_to_proto(self._service.should_stop(request.study, request.trial_id))

    @grpc_errors
    def ListTrials(
        self, request: pb.ListTrialsRequest, context: grpc.ServicerContext
    ) -> pb.ListTrialsResponse:
        statuses = convert.statuses_from_proto(request.statuses, "statuses")
        trials, token = paging.fill(
            paging.page_of(request, "ListTrials", request.study, sorted(request.statuses)),
            lambda after, n: self._service.list_trials(request.study, statuses, after, n),
            lambda trial: convert.trial_to_proto(trial, request.study),
            lambda _, trial: trial.id,
            f"the trials of study {request.study!r}",
        )
        return pb.ListTrialsResponse(trials=trials, next_page_token=token)

    @grpc_errors
    def GetTrial(self, request: pb.GetTrialRequest, context: grpc.ServicerContext) -> pb.Trial:
        trial = self._service.get_trial(request.study, request.trial_id)
        return convert.trial_to_proto(trial, request.study)

    @grpc_errors
    def GetBestTrial(
        self, request: pb.GetBestTrialRequest, context: grpc.ServicerContext
    ) -> pb.Trial:
        trial = self._service.get_best_trial(request.study)
        return convert.trial_to_proto(trial, request.study)

    @grpc_errors
    def GetParetoFront(
        self, request: pb.GetParetoFrontRequest, context: grpc.ServicerContext
    ) -> pb.ListTrialsResponse:
        page = paging.page_of(request, "GetParetoFront", request.study)
        front = self._service.get_pareto_front(request.study)
        trials, token = paging.fill(
            page,
            lambda after, n: [t for t in front if t.id > after][:n],
            lambda trial: convert.trial_to_proto(trial, request.study),
            lambda _, trial: trial.id,
            f"the Pareto front of study {request.study!r}",
        )
        return pb.ListTrialsResponse(trials=trials, next_page_token=token)

    @grpc_errors
    def AddMeasurements(
        self, request: pb.AddMeasurementsRequest, context: grpc.ServicerContext
    ) -> pb.AddMeasurementsResponse:
        paging.check_reply(
            request.ByteSize() + 32 * len(request.measurements),  # + trial_id and at
            "measurements",
            f"{len(request.measurements)} measurements",
            "fewer measurements per request",
        )
        measurements = convert.measurements_from_request(request)
        stored = self._service.add_measurements(
            request.study, request.trial_id, measurements, request.request_id
        )
        return pb.AddMeasurementsResponse(
            measurements=[convert.measurement_to_proto(m) for m in stored]
        )

    @grpc_errors
    def ListMeasurements(
        self, request: pb.ListMeasurementsRequest, context: grpc.ServicerContext
    ) -> pb.ListMeasurementsResponse:
        kinds = convert.measurement_kinds_from_proto(request.kinds, "kinds")
        listing = (request.study, request.trial_id, sorted(request.kinds))
        measurements, token = paging.fill(
            paging.page_of(request, "ListMeasurements", *listing),
            lambda offset, n: self._service.list_measurements(
                request.study, request.trial_id or None, kinds, offset, n
            ),
            convert.measurement_to_proto,
            lambda offset, _: offset + 1,
            f"the measurements of study {request.study!r}",
        )
        return pb.ListMeasurementsResponse(measurements=measurements, next_page_token=token)
