"""GPU-cluster scheduler parameters as knobs: Tiresias-style 2D-LAS on recorded job traces.

Each trial replays one or more job traces through the simulator of
``targets/scheduler/simulator.py`` under the discretized 2D-LAS policy (Tiresias, NSDI'19)
with the trial's parameters, and reports the schedule's metrics::

    [target]
    kind = "gpusched"
    traces = ["targets/scheduler/traces/gavel_msr_seed0/0e4a51.trace"]
    load = 0.9          # cluster sized so the trace's GPU time fills 90 % of it on average
    restart_s = 30      # a preempted job pays 30 s (checkpoint and restore) when it resumes
    aggregate = "worst" # a ratio over several traces is the largest one (or "geomean")

Knobs (every one has Tiresias's default, so the first trial measures Tiresias as shipped):

* ``num_queues`` (1-5, default 4): priority queues; 1 is FIFO order with backfill.
* ``threshold_1`` (100 - 10^6 GPU-seconds, log, default 3250): the top queue's limit.
* ``ratio_2``, ``ratio_3``, ``ratio_4`` (1.1-100, log): each further limit is the previous
  one times its ratio (defaults 7200/3250 and 18000/7200, so the limits are Tiresias's
  ``[3250, 7200, 18000]``). A limit of a queue a configuration does not have is unused: each
  of ``threshold_1`` and ``ratio_k`` has ``active_when = "num_queues >= k + 1"``, so results
  do not list it as a change.
  Ratios rather than absolute limits keep every configuration valid (limits increase).
* ``starvation`` (0-10, default 0 = off; special value 0): a job that has waited that many
  times its run time is promoted to the top queue (Tiresias's ``solve_starvation``).
* ``interval_s`` (10-600 s, log, default 60): how often starvation is checked.

Trace files: Tiresias CSV (``*.csv``: ``job_id,num_gpu,submit_time,...,duration``) or a
Gavel/Philly TSV (any other name), whose durations come from ``throughputs`` (default:
``gavel_simulation_throughputs.json`` beside the trace or one folder up, else the shipped
one) on ``gpu_type``. Gavel's ten Philly-derived traces and throughputs (MIT) and Tiresias's
traces and cluster specs (Apache-2.0) ship with the target in ``targets/scheduler/traces/``
(``SHIPPED_TRACES``; its README names their sources and licenses).
The cluster has ``gpus`` GPUs, or as many as a Tiresias ``cluster`` spec CSV lists, or,
with ``load``, ``ceil(GPU time of the trace / (its arrival span x load))`` (at least the
largest job), so traces of very different sizes meet a comparably busy cluster. Option
``max_jobs`` keeps a trace's first jobs only.

Metrics, each the mean over the traces: ``avg_jct_s``, ``median_jct_s``, ``p99_jct_s``,
``makespan_s``, ``mean_wait_s``, ``preemptions``; and, as a scale-free objective over
traces of different sizes, ``jct_ratio``, ``p99_ratio`` and ``makespan_ratio``: the metric
divided by its value under Tiresias's default policy (simulated once at setup), so
Tiresias as shipped scores 1.0 and lower is better. Option ``aggregate`` says how a ratio
covers several traces:

* ``"worst"`` (default): the largest ratio over the traces, so a constraint such as
  ``p99_ratio <= 1.1`` holds on every trace, not only on average;
* ``"geomean"``: the geometric mean over the traces, where a trace far over the limit can
  hide behind others under it.

Whichever it is, every trial also reports ``<ratio>_worst`` and ``<ratio>_geomean`` and, per
trace, ``<ratio>__<trace>`` (two underscores; ``<trace>`` is the file name without its
suffix, other characters than letters, digits, ``_``, ``.`` and ``-`` replaced by ``_``, and
``_2``, ``_3``, ... appended to repeated names), e.g. ``p99_ratio__0e4a51``; any of them can
be an objective or a constraint (``jct_ratio_geomean`` as the objective with
``p99_ratio <= 1.1`` as the constraint: the best average, no trace more than 10 % worse at
the tail). A simulator, so nothing on a real system changes and ``restore`` has nothing to undo.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from targets.base import Target, full_config, option_int, option_number
from targets.scheduler.simulator import (
    Job,
    Policy,
    cluster_gpus,
    read_gavel,
    read_tiresias,
    simulate,
)
from tuner.errors import TargetError, ValidationError
from tuner.space import Config, FloatKnob, IntKnob, Knob

MAX_QUEUES = 5
TIRESIAS_THRESHOLDS = (3250.0, 7200.0, 18000.0)  # GPU-seconds (Tiresias's jobs.py)
GPU_TYPES = ("k80", "p100", "v100")
THROUGHPUTS = "gavel_simulation_throughputs.json"
#: The third-party traces shipped with the target (``traces/README.md``: sources, licenses).
SHIPPED_TRACES = Path(__file__).resolve().parent / "traces"
SUMMARY_METRICS = (
    "avg_jct_s",
    "median_jct_s",
    "p99_jct_s",
    "makespan_s",
    "mean_wait_s",
    "preemptions",
)
RATIOS = {"jct_ratio": "avg_jct_s", "p99_ratio": "p99_jct_s", "makespan_ratio": "makespan_s"}
AGGREGATES = ("worst", "geomean")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


@dataclass(frozen=True)
class Trace:
    """A job trace and the cluster it runs on."""

    name: str
    jobs: tuple[Job, ...]
    gpus: int


def knobs() -> tuple[Knob, ...]:
    """The 2D-LAS parameters, defaulting to Tiresias's policy (see the module doc)."""
    t1, t2, t3 = TIRESIAS_THRESHOLDS
    return (
        IntKnob("num_queues", low=1, high=MAX_QUEUES, default=len(TIRESIAS_THRESHOLDS) + 1,
                description="priority queues of the discretized 2D-LAS"),
        FloatKnob("threshold_1", low=100.0, high=1e6, log=True, default=t1, unit="GPU-s",
                  description="attained GPU time at which a job leaves the top queue",
                  active_when="num_queues >= 2"),
        FloatKnob("ratio_2", low=1.1, high=100.0, log=True, default=t2 / t1,
                  description="second queue limit / first", active_when="num_queues >= 3"),
        FloatKnob("ratio_3", low=1.1, high=100.0, log=True, default=t3 / t2,
                  description="third queue limit / second", active_when="num_queues >= 4"),
        FloatKnob("ratio_4", low=1.1, high=100.0, log=True, default=t3 / t2,
                  description="fourth queue limit / third", active_when="num_queues >= 5"),
        FloatKnob("starvation", low=0.0, high=10.0, default=0.0, special_values=(0.0,),
                  description="promote a job waiting this many times its run time (0: off)"),
        FloatKnob("interval_s", low=10.0, high=600.0, log=True, default=60.0, unit="s",
                  description="how often starvation is checked"),
    )  # fmt: skip


