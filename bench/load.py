"""Load benchmark: many workers suggest and complete trials against one server over loopback.

``python -m bench.load [--clients 64] [--cycles 50] [--studies 8] [--peer optuna]
[--designer sobol,bo] [--bo-cycles 10] [--storage sqlite|postgresql] [--replicas N]
[--pg-url URL] [--think S] [--markdown]``

``ours``: a ``tuner serve`` process (the CLI entry point, its own SQLite file, leases on) and
``--clients`` worker threads in this process, spread round-robin over ``--studies``
studies (so 8 workers share each study by default). Each worker runs ``--cycles`` times:
``SuggestTrials(count=1, client_id, request_id)``, computes a made-up metric from the
configuration, ``CompleteTrial(request_id)``. With ``--think S`` a worker sleeps a random
time (exponential, mean ``S`` seconds, seeded per worker) between the two, as if it
measured the trial, and once more before its first call, as if it were measuring one when
the run began (so the 64 first calls do not all arrive at once: the run starts in the
steady state); without, it asks again at once and the server is saturated (see
``bench.load_offered`` for what that means for latency). A thread asks the standard health service
every 50 ms throughout (each answer timed: the goal is within 1 s, every time).

``--designer`` runs the cycles once per designer, each on a fresh server:

* ``sobol``: the numbers measure the service (gRPC, per-study locking, SQLite with
  ``synchronous=FULL``), not model fitting;
* ``bo``: each study first imports 10 measured trials, so every suggestion is a GP fit and
  an acquisition (``--bo-cycles`` cycles per worker). The designer runs in the server's
  worker processes; concurrent calls on a study share one run; a call the server refuses
  (RESOURCE_EXHAUSTED) waits the delay it names and is sent again, and the table shows the
  refusals and the whole wait (``ask``) beside the answered calls. The yardstick is one
  suggestion on the idle server at the end of the run (one per study, one at a time): the
  time of one fit at that history size. The same before the workers start, untimed, on
  each server, so the workers measure a warm server: a fresh one's designer processes
  import torch first (``warm_up_ms``, reported apart).

``--storage postgresql`` keeps the studies in a fresh PostgreSQL database per run (on
``--pg-url``'s server, or on a throwaway server started for the run); ``--replicas N``
starts N servers on it, worker k talking to replica k mod N, so every study is served by
every replica at once; health is watched on each.

The client speaks the wire contract straight from ``proto/tuner/v1/tuner.proto`` (compiled
at run time into a descriptor pool of its own), as a client in another language would; the
benchmark does not import the service.

``optuna``: the same workers and cycles against Optuna's gRPC storage proxy
(``optuna.storages.run_grpc_proxy_server`` over an SQLite ``RDBStorage``, in its own
process), each worker doing ``study.ask()`` / ``study.tell()`` with a ``QMCSampler`` (Sobol,
sampled in the client), the peer closest to what our server does.

Afterwards the databases are read directly (``sqlite3``) and checked: every completion a
worker saw acknowledged is stored once with its value (0 lost), no extra trials (0
duplicated), no trial handed to two workers, and the configurations of each study are
distinct. Reported per RPC: p50 / p99 latency and throughput (cycles per second), with the
ratio ours / optuna. Results: ``bench/results/load/load.json`` and ``load.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.table import Table

from bench.common import console, load_note, machine_info, show, write_json

ROOT = Path(__file__).resolve().parents[1]
PROTO = ROOT / "proto" / "tuner" / "v1" / "tuner.proto"
OUT = Path(__file__).resolve().parent / "results" / "load"
KNOBS = 4


@dataclass
class WorkerLog:
    """What one worker saw: latencies per RPC and the trials it completed."""

    latency: dict[str, list[float]] = field(default_factory=dict)
    completed: list[tuple[str, int, tuple[Any, ...], float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    asked: list[float] = field(default_factory=list)  # whole waits for a suggestion
    refused: int = 0  # SuggestTrials answered RESOURCE_EXHAUSTED

    def time(self, name: str, call: Callable[..., Any], *args: Any) -> Any:
        begun = time.perf_counter()
        reply = call(*args)
        self.latency.setdefault(name, []).append(time.perf_counter() - begun)
        return reply


def metric(values: tuple[float, ...]) -> float:
    """A made-up smooth objective of a configuration."""
    return float(sum((v - 0.3) ** 2 for v in values))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wire() -> tuple[Any, Any]:
    """The messages, enum values and a stub of ``tuner.v1.TunerService``, built at run time
    from ``proto/`` in a descriptor pool of their own (so they never clash with generated
    code already loaded in the process, as in the test suite)."""
    from grpc_tools import protoc

    folder = Path(tempfile.mkdtemp(prefix="tuner-wire-"))
    out = folder / "tuner.desc"
    include = str(resources.files("grpc_tools") / "_proto")
    argv = ["protoc", f"-I{ROOT / 'proto'}", f"-I{include}", "--include_imports",
            f"--descriptor_set_out={out}", "tuner/v1/tuner.proto"]  # fmt: skip
    if protoc.main(argv) != 0:
        raise RuntimeError(f"protoc could not read {PROTO}")
    pool = descriptor_pool.DescriptorPool()
    for proto_file in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(proto_file)
    shutil.rmtree(folder, ignore_errors=True)
    described = pool.FindFileByName("tuner/v1/tuner.proto")
    pb = SimpleNamespace()
    for name, message in described.message_types_by_name.items():
        setattr(pb, name, message_factory.GetMessageClass(message))
    for enum in described.enum_types_by_name.values():
        for value in enum.values:
            setattr(pb, value.name, value.number)
    service = described.services_by_name["TunerService"]

    class TunerServiceStub:
        def __init__(self, channel: grpc.Channel) -> None:
            for method in service.methods:
                reply = message_factory.GetMessageClass(method.output_type)
                setattr(self, method.name, channel.unary_unary(
                    f"/{service.full_name}/{method.name}",
                    request_serializer=lambda message: message.SerializeToString(),
                    response_deserializer=reply.FromString,
                ))  # fmt: skip

    return pb, SimpleNamespace(TunerServiceStub=TunerServiceStub)


@contextmanager
def process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_serving(target: str, timeout: float = 60.0) -> None:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout, wait_for_ready=True)
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise RuntimeError(f"server at {target} is not SERVING")


# -- ours ----------------------------------------------------------------------------------


def study_spec(pb: Any, name: str, seed: int, designer: str = "sobol") -> Any:
    knobs = [
        pb.Knob(name=f"x{i}", float_range=pb.FloatRange(low=0.0, high=1.0)) for i in range(KNOBS)
    ]
    return pb.StudySpec(
        name=name,
        knobs=knobs,
        objectives=[pb.Objective(name="loss", goal=pb.GOAL_MINIMIZE)],
        designer=pb.DesignerSettings(algorithm=designer, seed=seed, start_with_default=False),
    )


def history(pb: Any, seed: int, count: int = 10) -> list[Any]:
    """``count`` measured random configurations to import (the BO run starts from them)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        values = tuple(float(v) for v in rng.random(KNOBS))
        config = [
            pb.Parameter(name=f"x{i}", value=pb.Value(number=v)) for i, v in enumerate(values)
        ]
        out.append(
            pb.ImportedTrial(
                config=config, status=pb.TRIAL_OUTCOME_COMPLETED, metrics={"loss": metric(values)}
            )
        )
    return out


