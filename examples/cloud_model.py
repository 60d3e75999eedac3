"""Writes ``examples/cloud_runs.csv``: a lookup table of *modelled* runs of three analytics
jobs on the 69 AWS deployments of the ``aws_2017`` catalog, for ``examples/cloud_replay.toml``
and the ``cloud_replay`` target's tests.

    python3 examples/cloud_model.py           # rewrite the table
    python3 examples/cloud_model.py --check   # exit 1 if the table is not what the model gives

Why a model and not measurements: the measured runs the ``cloud_replay`` target was built on
(Scout's 18 workloads, as reconstructed by bbo-arena) carry no license that lets them ship with
this repository (``python -m bench.cloud`` reads them from ``../shared/benchdata`` where it is
present), and runs of ``examples/cloud_local.py`` on one machine say more about that machine's
cores than about a cluster. So the table is made here, from a published performance model, and
says so in its ``source`` column: no row in it was measured.

The model is Ernest's (Venkataraman et al., NSDI'16) for a job on ``m`` machines,
``t = a + b x work / m + c x log2(m) + d x m``: a fixed start-up, the parallel work shared by
the cluster's vCPUs (faster per vCPU on the compute-optimized c4: 1.2x), a tree aggregation,
and an all-to-all shuffle that grows with the node count. Two effects of memory, after
CherryPick (Alipourfard et al., NSDI'17): when the job's cached data exceed half the cluster's
memory, the parallel work slows by the shortfall (spilling to disk); when a vCPU's share of a
node's memory is below what one task needs, the job fails (out of memory). A run that fails
or takes more than an hour is ``completed = 0`` with the hour as its runtime (the convention
of the Scout/bbo-arena table). Costs are nodes x the catalog's hourly price x runtime.
"""

from __future__ import annotations

import csv
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from knobs.cloud import CloudCatalog, load_cloud_catalog

TABLE = Path(__file__).resolve().with_name("cloud_runs.csv")
LIMIT_S = 3600.0  # a run still going after an hour is stopped: not completed
SPEED = {"c4": 1.2, "m4": 1.0, "r4": 1.0}  # relative speed of one vCPU per family
COLUMNS = ("workload", "source", "family", "size", "num_nodes", "price_usd_per_hour_per_node",
           "runtime_s", "cost_usd", "completed")  # fmt: skip


@dataclass(frozen=True)
class Job:
    """One modelled job: Ernest's four terms and its memory needs."""

    name: str
    startup_s: float  # a
    work_vcpu_s: float  # b x work: seconds of one vCPU of speed 1
    aggregate_s: float  # c, per doubling of the node count
    shuffle_s: float  # d, per node
    cached_gib: float  # data the job keeps in memory
    task_gib: float  # memory one task (one vCPU) needs, else out of memory


JOBS = (
    Job("model_wordcount", 30.0, 12_000.0, 10.0, 1.0, 10.0, 0.5),  # CPU-bound
    Job("model_terasort", 60.0, 24_000.0, 10.0, 8.0, 60.0, 1.0),  # shuffle-heavy
    Job("model_pagerank", 45.0, 30_000.0, 20.0, 3.0, 150.0, 2.5),  # in memory: not on c4
)


def runtime_s(job: Job, vcpus: int, memory_gib: float, nodes: int, speed: float) -> float | None:
    """The modelled runtime on ``nodes`` machines of ``vcpus`` and ``memory_gib`` each, or
    None when a task does not fit in a vCPU's share of a node's memory."""
    if memory_gib / vcpus < job.task_gib:
        return None
    spill = max(1.0, job.cached_gib / (0.5 * memory_gib * nodes))
    parallel = job.work_vcpu_s * spill / (nodes * vcpus * speed)
    return job.startup_s + parallel + job.aggregate_s * math.log2(nodes) + job.shuffle_s * nodes


def rows(catalog: CloudCatalog) -> list[dict[str, object]]:
    """One row per job and deployment of the catalog, in the catalog's order."""
    out: list[dict[str, object]] = []
    for job in JOBS:
        for config in catalog.candidates():
            instance = catalog.instance(config)
            nodes = int(config["nodes"])
            speed = SPEED[instance.family]
            modelled = runtime_s(job, instance.vcpus, instance.memory_gib, nodes, speed)
            completed = modelled is not None and modelled <= LIMIT_S
            runtime = round(modelled, 3) if completed and modelled is not None else LIMIT_S
            out.append({
                "workload": job.name, "source": "model (examples/cloud_model.py)",
                "family": instance.family, "size": instance.size, "num_nodes": nodes,
                "price_usd_per_hour_per_node": instance.price_usd_per_hour,
                "runtime_s": runtime,
                "cost_usd": round(catalog.cost_usd(config, runtime), 6),
                "completed": int(completed),
            })  # fmt: skip
    return out


def render(catalog: CloudCatalog) -> str:
    """The table's CSV text."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows(catalog))
    return buffer.getvalue()


def main(argv: list[str]) -> int:
    text = render(load_cloud_catalog("aws_2017"))
    if argv == ["--check"]:
        current = TABLE.read_text(encoding="utf-8") if TABLE.is_file() else ""
        if current != text:
            print(f"{TABLE} is not what the model gives: run python3 {__file__}", file=sys.stderr)
            return 1
        return 0
    if argv:
        print(f"usage: python3 {sys.argv[0]} [--check]", file=sys.stderr)
        return 2
    TABLE.write_text(text, encoding="utf-8")
    print(f"wrote {TABLE}: {text.count(chr(10)) - 1} modelled runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