def policy_of(config: Config, restart_s: float = 0.0) -> Policy:
    """The 2D-LAS policy of a full configuration of ``knobs()``."""
    queues = int(config["num_queues"])  # type: ignore[arg-type]
    limits: list[float] = []
    value = float(config["threshold_1"])  # type: ignore[arg-type]
    for k in range(1, queues):
        if k > 1:
            value *= float(config[f"ratio_{k}"])  # type: ignore[arg-type]
        limits.append(value)
    return Policy(
        "dlas",
        thresholds=tuple(limits),
        starvation=float(config["starvation"]),  # type: ignore[arg-type]
        interval_s=float(config["interval_s"]),  # type: ignore[arg-type]
        restart_s=restart_s,
    )


def tiresias_policy(restart_s: float = 0.0) -> Policy:
    """Tiresias's default 2D-LAS: limits ``[3250, 7200, 18000]`` GPU-s, no starvation fix."""
    return Policy("dlas", thresholds=TIRESIAS_THRESHOLDS, restart_s=restart_s)


def read_trace(path: Path, throughputs: Path | None = None, gpu_type: str = "v100") -> list[Job]:
    """A Tiresias CSV (``*.csv``) or a Gavel TSV trace; errors name ``target.traces``."""
    try:
        if path.suffix == ".csv":
            return read_tiresias(path)
        table = throughputs or _find_throughputs(path)
        return read_gavel(path, table, gpu_type)
    except (OSError, KeyError, ValueError, IndexError, SyntaxError) as exc:
        raise ValidationError(
            "target.traces", f"cannot read {path}: {type(exc).__name__}: {exc}"
        ) from exc