def retry_delay(error: grpc.RpcError) -> float | None:
    """The delay a RESOURCE_EXHAUSTED answer asks for (its ``RetryInfo``); None for any
    other error, or one without the detail (gRPC's own, such as a message too large)."""
    from google.rpc import error_details_pb2, status_pb2

    if error.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    info = error_details_pb2.RetryInfo()
                    detail.Unpack(info)
                    return info.retry_delay.ToTimedelta().total_seconds()
    return None


def suggest(stub: Any, ask: Any, log: WorkerLog) -> Any:
    """SuggestTrials until answered, waiting as a refusal asks (a client's retry loop)."""
    begun = time.perf_counter()
    while True:
        try:
            reply = log.time("SuggestTrials", stub.SuggestTrials, ask)
        except grpc.RpcError as error:
            delay = retry_delay(error)
            if delay is None:
                raise
            log.refused += 1
            time.sleep(delay * float(np.random.uniform(1.0, 1.5)))
            continue
        log.asked.append(time.perf_counter() - begun)
        return reply


def run_ours(args: argparse.Namespace, work: Path, designer: str = "sobol") -> dict[str, Any]:
    pb, services = wire()
    replicas = getattr(args, "replicas", 1)
    ports = [free_port() for _ in range(replicas)]
    targets = [f"127.0.0.1:{port}" for port in ports]
    target = targets[0]
    postgres = getattr(args, "storage", "sqlite") == "postgresql"
    db = fresh_database(args, designer) if postgres else str(work / f"ours-{designer}.db")
    cycles = args.bo_cycles if designer == "bo" else args.cycles
    tuner = Path(sys.executable).with_name("tuner")
    argv = [str(tuner), "serve", "--db", db]
    argv += ["--max-waiting", str(args.max_waiting)] if getattr(args, "max_waiting", None) else []
    workers = getattr(args, "suggest_workers", None)
    argv += ["--suggest-workers", str(workers)] if workers is not None else []
    with ExitStack() as servers:
        procs = [
            servers.enter_context(
                process([*argv, "--port", str(port)], work / f"ours-{designer}-server-{i}.log")
            )
            for i, port in enumerate(ports)
        ]
        for each in targets:
            wait_serving(each)
        studies = [f"load-{i}" for i in range(args.studies)]
        with grpc.insecure_channel(target) as channel:
            stub = services.TunerServiceStub(channel)
            for i, name in enumerate(studies):
                stub.CreateStudy(pb.CreateStudyRequest(spec=study_spec(pb, name, i, designer)))
                if designer == "bo":
                    stub.ImportTrials(pb.ImportTrialsRequest(study=name, trials=history(pb, i)))
        # steady state: a fresh server's designer workers import torch first (seconds), so
        # one untimed suggestion per study and server before the workers start; what it
        # took is reported apart (``warm_up_ms``)
        warm_up = [
            v for each in targets for v in idle_suggestions(services, pb, each, studies)
        ] if designer == "bo" else []  # fmt: skip
        health = HealthWatch(targets)
        logs = [WorkerLog() for _ in range(args.clients)]
        measuring = float(getattr(args, "think", 0.0))

        def worker(k: int) -> None:
            # worker k talks to replica k mod N; with 8 workers a study, each study is
            # served by every replica at once
            study, log = studies[k % len(studies)], logs[k]
            think = np.random.default_rng(k)
            if measuring:  # as if measuring a trial when the run began: arrivals spread out
                time.sleep(float(think.exponential(measuring)))
            with grpc.insecure_channel(targets[k % len(targets)]) as channel:
                stub = services.TunerServiceStub(channel)
                for _ in range(cycles):
                    ask = pb.SuggestTrialsRequest(
                        study=study, count=1, client_id=f"w{k}", request_id=uuid.uuid4().hex
                    )
                    [trial] = suggest(stub, ask, log).trials
                    values = tuple(p.value.number for p in trial.config)
                    loss = metric(values)
                    if measuring:  # the trial's measurement
                        time.sleep(float(think.exponential(measuring)))
                    tell = pb.CompleteTrialRequest(
                        study=study, trial_id=trial.id, metrics={"loss": loss},
                        status=pb.TRIAL_OUTCOME_COMPLETED, request_id=uuid.uuid4().hex,
                        client_id=f"w{k}",
                    )  # fmt: skip
                    log.time("CompleteTrial", stub.CompleteTrial, tell)
                    log.completed.append((study, trial.id, values, loss))

        wall = run_workers(worker, args.clients, health)
        alive = all(proc.poll() is None for proc in procs)
        idle = idle_suggestions(services, pb, target, studies) if designer == "bo" else []
    rows = stored_rows_postgres(db) if postgres else stored_rows_sqlite(Path(db))
    check = check_ours(rows, logs, args, cycles)
    label = designer if not postgres else f"{designer}, postgresql x{replicas}"
    result = summary(f"ours ({label})", logs, wall, check, health, alive)
    result["designer"] = designer
    result["storage"] = "postgresql" if postgres else "sqlite"
    result["replicas"] = replicas
    result["refused"] = sum(log.refused for log in logs)
    result["asked"] = percentiles([v for log in logs for v in log.asked])
    if idle:
        result["one_fit_ms"] = percentiles(idle)
        result["warm_up_ms"] = percentiles(warm_up)
    return result


