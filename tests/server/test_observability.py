"""Observability: Prometheus metrics over HTTP on loopback, and JSON log lines."""

from __future__ import annotations

import json
import logging
import re
import socket
import urllib.request
from pathlib import Path

import pytest

from server.app import build_server, stop_server
from server.client import TunerClient
from server.observability import JsonFormatter, Metrics
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.study import StudySpec

SPEC = StudySpec.from_dict(
    {
        "name": "watched",
        "knobs": [{"name": "x", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5}],
        "objectives": [{"name": "y", "goal": "minimize"}],
        "designer": {"algorithm": "sobol"},
    }
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {labels} in:\n{text}")


def test_metrics_count_calls_latencies_and_trials_by_state(tmp_path: Path) -> None:
    storage = SQLiteStorage(tmp_path / "tuner.db")
    metrics = Metrics(storage)
    port = free_port()
    endpoint, _ = metrics.serve(port)
    server, grpc_port = build_server(TuningService(storage), metrics=metrics)
    server.start()
    try:
        with TunerClient(f"127.0.0.1:{grpc_port}", retry_for=0) as client:
            client.create_study(SPEC)
            trials = client.suggest_trials("watched", 3, client_id="w")
            client.complete_trial("watched", trials[0].id, {"y": 1.0})
            with pytest.raises(Exception):  # noqa: B017 - any error: it must be counted
                client.complete_trial("watched", 99, {"y": 1.0})
        text = scrape(port)
    finally:
        stop_server(server, None).wait()
        endpoint.shutdown()
        endpoint.server_close()
        storage.close()
    assert sample(text, "tuner_trials", study="watched", status="ACTIVE") == 2
    assert sample(text, "tuner_trials", study="watched", status="COMPLETED") == 1
    assert sample(text, "tuner_rpc_duration_seconds_count", method="SuggestTrials", code="OK") == 1
    assert sample(text, "tuner_rpc_duration_seconds_count", method="CompleteTrial",
                  code="NOT_FOUND") == 1  # fmt: skip
    assert sample(text, "tuner_suggest_duration_seconds_count", study="watched") == 1
    assert sample(text, "tuner_suggest_duration_seconds_sum", study="watched") > 0


def test_json_log_lines_carry_the_study_and_the_call(tmp_path: Path) -> None:
    record = logging.LogRecord("server.service", logging.INFO, __file__, 1,
                               "study %s trial %d: %s", ("s", 3, "COMPLETED"), None)  # fmt: skip
    record.study, record.trial = "s", 3
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "study s trial 3: COMPLETED"
    assert (line["level"], line["logger"], line["study"], line["trial"]) == (
        "INFO",
        "server.service",
        "s",
        3,
    )
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", line["time"])


def test_tuner_serve_logs_json_and_serves_metrics(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    metrics_port, port = free_port(), free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "-v", "serve", "--db", str(tmp_path / "t.db"),
             "--port", str(port), "--metrics-port", str(metrics_port), "--log-format", "json"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        with TunerClient(f"127.0.0.1:{port}") as client:
            client.wait_ready(60)
            client.create_study(SPEC)
        deadline = time.monotonic() + 30
        while True:
            try:
                text = scrape(metrics_port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert sample(text, "tuner_trials", study="watched", status="COMPLETED") == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(entry.get("rpc") == "CreateStudy" and entry.get("code") == "OK" for entry in lines)
    assert any("tuner serving" in entry["message"] for entry in lines)
