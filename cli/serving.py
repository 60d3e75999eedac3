"""``tuner serve``: the gRPC tuning server."""

from __future__ import annotations

import argparse
import logging

from tuner import runtime


def cmd_serve(args: argparse.Namespace) -> int:
    from server.app import serve
    from server.security import ServerSecurity
    from server.service import LeasePolicy

    logging.getLogger().setLevel(logging.DEBUG if args.verbose else logging.INFO)
    runtime.warm_up()  # the first suggestion would pay it (tuner/runtime.py)
    leases = None if args.lease_ttl == 0 else LeasePolicy(args.lease_ttl, args.on_lease_expiry)
    security = ServerSecurity.from_files(args.tls_cert, args.tls_key, args.token_file)
    if args.log_format == "json":
        from server.observability import JsonFormatter

        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    serve(
        args.db, host=args.host, port=args.port, leases=leases, security=security,
        metrics_port=args.metrics_port, suggest_workers=args.suggest_workers,
        max_workers=args.grpc_threads, waiting=args.max_waiting, port_file=args.port_file,
        announce=True, new_database=args.new_database,
    )  # fmt: skip
    return 0
