"""A stand-in cloud launcher for ``examples/cloud_launch.toml``: it "provisions" a cluster
of local worker processes and runs a real job on it, so the ``cloud_launch`` target can be
tried on one machine. Replace it with your provider's CLI (aws, gcloud, terraform, ...).

    python3 examples/cloud_local.py up   c4.large 8      # provision 8 nodes
    python3 examples/cloud_local.py run  c4.large 8      # run the job, print its metrics
    python3 examples/cloud_local.py down c4.large        # tear the cluster down

The job counts words in generated text split over the nodes; a node of size ``large`` does
1 unit of work per task, ``xlarge`` 2 and ``2xlarge`` 4 in parallel threads, so bigger
clusters finish sooner up to the machine's cores. The run prints ``{"runtime_s": ...}``
(the target computes ``cost_usd`` from the catalog price); a run on a cluster that was not
provisioned exits 3, which the target reports as a FAILED trial.
"""

from __future__ import annotations

import collections
import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

STATE = Path(tempfile.gettempdir()) / f"tuner-cloud-local-{os.getuid()}"
WORK_WORDS = 1_200_000  # words in the whole job
THREADS = {"large": 1, "xlarge": 2, "2xlarge": 4}


def count(seed_and_words: tuple[int, int]) -> collections.Counter[str]:
    seed, words = seed_and_words
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(5000)]
    return collections.Counter(rng.choice(vocabulary) for _ in range(words))


def main(argv: list[str]) -> int:
    step, instance = argv[0], argv[1]
    marker = STATE / instance
    if step == "up":
        STATE.mkdir(mode=0o700, exist_ok=True)
        marker.write_text(argv[2])
        return 0
    if step == "down":
        marker.unlink(missing_ok=True)
        return 0
    if not marker.exists() or marker.read_text() != argv[2]:
        print(f"no {argv[2]} x {instance} cluster is up", file=sys.stderr)
        return 3
    nodes = int(argv[2])
    workers = nodes * THREADS[instance.split(".")[1]]
    start = time.monotonic()
    tasks = [(i, WORK_WORDS // workers) for i in range(workers)]
    total: collections.Counter[str] = collections.Counter()
    with ProcessPoolExecutor(max_workers=min(workers, os.cpu_count() or 1)) as pool:
        for part in pool.map(count, tasks):
            total.update(part)
    runtime = time.monotonic() - start
    print(f"counted {sum(total.values())} words, {len(total)} distinct")
    print(json.dumps({"runtime_s": round(runtime, 3), "distinct_words": len(total)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
