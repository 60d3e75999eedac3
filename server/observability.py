"""What an operator sees: structured logs and an optional Prometheus endpoint.

``JsonFormatter`` writes one JSON object per log line (``tuner serve --log-format json``):
``time``, ``level``, ``logger``, ``message``, and the fields a call site passes in
``extra`` (``study``, ``trial``, ``rpc``, ``code``, ``ms``), so log pipelines can filter by
study or status code without parsing sentences.

``Metrics`` (``tuner serve --metrics-port 9464``) serves, on 127.0.0.1 unless told
otherwise:

* ``tuner_rpc_duration_seconds{method, code}``: a histogram of every RPC's latency;
* ``tuner_suggest_duration_seconds{study}``: SuggestTrials alone, the call that fits models;
* ``tuner_trials{study, status}``: trials by state, read from storage at scrape time (so
  it is right after a restart and never drifts from the database).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from server.storage import Storage
from tuner.trial import TrialStatus

# Seconds: from a cache hit to a slow BO fit over hundreds of trials.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_FIELDS = ("study", "trial", "rpc", "code", "ms", "client")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the ``extra`` fields of ``_FIELDS`` when present."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in _FIELDS:
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class Metrics:
    """The server's Prometheus metrics, in a registry of their own."""

    def __init__(self, storage: Storage | None = None) -> None:
        self.registry = CollectorRegistry()
        self.rpc = Histogram(
            "tuner_rpc_duration_seconds",
            "Latency of tuner.v1.TunerService calls",
            ("method", "code"),
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.suggest = Histogram(
            "tuner_suggest_duration_seconds",
            "Latency of SuggestTrials (model fits included)",
            ("study",),
            buckets=_BUCKETS,
            registry=self.registry,
        )
        if storage is not None:
            self.registry.register(TrialCounts(storage))

    def observe(self, method: str, code: str, seconds: float, study: str = "") -> None:
        self.rpc.labels(method=method, code=code).observe(seconds)
        if method == "SuggestTrials" and code == "OK":
            self.suggest.labels(study=study).observe(seconds)

    def serve(self, port: int, host: str = "127.0.0.1") -> tuple[Any, threading.Thread]:
        """Start the HTTP endpoint (``/metrics``) on ``host:port``; returns the server and its
        thread (``server.shutdown()`` then ``server.server_close()`` stop it)."""
        return start_http_server(port, addr=host, registry=self.registry)  # type: ignore[no-any-return]


class TrialCounts(Collector):  # type: ignore[misc]
    """``tuner_trials{study, status}``, counted in storage at scrape time."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tuner_trials", "Trials by study and status", labels=("study", "status")
        )
        for study in self.storage.list_studies():
            trials = self.storage.list_trials(study.name)
            for status in TrialStatus:
                count = sum(t.status is status for t in trials)
                family.add_metric([study.name, status.value], count)
        yield family
