"""Building and running the gRPC server.

``build_server`` assembles an unstarted ``grpc.Server`` around a ``TuningService``: the
``tuner.v1.TunerService`` servicer, the standard health service (``grpc.health.v1.Health``;
the overall service ``""`` and ``tuner.v1.TunerService`` report SERVING) and server
reflection, so ``grpcurl`` and ``grpc_cli`` can list and call the API without the proto
file. Tests bind port 0 and read the port the kernel picked.

``serve`` is the long-running process: it opens the SQLite database, serves until SIGTERM
or SIGINT, then shuts down gracefully: health turns NOT_SERVING (load balancers stop
routing), in-flight calls get ``grace`` seconds to finish, and only then is the storage
closed. It binds to loopback unless told otherwise; any other address needs TLS and a
bearer token (``server.security``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from server.defaults import DEFAULT_LEASES, DEFAULT_THREADS, default_suggest_workers
from server.observability import Metrics
from server.records import LeasePolicy
from server.security import ServerSecurity
from server.service import TuningService
from server.servicer import SERVICE_NAME, TunerServicer, add_to_server
from server.storage import Storage, open_storage, parse
from server.suggest import WorkerPool
from tuner.errors import StorageError

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 50051
HEALTH_SERVICE_NAME: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

# The health servicer of each server built here, so that shutdown can mark it NOT_SERVING.
_HEALTH: weakref.WeakKeyDictionary[grpc.Server, health.HealthServicer] = weakref.WeakKeyDictionary()


def build_server(
    service: TuningService,
    host: str = DEFAULT_HOST,
    port: int = 0,
    max_workers: int = DEFAULT_THREADS,
    security: ServerSecurity | None = None,
    metrics: Metrics | None = None,
) -> tuple[grpc.Server, int]:
    """An unstarted server for ``service``, bound to ``host:port``.

    Args:
        service: What the servicer delegates to; the caller keeps ownership (and closes it
            after stopping the server).
        host: Interface to bind; loopback by default. IPv6 literals are accepted bare.
        port: TCP port; 0 lets the kernel pick a free one.
        max_workers: Threads serving calls concurrently.
        security: TLS key pair and bearer token (``server.security``); required, both,
            for any host that is not loopback.
        metrics: Prometheus metrics to record every call in (``server.observability``).

    Returns:
        ``(server, port)``: the server (call ``start()``; stop it with ``stop_server``) and
        the port it is bound to.

    Raises:
        OSError: The address cannot be bound (in use, or not an address of this host).
        ValidationError: ``host`` is not loopback and TLS or the token is missing.
    """
    security = security or ServerSecurity()
    security.check_host(host)
    executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tuner-grpc")
    # No SO_REUSEPORT: a second server on a busy port must fail, not share the port.
    server = grpc.server(
        executor, options=[("grpc.so_reuseport", 0)], interceptors=security.interceptors()
    )
    add_to_server(TunerServicer(service, metrics), server)

    health_servicer = health.HealthServicer()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    _HEALTH[server] = health_servicer

    reflection.enable_server_reflection(
        (SERVICE_NAME, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = format_address(host, port)
    try:
        credentials = security.credentials()
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as error:
        executor.shutdown(wait=False)
        raise OSError(f"cannot listen on {address}: address in use or not local") from error
    return server, bound


def stop_server(server: grpc.Server, grace: float | None = 5.0) -> threading.Event:
    """Stop ``server`` gracefully: health NOT_SERVING first, then ``server.stop(grace)``.

    Args:
        server: A server from ``build_server``.
        grace: Seconds in-flight calls may still run; ``None`` aborts them at once.

    Returns:
        The event ``grpc.Server.stop`` returns; it is set once the server has stopped.
    """
    health_servicer = _HEALTH.get(server)
    if health_servicer is not None:
        health_servicer.enter_graceful_shutdown()
    return server.stop(grace)


def serve(
    db: str | os.PathLike[str],
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    max_workers: int = DEFAULT_THREADS,
    suggest_workers: int | None = None,
    waiting: int | None = None,
    grace: float = 5.0,
    stop: threading.Event | None = None,
    leases: LeasePolicy | None = DEFAULT_LEASES,
    security: ServerSecurity | None = None,
    metrics_port: int | None = None,
    port_file: str | os.PathLike[str] | None = None,
    announce: bool = False,
    new_database: bool = False,
) -> None:
    """Serve the studies in the database ``db`` names until told to stop.

    Stops on SIGTERM or SIGINT when called from the main thread (the previous handlers are
    restored on return), or when ``stop`` is set (from another thread or a test). Shutdown
    marks health NOT_SERVING, lets in-flight calls finish for ``grace`` seconds, then closes
    the service and its storage.

    Args:
        db: A storage URL (``server.storage.urls``): a SQLite file (a path, or
            ``sqlite:///PATH``; created if missing) or a PostgreSQL database
            (``postgresql://...``), which several servers may share.
        host: Interface to bind; loopback by default.
        port: TCP port; 0 picks a free one (logged).
        max_workers: Threads serving calls concurrently. SuggestTrials calls may hold three
            quarters of them (``max_waiting``); one more is answered RESOURCE_EXHAUSTED
            with a retry delay.
        suggest_workers: Processes running the designer (``server.suggest.WorkerPool``);
            None: ``default_suggest_workers()``; 0: none, the designer runs in the gRPC
            threads.
        waiting: SuggestTrials calls that may wait for the designer at once (None:
            ``max_waiting(max_workers)``); capped at that.
        grace: Seconds in-flight calls may run after a stop is requested.
        stop: An event that ends serving when set.
        leases: How long a handed-out trial lives without a heartbeat and what becomes of it
            then (``server.service.LeasePolicy``); None: trials never expire.
        security: TLS and bearer token (``server.security``); needed beyond loopback.
        metrics_port: Serve Prometheus metrics on 127.0.0.1 at this port (None: no endpoint).
        port_file: Once serving, write the bound port to this file (replaced atomically, so
            a script waiting for it never reads half a number).
        announce: Once serving, print the bound address (``host:port``) alone on stdout.
        new_database: Start on a SQLite file as it is even where a database was lost
            while in use (``server.storage.rescued``: refused by default, naming the
            rescued copy).

    Raises:
        ValidationError: ``db`` is not a storage URL (the error lists the forms).
        StorageError: The database cannot be opened.
        OSError: The address cannot be bound.
    """
    stop = stop or threading.Event()
    security = security or ServerSecurity()
    security.check_host(host)  # before the database is touched
    storage = open_storage(db, new_database=new_database)
    try:
        storage.check()  # a read-only file or a full disk: refuse to start, saying so
        workers = default_suggest_workers() if suggest_workers is None else suggest_workers
        pool = WorkerPool(workers) if workers else None
        if pool is not None:
            pool.warm(timeout=None)  # the workers import the designer while the server starts
        service = TuningService(
            storage,
            leases=leases,
            designer=pool,
            max_waiting=min(waiting or max_workers, max_waiting(max_workers)),
        )
        log.info(
            "designer: %s", f"{workers} worker processes" if workers else "in the gRPC threads"
        )
        metrics = Metrics(storage) if metrics_port is not None else None
        endpoint = None
        if metrics is not None and metrics_port is not None:
            endpoint, _ = metrics.serve(metrics_port)
            log.info("prometheus metrics on http://127.0.0.1:%d/metrics", metrics_port)
        if leases is not None:
            log.info(
                "trial leases: %.0f s without a heartbeat, then %s",
                leases.ttl_s,
                "re-offered" if leases.on_expiry == "reoffer" else "FAILED",
            )
        try:
            _serve_until(
                service, host, port, max_workers, grace, stop, str(parse(db)), security, metrics,
                port_file, announce,
            )  # fmt: skip
        finally:
            if endpoint is not None:
                endpoint.shutdown()
                endpoint.server_close()
            service.close()
    finally:
        storage.close()
    log.info("tuner server stopped")


def max_waiting(threads: int) -> int:
    """SuggestTrials calls a server with ``threads`` gRPC threads lets wait at once: three
    quarters, so the rest always answer health checks, results and reads."""
    return max(1, threads - max(2, threads // 4))


def format_address(host: str, port: int) -> str:
    """``host:port`` as gRPC wants it, with brackets around IPv6 literals."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


# -- private helpers ---------------------------------------------------------------------


def _serve_until(
    service: TuningService,
    host: str,
    port: int,
    max_workers: int,
    grace: float,
    stop: threading.Event,
    where: str,
    security: ServerSecurity,
    metrics: Metrics | None,
    port_file: str | os.PathLike[str] | None = None,
    announce: bool = False,
) -> None:
    server, bound = build_server(service, host, port, max_workers, security, metrics)
    previous = _install_signal_handlers(stop)
    watch = StorageWatch(service.storage, _HEALTH[server])
    try:
        server.start()
        watch.start()
        if port_file is not None:
            _write_port(Path(port_file), bound)
        if announce:
            print(format_address(host, bound), flush=True)
        log.info(
            "tuner serving %s on %s (database %s; %s, %s)",
            SERVICE_NAME,
            format_address(host, bound),
            where,
            "TLS" if security.tls else "no TLS",
            "bearer token required" if security.token else "no token",
        )
        while not stop.wait(timeout=1.0):
            pass
        log.info("shutting down: health NOT_SERVING, %.1f s grace for in-flight calls", grace)
        watch.stop()
        stop_server(server, grace).wait()
    finally:
        watch.stop()
        _restore_signal_handlers(previous)


def _write_port(path: Path, port: int) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(f"{port}\n", encoding="utf-8")
    os.replace(partial, path)


class StorageWatch:
    """Probes the storage every ``every_s`` seconds (``Storage.check``: the file still the
    one opened, a write committed) and sets the health service to match: NOT_SERVING, with
    the error logged, while the probe fails (a load balancer stops routing; nothing a
    client is told was stored is lost, since every call fails too), SERVING again once it
    passes (a disk that had filled up)."""

    def __init__(
        self, storage: Storage, health_servicer: health.HealthServicer, every_s: float = 2.0
    ) -> None:
        self._storage = storage
        self._health = health_servicer
        self._every_s = every_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuner-storage-watch", daemon=True)
        self.failing: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def probe(self) -> None:
        """One probe, and the health status it calls for."""
        try:
            self._storage.check()
        except StorageError as error:
            if self.failing is None:
                log.error("storage failing, health NOT_SERVING: %s", error)
            self.failing = str(error)
        else:
            if self.failing is not None:
                log.warning("storage works again, health SERVING")
            self.failing = None
        if self._stopped.is_set():
            return  # shutting down: the health is NOT_SERVING for good
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.failing is None
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            self._health.set(name, status)

    def _run(self) -> None:
        while not self._stopped.wait(self._every_s):
            self.probe()


def _install_signal_handlers(stop: threading.Event) -> dict[int, Any]:
    """Make SIGTERM and SIGINT set ``stop``; a no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handle(signum: int, frame: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        stop.set()

    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, handle)
    return previous


def _restore_signal_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