def fresh_database(args: argparse.Namespace, designer: str) -> str:
    """A new, empty PostgreSQL database for one run, on ``--pg-url``'s server; its URL."""
    import psycopg

    name = f"tuner_load_{designer}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    parts = urllib.parse.urlsplit(args.pg_url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


def idle_suggestions(services: Any, pb: Any, target: str, studies: list[str]) -> list[float]:
    """One suggestion per study on the otherwise idle server, one at a time (then
    completed, so the check finds every trial finished): the time of one fit at the
    history size the run ended with."""
    out = []
    with grpc.insecure_channel(target) as channel:
        stub = services.TunerServiceStub(channel)
        for study in studies:
            ask = pb.SuggestTrialsRequest(study=study, count=1, client_id="idle")
            begun = time.perf_counter()
            [trial] = stub.SuggestTrials(ask, timeout=600).trials
            out.append(time.perf_counter() - begun)
            values = tuple(p.value.number for p in trial.config)
            tell = pb.CompleteTrialRequest(
                study=study, trial_id=trial.id, metrics={"loss": metric(values)},
                status=pb.TRIAL_OUTCOME_COMPLETED, client_id="idle",
            )  # fmt: skip
            stub.CompleteTrial(tell, timeout=60)
    return out


def percentiles(seconds: list[float]) -> dict[str, float]:
    values = np.array(seconds) * 1000
    if values.size == 0:
        return {}
    return {
        "calls": int(values.size),
        "p50_ms": round(float(np.percentile(values, 50)), 2),
        "p99_ms": round(float(np.percentile(values, 99)), 2),
        "max_ms": round(float(values.max()), 2),
    }