def cluster_size(jobs: Sequence[Job], load: float) -> int:
    """GPUs that the trace's GPU time fills to ``load`` on average over its arrival span."""
    work = sum(j.gpus * j.duration for j in jobs)
    span = max(j.arrival for j in jobs) - min(j.arrival for j in jobs)
    span = max(span, max(j.duration for j in jobs))  # a burst: at least the longest job
    return max(max(j.gpus for j in jobs), math.ceil(work / (span * load)))


class GpuSchedTarget(Target):
    """Tiresias-style 2D-LAS parameters measured on simulated job traces (module doc).

    Args:
        traces: Trace files to replay, a list (or one path): Tiresias CSV (``*.csv``) or
            Gavel/Philly TSV (any other name). Required.
        throughputs: Path of the Gavel throughputs JSON that gives a TSV trace's durations
            (default: ``gavel_simulation_throughputs.json`` beside the trace or one folder up,
            else the one shipped in ``targets/scheduler/traces/``).
        gpu_type: GPU type whose throughputs give a TSV trace's durations: ``k80``, ``p100`` or
            ``v100``.
        gpus: Number of GPUs in the cluster, in ``[1, 10**6]``. Exactly one of ``gpus``,
            ``cluster`` and ``load`` sizes the cluster.
        cluster: Path of a Tiresias cluster spec CSV whose GPUs make up the cluster.
        load: Average load in ``(0, 4]``: each trace gets ``ceil(GPU time / (arrival span x
            load))`` GPUs, at least its largest job.
        max_jobs: Keep only each trace's first jobs, in ``[1, 10**7]`` (default: every job).
        restart_s: Seconds a preempted job pays (checkpoint and restore) when it resumes, in
            ``[0, 86400]``.
        aggregate: How a ratio metric covers several traces: ``worst`` (the largest ratio) or
            ``geomean`` (the geometric mean).
    """

    kind: ClassVar[str] = "gpusched"

    def __init__(
        self,
        *,
        traces: Any = None,
        throughputs: Any = None,
        gpu_type: Any = "v100",
        gpus: Any = None,
        cluster: Any = None,
        load: Any = None,
        max_jobs: Any = None,
        restart_s: Any = 0.0,
        aggregate: Any = "worst",
    ) -> None:
        if isinstance(traces, str):
            traces = [traces]
        if not isinstance(traces, list) or not traces:
            raise ValidationError("target.traces", f"got {traces!r}", "a list of trace files")
        paths = []
        for i, item in enumerate(traces):
            if not isinstance(item, str) or not Path(item).is_file():
                raise ValidationError(
                    f"target.traces[{i}]",
                    f"{item!r} is not a file",
                    f"a trace file path (shipped traces: {SHIPPED_TRACES})",
                )
            paths.append(Path(item))
        if aggregate not in AGGREGATES:
            raise ValidationError("target.aggregate", f"got {aggregate!r}", AGGREGATES)
        self.aggregate: str = aggregate
        if gpu_type not in GPU_TYPES:
            raise ValidationError("target.gpu_type", f"got {gpu_type!r}", GPU_TYPES)
        table = None
        if throughputs is not None:
            if not isinstance(throughputs, str) or not Path(throughputs).is_file():
                raise ValidationError(
                    "target.throughputs",
                    f"{throughputs!r} is not a file",
                    f"a path to {THROUGHPUTS}",
                )
            table = Path(throughputs)
        sizing = [name for name, v in (("gpus", gpus), ("cluster", cluster), ("load", load))
                  if v is not None]  # fmt: skip
        if len(sizing) != 1:
            raise ValidationError(
                "target.gpus",
                f"give exactly one way to size the cluster (got {sizing or 'none'})",
                ("gpus", "cluster", "load"),
            )
        self.restart_s = option_number("restart_s", restart_s, 0.0, 86400.0)
        limit = None if max_jobs is None else option_int("max_jobs", max_jobs, 1, 10**7)
        fixed: int | None = None
        if gpus is not None:
            fixed = option_int("gpus", gpus, 1, 10**6)
        elif cluster is not None:
            if not isinstance(cluster, str) or not Path(cluster).is_file():
                raise ValidationError(
                    "target.cluster", f"{cluster!r} is not a file", "a Tiresias cluster spec CSV"
                )
            try:
                fixed = cluster_gpus(Path(cluster))
            except (OSError, KeyError, ValueError, StopIteration) as exc:
                raise ValidationError("target.cluster", f"cannot read {cluster}: {exc}") from exc
        share = None if load is None else option_number("load", load, 0.0, 4.0, open_low=True)
        loaded = []
        names = _trace_names(paths)
        for i, path in enumerate(paths):
            jobs = read_trace(path, table, gpu_type)[:limit]
            if not jobs:
                raise ValidationError(f"target.traces[{i}]", f"{path} holds no jobs")
            bad = next((j for j in jobs if j.gpus < 1 or not j.duration > 0), None)
            if bad is not None:  # the simulator would stop the session on it
                raise ValidationError(
                    f"target.traces[{i}]",
                    f"job {bad.id} of {path.name} has {bad.gpus} GPUs and lasts {bad.duration} s",
                    "jobs of at least 1 GPU that last more than 0 s",
                )
            size = fixed if fixed is not None else cluster_size(jobs, share or 1.0)
            widest = max(j.gpus for j in jobs)
            if widest > size:
                raise ValidationError(
                    f"target.traces[{i}]",
                    f"a job of {path.name} needs {widest} GPUs; the cluster has {size}",
                    f"a cluster of at least {widest} GPUs",
                )
            loaded.append(Trace(names[i], tuple(jobs), size))
        self.traces = tuple(loaded)
        self._knobs = knobs()
        self._baseline: list[dict[str, float]] | None = None
        self._policy: Policy | None = None

    def setup(self) -> None:
        self._baseline = [self._run(t, tiresias_policy(self.restart_s)) for t in self.traces]

    def describe_knobs(self) -> tuple[Knob, ...]:
        return self._knobs

    def describe_metrics(self) -> dict[str, str]:
        out = {
            "avg_jct_s": "s, mean job completion time (finish - arrival)",
            "median_jct_s": "s, median job completion time",
            "p99_jct_s": "s, 99th-percentile job completion time",
            "makespan_s": "s, first arrival to last finish",
            "mean_wait_s": "s, mean of JCT minus the job's run time alone",
            "preemptions": "count of preemptions",
        }
        over = "largest over the traces" if self.aggregate == "worst" else "geometric mean"
        for ratio, metric in RATIOS.items():
            out[ratio] = f"{metric} / its value under Tiresias's defaults ({over})"
            out[f"{ratio}_worst"] = f"{ratio}, largest over the traces"
            out[f"{ratio}_geomean"] = f"{ratio}, geometric mean over the traces"
            for trace in self.traces:
                out[f"{ratio}__{trace.name}"] = f"{ratio} on trace {trace.name}"
        return out

    def apply(self, config: Config) -> None:
        self._policy = policy_of(full_config(self.kind, self._knobs, config), self.restart_s)

    def measure(self) -> dict[str, float]:
        if self._policy is None:
            raise TargetError("measure() before apply()")
        if self._baseline is None:
            raise TargetError("measure() before setup(): use the target in a with block")
        runs = [self._run(t, self._policy) for t in self.traces]
        out = {m: sum(r[m] for r in runs) / len(runs) for m in SUMMARY_METRICS}
        for ratio, metric in RATIOS.items():
            ratios = [r[metric] / b[metric] for r, b in zip(runs, self._baseline, strict=True)]
            out[f"{ratio}_worst"] = max(ratios)
            out[f"{ratio}_geomean"] = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
            out[ratio] = out[f"{ratio}_{self.aggregate}"]
            for trace, value in zip(self.traces, ratios, strict=True):
                out[f"{ratio}__{trace.name}"] = value
        return out

    def restore(self) -> None:
        self._policy = None

    @property
    def noiseless(self) -> bool:
        """True: the simulator is deterministic; a policy on a trace schedules the same."""
        return True

    @staticmethod
    def _run(trace: Trace, policy: Policy) -> dict[str, float]:
        return simulate(trace.jobs, trace.gpus, policy).summary()


def _trace_names(paths: Sequence[Path]) -> list[str]:
    """Metric-safe, distinct names for the traces: file stems, repeats numbered from 2."""
    names: list[str] = []
    for path in paths:
        base = _UNSAFE.sub("_", path.stem)[:100]
        name, k = base, 2
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    return names


def _find_throughputs(trace: Path) -> Path:
    """The throughputs beside the trace or one folder up, else the shipped Gavel table."""
    for folder in (trace.parent, trace.parent.parent, SHIPPED_TRACES):
        if (folder / THROUGHPUTS).is_file():
            return folder / THROUGHPUTS
    raise FileNotFoundError(f"no {THROUGHPUTS} beside the trace or one folder up: set throughputs")
