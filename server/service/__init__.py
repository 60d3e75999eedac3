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

The service is a package, one module per concern, each a part of ``TuningService``:
``suggestions`` (SuggestTrials and the shared designer runs), ``results`` (CompleteTrial,
ImportTrials, AddMeasurements), ``progress`` (a trial being measured: Heartbeat,
ReportProgress, ShouldStop), ``reads`` (studies created and read, trials,
measurements, the best, the front), ``core`` (the state they share: storage, locks, specs,
leases, answered requests), ``checks`` (what a request must satisfy, checked once before
storage) and ``queue`` (the calls waiting for a designer run).
"""

from __future__ import annotations

from server.records import ImportedTrial, LeasePolicy, StudyInfo
from server.service.checks import REPORTABLE
from server.service.progress import Progress
from server.service.reads import Reads
from server.service.results import Results
from server.service.suggestions import MAX_SUGGESTIONS, MAX_TAKEN_RETRIES, Suggestions

__all__ = [
    "MAX_SUGGESTIONS",
    "MAX_TAKEN_RETRIES",
    "REPORTABLE",
    "ImportedTrial",
    "LeasePolicy",
    "StudyInfo",
    "TuningService",
]


class TuningService(Suggestions, Results, Progress, Reads):
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
