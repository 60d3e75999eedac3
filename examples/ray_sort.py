"""A small measured program for ``tuner ray``: sort a block-partitioned array in memory.

    python3 examples/ray_sort.py --kind quicksort --block-kb 256 --mb 16

Fills ``--mb`` MiB of float64 values (fixed seed), sorts it block by block (``--block-kb``
per block, numpy's ``--kind`` of sort), as the first pass of an external sort does, and
prints one JSON line: ``{"mb_per_s": ..., "seconds": ...}``. Throughput depends on the block
size (cache) and the algorithm, so there is something to tune; each run lives in its own
process and memory, so several can be measured at once.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=("quicksort", "mergesort", "heapsort", "stable"))
    parser.add_argument("--block-kb", type=int, required=True)
    parser.add_argument("--mb", type=float, default=16.0)
    args = parser.parse_args()
    values = np.random.default_rng(0).random(int(args.mb * 2**20 / 8))
    per_block = max(1, args.block_kb * 1024 // 8)
    begun = time.perf_counter()
    for start in range(0, values.size, per_block):
        values[start : start + per_block].sort(kind=args.kind)
    seconds = time.perf_counter() - begun
    print(json.dumps({"mb_per_s": round(args.mb / seconds, 3), "seconds": round(seconds, 4)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