@dataclass
class Stored:
    """What a run's database holds: the workers' trials (study, id, status, client), the
    ``loss`` metric of every trial, every trial's configuration in stored order, and the
    database's own consistency check ("ok" or the problems)."""

    rows: list[tuple[str, int, str, str]]
    values: dict[tuple[str, int], float]
    configs: dict[tuple[str, int], list[Any]]
    integrity: str


_WORKER_TRIALS = (
    "SELECT s.name, t.trial_id, t.status, t.client_id FROM trials t "
    "JOIN studies s ON s.id = t.study_id WHERE {worker}"
)
_LOSSES = (
    "SELECT s.name, m.trial_id, m.value FROM metrics m "
    "JOIN studies s ON s.id = m.study_id WHERE m.name = 'loss'"
)
_CONFIGS = (
    "SELECT s.name, p.trial_id, p.value_json FROM parameters p "
    "JOIN studies s ON s.id = p.study_id ORDER BY p.{order}"
)


def stored_rows_sqlite(db: Path) -> Stored:
    with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as conn:
        return Stored(
            conn.execute(_WORKER_TRIALS.format(worker="t.client_id GLOB 'w[0-9]*'")).fetchall(),
            {(n, t): v for n, t, v in conn.execute(_LOSSES)},
            _configs(conn.execute(_CONFIGS.format(order="rowid"))),
            conn.execute("PRAGMA integrity_check").fetchone()[0],
        )


