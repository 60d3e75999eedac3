"""Defaults of ``tuner serve``, apart from the server's code: the CLI's parser shows them in
its help without importing the server (gRPC's server side, the designer, torch)."""

from __future__ import annotations

import os

from server.records import LeasePolicy

#: gRPC threads. A SuggestTrials call waiting for the designer holds one (waiting, not
#: computing), so there are many, and a quarter of them is kept for every other call. With
#: 64 (48 waiting) the 64 clients of ``bench.load`` were refused 153-196 times per 192
#: cycles, and the refused calls' retries cost a quarter of the throughput and tripled
#: the whole wait's p99 (``bench/README.md``, "Session 50"); 128 admit 96.
DEFAULT_THREADS = 128
# A worker heartbeats a third of a lease apart; 15 minutes of silence means it is gone.
DEFAULT_LEASES = LeasePolicy(ttl_s=900.0, on_expiry="reoffer")


def default_suggest_workers() -> int:
    """Designer processes of a server: one per CPU, at most 4 (each holds torch in memory)."""
    return max(1, min(4, os.cpu_count() or 1))
