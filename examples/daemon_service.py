"""A stand-in service for the daemon example: its best setting depends on the load it sees.

One run is one measurement window: it reads the offered load (a number, 1.0 by default) from
``--load-file``, "serves" it for ``--seconds`` with ``--workers`` workers and a
``--cache-mb`` cache, and prints one JSON line::

    {"requests_per_s": 1000.0, "p99_ms": 17.5, "power_w": 23.3, "load": 1.0}

The model: tail latency ``2 + 30 * load / workers + 512 / cache_mb`` ms (more workers and a
bigger cache are faster), power ``10 + 3 * workers + 0.02 * cache_mb`` W. Under a p99 SLO of
20 ms the cheapest setting needs more workers as the load grows, so when the load moves the
setting the daemon applied is either wasteful (load fell) or too slow (load rose). Edit the
load file while ``tuner daemon examples/daemon.toml`` runs to watch it re-tune. ``--log``
appends each run's arguments to a file (the tests count windows with it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="daemon_service.py", description=__doc__)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--cache-mb", type=int, required=True)
    parser.add_argument("--load-file", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--log", type=Path)
    args = parser.parse_args(argv)
    if args.workers < 1 or args.cache_mb < 1:
        print("workers and cache-mb must be >= 1", file=sys.stderr)
        return 3  # the configuration cannot run
    try:
        load = float(args.load_file.read_text().strip() or 1.0)
    except FileNotFoundError:
        load = 1.0
    if args.log is not None:
        with open(args.log, "a", encoding="utf-8") as out:
            out.write(f"{args.workers} {args.cache_mb} {load}\n")
    time.sleep(args.seconds)
    metrics = {
        "requests_per_s": 1000.0 * load,
        "p99_ms": 2.0 + 30.0 * load / args.workers + 512.0 / args.cache_mb,
        "power_w": 10.0 + 3.0 * args.workers + 0.02 * args.cache_mb,
        "load": load,
    }
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