def stored_rows_postgres(url: str) -> Stored:
    """The same from PostgreSQL; its consistency check: no parameter, metric or event row
    without its trial (the foreign keys forbid them; this reads that they held)."""
    import psycopg

    with psycopg.connect(url) as conn:
        orphans = {
            table: conn.execute(
                f"SELECT count(*) FROM {table} x LEFT JOIN trials t ON "
                "t.study_id = x.study_id AND t.trial_id = x.trial_id WHERE t.trial_id IS NULL"
            ).fetchone()[0]  # type: ignore[index]
            for table in ("parameters", "metrics", "trial_events")
        }
        return Stored(
            [tuple(r) for r in conn.execute(  # type: ignore[misc]
                _WORKER_TRIALS.format(worker="t.client_id ~ '^w[0-9]+$'"))],
            {(n, t): v for n, t, v in conn.execute(_LOSSES)},
            _configs(conn.execute(_CONFIGS.format(order="seq"))),
            "; ".join(f"{n} {t} rows without a trial" for t, n in orphans.items() if n) or "ok",
        )  # fmt: skip


def _configs(rows: Any) -> dict[tuple[str, int], list[Any]]:
    configs: dict[tuple[str, int], list[Any]] = {}
    for name, trial, value in rows:
        configs.setdefault((name, trial), []).append(json.loads(value))
    return configs


def check_ours(
    stored: Stored, logs: list[WorkerLog], args: argparse.Namespace, cycles: int | None = None
) -> dict[str, Any]:
    """What the database holds of the workers' trials (client ids ``w0``, ``w1``...; the
    imported and idle-yardstick trials are not theirs)."""
    rows, values = stored.rows, stored.values
    seen = [(study, trial, loss) for log in logs for study, trial, _, loss in log.completed]
    lost = sum(values.get((study, trial)) != loss for study, trial, loss in seen)
    handed_twice = len(seen) - len({(study, trial) for study, trial, _ in seen})
    by_study: dict[str, list[tuple[float, ...]]] = {}
    for (name, _), config in stored.configs.items():
        by_study.setdefault(name, []).append(tuple(config))
    repeated = sum(len(c) - len(set(c)) for c in by_study.values())
    distinct = sum(len(set(c)) for c in by_study.values())
    return {
        "expected_trials": args.clients * (args.cycles if cycles is None else cycles),
        "stored_trials": len(rows),
        "completed_stored": sum(status == "COMPLETED" for _, _, status, _ in rows),
        "lost": lost,
        "duplicated": len(rows) - len(seen),
        "handed_to_two_workers": handed_twice,
        "repeated_configurations": repeated,
        "distinct_configurations": distinct,
        "integrity_check": stored.integrity,
    }


class HealthWatch:
    """Asks each server's health service every 50 ms while the workers run."""

    def __init__(self, targets: str | list[str]) -> None:
        self.targets = [targets] if isinstance(targets, str) else list(targets)
        self.checks = 0
        self.not_serving: list[str] = []
        self.seconds: list[float] = []  # each answer's latency
        self._count = threading.Lock()  # one watching thread per server
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch, args=(t,), daemon=True) for t in self.targets
        ]

    def _watch(self, target: str) -> None:
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not self._stop.wait(0.05):
                begun = time.perf_counter()
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                    took, problem = time.perf_counter() - begun, None
                    if reply.status != health_pb2.HealthCheckResponse.SERVING:
                        problem = str(reply.status)
                except grpc.RpcError as error:
                    took, problem = None, str(error.code())
                with self._count:
                    self.checks += 1
                    if took is not None:
                        self.seconds.append(took)
                    if problem is not None:
                        self.not_serving.append(problem)

    def __enter__(self) -> HealthWatch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


# -- optuna --------------------------------------------------------------------------------

_OPTUNA_SERVER = """
import sys
from optuna.storages import RDBStorage, run_grpc_proxy_server
run_grpc_proxy_server(RDBStorage(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]))
"""


def run_optuna(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.storages import GrpcStorageProxy

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    port = free_port()
    db = work / "optuna.db"
    argv = [sys.executable, "-c", _OPTUNA_SERVER, f"sqlite:///{db}", str(port)]
    with process(argv, work / "optuna-server.log") as proc:
        wait_port(port)
        storage = GrpcStorageProxy(host="127.0.0.1", port=port)
        studies = [f"load-{i}" for i in range(args.studies)]
        for name in studies:
            optuna.create_study(study_name=name, storage=storage, direction="minimize")
        space = {f"x{i}": FloatDistribution(0.0, 1.0) for i in range(KNOBS)}
        logs = [WorkerLog() for _ in range(args.clients)]

        def worker(k: int) -> None:
            name, log = studies[k % len(studies)], logs[k]
            proxy = GrpcStorageProxy(host="127.0.0.1", port=port)
            sampler = optuna.samplers.QMCSampler(qmc_type="sobol", seed=k % len(studies))
            study = optuna.load_study(study_name=name, storage=proxy, sampler=sampler)
            for _ in range(args.cycles):
                trial = log.time("ask", study.ask, space)
                values = tuple(trial.params[f"x{i}"] for i in range(KNOBS))
                loss = metric(values)
                log.time("tell", study.tell, trial, loss)
                log.completed.append((name, trial.number, values, loss))

        wall = run_workers(worker, args.clients, None)
        alive = proc.poll() is None
    with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT state, COUNT(*) FROM trials GROUP BY state").fetchall()
        stored = conn.execute(
            "SELECT s.study_name, t.number, v.value FROM trials t JOIN studies s "
            "ON s.study_id = t.study_id JOIN trial_values v ON v.trial_id = t.trial_id"
        ).fetchall()
    values = {(name, number): value for name, number, value in stored}
    seen = [(study, trial, loss) for log in logs for study, trial, _, loss in log.completed]
    counts = dict(rows)
    check = {
        "expected_trials": args.clients * args.cycles,
        "stored_trials": sum(counts.values()),
        "completed_stored": counts.get("COMPLETE", 0),
        "lost": sum(values.get((s, t)) != loss for s, t, loss in seen),
        "duplicated": sum(counts.values()) - len(seen),
    }
    return summary("optuna", logs, wall, check, None, alive)


def wait_port(port: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


# -- both ----------------------------------------------------------------------------------


def run_workers(worker: Callable[[int], None], clients: int, health: HealthWatch | None) -> float:
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            worker(k)
        except BaseException as exc:  # reported after the run, with the others
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(clients)]
    begun = time.perf_counter()
    with health if health is not None else _nothing():
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    wall = time.perf_counter() - begun
    if errors:
        raise RuntimeError(f"{len(errors)} workers failed; first: {errors[0]!r}")
    return wall


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def summary(
    method: str,
    logs: list[WorkerLog],
    wall: float,
    check: dict[str, Any],
    health: HealthWatch | None,
    alive: bool,
) -> dict[str, Any]:
    rpcs: dict[str, dict[str, float]] = {}
    for name in logs[0].latency:
        values = np.array([v for log in logs for v in log.latency.get(name, [])]) * 1000
        rpcs[name] = {
            "calls": int(values.size),
            "p50_ms": round(float(np.percentile(values, 50)), 2),
            "p99_ms": round(float(np.percentile(values, 99)), 2),
            "max_ms": round(float(values.max()), 2),
        }
    cycles = sum(len(log.completed) for log in logs)
    out: dict[str, Any] = {
        "method": method,
        "wall_s": round(wall, 2),
        "cycles": cycles,
        "cycles_per_s": round(cycles / wall, 1),
        "rpcs": rpcs,
        "check": check,
        "server_alive_after": alive,
        "latency_samples_ms": {
            name: [round(v * 1000, 3) for log in logs for v in log.latency.get(name, [])]
            for name in logs[0].latency
        },
    }
    if health is not None:
        out["health"] = {
            "checks": health.checks,
            "not_serving": len(health.not_serving),
            "within_1s": sum(v <= 1.0 for v in health.seconds),
            **percentiles(health.seconds),
        }
    return out


def tables(results: list[dict[str, Any]]) -> list[Table]:
    table = Table(title="Load: p50 / p99 latency per call (ms) and throughput")
    for column in ("method", "suggest p50", "suggest p99", "complete p50", "complete p99",
                   "cycles/s", "lost", "duplicated", "serving"):  # fmt: skip
        table.add_column(column, justify="left" if column == "method" else "right")
    for r in results:
        suggest, complete = list(r["rpcs"].values())[:2]
        serving = (
            f"{r['health']['checks'] - r['health']['not_serving']}/{r['health']['checks']}"
            if "health" in r
            else "n/a"
        )
        table.add_row(
            r["method"], f"{suggest['p50_ms']:.1f}", f"{suggest['p99_ms']:.1f}",
            f"{complete['p50_ms']:.1f}", f"{complete['p99_ms']:.1f}", f"{r['cycles_per_s']:.1f}",
            str(r["check"]["lost"]), str(r["check"]["duplicated"]), serving,
        )  # fmt: skip
    ours = next((r for r in results if r.get("designer") == "sobol"), None)
    peer = next((r for r in results if "designer" not in r), None)
    if ours is not None and peer is not None:
        a, b = list(ours["rpcs"].values()), list(peer["rpcs"].values())
        table.add_row(
            "ours / " + peer["method"],
            f"{a[0]['p50_ms'] / b[0]['p50_ms']:.2f}", f"{a[0]['p99_ms'] / b[0]['p99_ms']:.2f}",
            f"{a[1]['p50_ms'] / b[1]['p50_ms']:.2f}", f"{a[1]['p99_ms'] / b[1]['p99_ms']:.2f}",
            f"{ours['cycles_per_s'] / peer['cycles_per_s']:.2f}", "", "", "",
        )  # fmt: skip
    return [table, *[model_table(r) for r in results if r.get("one_fit_ms")]]


def model_table(r: dict[str, Any]) -> Table:
    """The BO run against its goals: health within 1 s every time, CompleteTrial p99 within
    100 ms, SuggestTrials p99 within twice one fit on the idle server."""
    table = Table(title=f"{r['method']}: against the goals (ms)")
    for column in ("suggest p50", "suggest p99", "one fit (idle) p50", "p99 / one fit",
                   "whole ask p99", "refused", "complete p99", "health <= 1 s",
                   "health p99", "warm-up max"):  # fmt: skip
        table.add_column(column, justify="right")
    suggest, complete = r["rpcs"]["SuggestTrials"], r["rpcs"]["CompleteTrial"]
    fit, health = r["one_fit_ms"], r["health"]
    table.add_row(
        f"{suggest['p50_ms']:.0f}", f"{suggest['p99_ms']:.0f}", f"{fit['p50_ms']:.0f}",
        f"{suggest['p99_ms'] / fit['p50_ms']:.2f}", f"{r['asked']['p99_ms']:.0f}",
        str(r["refused"]), f"{complete['p99_ms']:.1f}",
        f"{health['within_1s']}/{health['checks']}", f"{health.get('p99_ms', 0):.1f}",
        f"{r['warm_up_ms'].get('max_ms', 0):.0f}",
    )  # fmt: skip
    return table


def plot(results: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, index, label in ((axes[0], 0, "suggest / ask"), (axes[1], 1, "complete / tell")):
        for r in results:
            name = list(r["latency_samples_ms"])[index]
            values = np.sort(np.array(r["latency_samples_ms"][name]))
            ax.plot(values, np.linspace(0, 1, values.size), label=f"{r['method']} ({name})")
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of calls")
        ax.set_title(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"{results[0]['check']['expected_trials']} suggest/complete cycles, "
        f"{len(results[0]['latency_samples_ms'])} RPC kinds, loopback"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    meta = machine_info()
    results = []
    if args.replicas > 1 and args.storage != "postgresql":
        raise SystemExit("--replicas above 1 needs --storage postgresql (replicas share it)")
    with tempfile.TemporaryDirectory(prefix="tuner-load-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        if args.storage == "postgresql" and not args.pg_url:
            args.pg_url = stack.enter_context(throwaway_postgres())
        runs = [*args.designer, *([args.peer] if args.peer != "none" else [])]
        for method in runs:
            cycles = args.bo_cycles if method == "bo" else args.cycles
            console.print(f"{method}: {args.clients} workers x {cycles} cycles ...")
            ours = method in DESIGNERS
            result = run_ours(args, work, method) if ours else run_optuna(args, work)
            console.print(
                f"{result['method']}: {result['wall_s']} s, {result['cycles_per_s']} cycles/s, "
                f"check {json.dumps(result['check'])}"
            )
            results.append(result)
    for table in tables(results):
        show(table, args.markdown)
    meta["load_note"] = load_note(meta["load_average"])
    meta["settings"] = vars(args) | {"out": str(args.out)}
    slim = [{k: v for k, v in r.items() if k != "latency_samples_ms"} for r in results]
    console.print(f"wrote {write_json('load', {'meta': meta, 'results': slim}, args.out)}")
    console.print(f"wrote {plot(results, args.out / 'load.png')}")
    ok = all(passed(r) for r in results if "designer" in r)
    console.print("checks: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """A private PostgreSQL server for the run (the postgres target's throwaway cluster, on
    a Unix socket); the URL of its ``postgres`` database."""
    from targets.db.postgres.cluster import Cluster
    from targets.db.postgres.tools import find_tools

    parent = Path(tempfile.mkdtemp(prefix="tuner-load-pg-"))
    parent.chmod(0o755)  # the postgres user reaches its socket through it
    cluster = Cluster(find_tools(), parent)
    try:
        cluster.create()
        cluster.write_conf(["max_connections = 200", "fsync = on", "synchronous_commit = on"])
        cluster.start()
        yield f"postgresql://postgres@/postgres?host={cluster.root}&port={cluster.port}"
    finally:
        cluster.destroy()
        shutil.rmtree(parent, ignore_errors=True)


def mean_range(values: list[float], digits: int = 1) -> str:
    """``mean (min-max)`` of a configuration's rounds."""
    mean = sum(values) / len(values)
    return f"{mean:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def checks_cells(runs: list[dict[str, Any]]) -> list[str]:
    """Over some runs: health checks answered within 1 s of all, and lost/duplicated/handed
    out twice, as table cells."""
    health = sum(r["health"]["within_1s"] for r in runs)
    checks = sum(r["health"]["checks"] for r in runs)
    bad = [sum(r["check"][k] for r in runs) for k in ("lost", "duplicated",
           "handed_to_two_workers")]  # fmt: skip
    return [f"{health}/{checks}", "/".join(str(b) for b in bad)]


def passed(ours: dict[str, Any]) -> bool:
    """Nothing lost, duplicated or handed out twice; the server alive and always serving."""
    check = ours["check"]
    ok = check["lost"] == 0 and check["duplicated"] == 0
    ok = ok and check["handed_to_two_workers"] == 0 and ours["server_alive_after"]
    ok = ok and check["repeated_configurations"] == 0
    return ok and ours["health"]["not_serving"] == 0 and check["integrity_check"] == "ok"


DESIGNERS = ("sobol", "random", "bo")


def _designers(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in DESIGNERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: a list of {DESIGNERS}")
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--studies", type=int, default=8)
    parser.add_argument(
        "--designer", type=_designers, default=["sobol", "bo"],
        help="the runs of ours, each on a fresh server: sobol, bo or both (default sobol,bo)",
    )  # fmt: skip
    parser.add_argument(
        "--max-waiting", type=int, help="the server's --max-waiting (default: the server's)"
    )
    parser.add_argument(
        "--suggest-workers", type=int, help="the server's --suggest-workers (default: its own)"
    )
    parser.add_argument(
        "--bo-cycles", type=int, default=10, help="cycles per worker of the bo run (default 10)"
    )
    parser.add_argument(
        "--storage", choices=("sqlite", "postgresql"), default="sqlite",
        help="our servers' database: a SQLite file each run (default) or a PostgreSQL database",
    )  # fmt: skip
    parser.add_argument(
        "--replicas", type=int, default=1,
        help="servers on one PostgreSQL database, worker k on replica k mod N (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--pg-url",
        help="PostgreSQL server to create each run's database on (default: a throwaway one)",
    )
    parser.add_argument(
        "--think", type=float, default=0.0,
        help="mean seconds a worker measures a trial (exponential; default 0: none, each "
        "worker asks again at once, the server saturated)",
    )  # fmt: skip
    parser.add_argument("--peer", choices=("optuna", "none"), default="optuna")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--markdown", action="store_true")
    return parser


if __name__ == "__main__":
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    sys.exit(main())
