"""A trace-driven, event-driven simulator of a GPU cluster scheduler (FIFO, LAS, 2D-LAS).

Jobs arrive with a GPU count ``gpus`` and a *service demand*: the seconds they run when they
hold their GPUs (``duration``). The cluster is a number of GPUs (a node/switch spec gives
the total; placement is by count, as in Tiresias's ``count`` placement, with no locality
penalty). Time advances from event to event (arrivals, completions, queue-threshold
crossings, scheduling ticks); between events every running job progresses at rate 1.

Policies:

* ``fifo``: jobs start in arrival order and run to completion; the head of the queue blocks
  the rest until it fits (no backfill), as Tiresias's ``fifo``.
* ``las``: preemptive least-attained-service in two dimensions (Tiresias's ``dlas-gpu`` with
  an unbounded number of queues): *attained service* is GPU time, ``gpus x seconds run``;
  at every scheduling point the jobs are taken in increasing attained service (ties by
  arrival) and each starts or keeps running if its GPUs are free (greedy, so smaller jobs
  behind a big one still run).
* ``dlas``: Tiresias's discretized 2D-LAS: ``num_queues`` priority queues split by
  ``thresholds`` on attained GPU time (queue ``i`` holds jobs below ``thresholds[i]``, the
  last queue the rest); higher queues go first, within a queue jobs go in arrival order
  (FIFO, so a job is not preempted by its own queue's newcomers); a job moves down when it
  crosses its queue's threshold. Starvation: with ``starvation > 0`` a job that has waited
  ``starvation x`` its total run time since it last ran (and at least one interval) is
  promoted to the top queue, from where it moves down again by the service it attains
  after the promotion.

Scheduling points are arrivals, completions, threshold crossings and, when
``interval_s > 0``, every ``interval_s`` seconds (Tiresias re-plans periodically). A job
that is preempted and later resumes pays ``restart_s`` seconds without progress (checkpoint
and restore), counted in its run time but not its progress.

``simulate`` returns per-job results and ``summary`` the metrics: average, median and 99th
percentile job completion time (JCT = finish - arrival), makespan, mean queueing delay
(JCT minus service demand) and the number of preemptions.

Trace readers: ``read_tiresias`` (``job_id,num_gpu,submit_time,...,duration``) and
``read_gavel`` (Philly-derived TSV: job_type, command, num_steps_arg, needs_data_dir,
total_steps, arrival_time_s, scale_factor; the duration is total_steps over the job type's
steps per second on the chosen GPU from ``gavel_simulation_throughputs.json``, alone, at
that scale factor, or linearly extrapolated from the largest measured one below it).
"""

from __future__ import annotations

import ast
import bisect
import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

POLICIES = ("fifo", "las", "dlas")
_EPS = 1e-9  # relative: times reach 1e7 s, where an absolute 1e-9 is below a float's step


def _tol(value: float) -> float:
    """Comparison slack at ``value``: ``_EPS`` relative, at least ``_EPS`` absolute."""
    size = abs(value)
    return _EPS * (size if size > 1.0 else 1.0)  # max(1.0, size), without the call


@dataclass(frozen=True)
class Job:
    id: int
    arrival: float  # s
    gpus: int
    duration: float  # s of running on its GPUs (service demand / gpus)


@dataclass(frozen=True)
class Policy:
    """A scheduling policy and its parameters (see the module doc)."""

    kind: str = "dlas"
    thresholds: tuple[float, ...] = (3250.0, 7200.0, 18000.0)  # GPU-seconds, increasing
    starvation: float = 0.0
    interval_s: float = 0.0
    restart_s: float = 0.0
    # the attained GPU time below which a job is in queue i: thresholds[i] less the slack
    limits: tuple[float, ...] = field(init=False, repr=False, compare=False)
    # the shortest wait before a promotion: one interval (and more than nothing)
    least_wait: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in POLICIES:
            raise ValueError(f"unknown policy {self.kind!r}; expected one of {POLICIES}")
        if any(b <= a for a, b in zip(self.thresholds, self.thresholds[1:], strict=False)):
            raise ValueError(f"thresholds must increase: {self.thresholds}")
        if any(t <= 0 for t in self.thresholds):
            raise ValueError("thresholds must be positive")
        if self.starvation < 0 or self.interval_s < 0 or self.restart_s < 0:
            raise ValueError("starvation, interval_s and restart_s must be >= 0")
        object.__setattr__(self, "limits", tuple(t - _tol(t) for t in self.thresholds))
        object.__setattr__(self, "least_wait", max(self.interval_s, _EPS))


@dataclass
class _State:
    job: Job
    done: float = 0.0  # seconds of progress
    ran: float = 0.0  # seconds holding GPUs (progress plus restart time)
    base: float = 0.0  # attained GPU time at the last promotion
    restart_left: float = 0.0
    running: bool = False
    started: bool = False
    last_stop: float = 0.0  # when it last stopped running (or arrived)
    finish: float | None = None
    preemptions: int = 0
    slack: float = field(init=False)  # progress left below which the job is done

    def __post_init__(self) -> None:
        self.slack = _tol(self.job.duration)

    @property
    def attained(self) -> float:
        return self.job.gpus * self.ran

    @property
    def left(self) -> float:
        return self.job.duration - self.done


@dataclass(frozen=True)
class JobResult:
    id: int
    arrival: float
    gpus: int
    duration: float
    finish: float
    preemptions: int

    @property
    def jct(self) -> float:
        return self.finish - self.arrival


@dataclass
class Simulation:
    jobs: list[JobResult] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        jcts = sorted(j.jct for j in self.jobs)
        if not jcts:
            return {}
        return {
            "avg_jct_s": sum(jcts) / len(jcts),
            "median_jct_s": _percentile(jcts, 50),
            "p99_jct_s": _percentile(jcts, 99),
            "makespan_s": max(j.finish for j in self.jobs) - min(j.arrival for j in self.jobs),
            "mean_wait_s": sum(j.jct - j.duration for j in self.jobs) / len(jcts),
            "preemptions": float(sum(j.preemptions for j in self.jobs)),
            "jobs": float(len(jcts)),
        }


def simulate(jobs: Sequence[Job], gpus: int, policy: Policy) -> Simulation:
    """Run ``jobs`` on ``gpus`` GPUs under ``policy``; every job must fit the cluster."""
    for job in jobs:
        if job.gpus > gpus:
            raise ValueError(f"job {job.id} needs {job.gpus} GPUs; the cluster has {gpus}")
        if job.gpus < 1 or job.duration <= 0:
            raise ValueError(f"job {job.id}: gpus must be >= 1 and duration > 0")
    pending = sorted(jobs, key=lambda j: (j.arrival, j.id))
    states: dict[int, _State] = {}
    active: list[_State] = []  # arrived, not finished
    now = pending[0].arrival if pending else 0.0
    # Periodic ticks only change LAS's plan (attained service moves continuously). Under
    # FIFO nothing happens at a tick, and under 2D-LAS only a starvation promotion can, so
    # the next event there is the first tick at which some waiting job becomes due.
    ticking = policy.kind == "las" and policy.interval_s > 0
    origin = now
    next_tick = now + policy.interval_s if ticking else math.inf
    index = 0
    while index < len(pending) or active:
        while index < len(pending) and pending[index].arrival <= now + _tol(now):
            job = pending[index]
            state = _State(job, last_stop=job.arrival)
            states[job.id] = state
            active.append(state)
            index += 1
        _schedule(active, gpus, policy, now)
        # the next event: arrival, completion, threshold crossing, tick
        horizon = pending[index].arrival if index < len(pending) else math.inf
        horizon = min(horizon, next_tick)
        for state in active:
            if state.running:
                horizon = min(horizon, now + state.restart_left + state.left)
                crossing = _to_threshold(state, policy)
                if crossing is not None:
                    horizon = min(horizon, now + crossing)
        if policy.kind == "dlas" and policy.starvation > 0:
            horizon = min(horizon, _next_promotion(active, policy, origin, now))
        if math.isinf(horizon):
            raise RuntimeError("no event ahead but jobs remain (a job can never start)")
        # every event due by now was handled above; a horizon closer than the comparison
        # slack comes from rounding (now + tiny == now at 1e7 s) and would never advance
        horizon = max(horizon, now + _tol(now))
        step = horizon - now
        for state in active:
            if state.running:
                overhead = min(state.restart_left, step)
                state.restart_left -= overhead
                state.done += step - overhead
                state.ran += step
        now = horizon
        if ticking and now >= next_tick - _tol(now):
            next_tick = now + policy.interval_s
        for state in [s for s in active if s.left <= s.slack]:
            state.finish, state.running = now, False
            active.remove(state)
    out = Simulation()
    for job in jobs:
        s = states[job.id]
        assert s.finish is not None
        out.jobs.append(JobResult(job.id, job.arrival, job.gpus, job.duration, s.finish,
                                  s.preemptions))  # fmt: skip
    return out


def _next_promotion(active: list[_State], policy: Policy, origin: float, now: float) -> float:
    """When the first waiting job becomes due for promotion: at the tick (every
    ``interval_s`` from ``origin``) at or after it has waited ``starvation x`` its run time."""
    due = math.inf
    for state in active:
        if state.running or not state.started or _queue(state, policy) == 0:
            continue
        promotion = _promotion_due(state, policy)
        if promotion < due:
            due = promotion
    if math.isinf(due):
        return due
    # the rounding up to a tick is monotone, so it is applied to the soonest job alone
    if policy.interval_s > 0:
        due = origin + math.ceil((due - origin) / policy.interval_s - _EPS) * policy.interval_s
    # a job due by now was promoted by the _schedule that just ran, so this is ahead
    return max(due, now + _tol(now))


def _promotion_due(state: _State, policy: Policy) -> float:
    """When a waiting job has waited ``starvation x`` its run time (and one interval)."""
    wait = policy.starvation * state.ran
    return state.last_stop + (wait if wait > policy.least_wait else policy.least_wait)


def _queue(state: _State, policy: Policy) -> int:
    """The job's queue: the first ``i`` with attained service (since its last promotion)
    below ``thresholds[i]``, else the last queue (``len(thresholds)``)."""
    return bisect.bisect_right(policy.limits, state.job.gpus * state.ran - state.base)


def _to_threshold(state: _State, policy: Policy) -> float | None:
    """Seconds until a running job crosses its queue's threshold (dlas only)."""
    if policy.kind != "dlas":
        return None
    queue = _queue(state, policy)
    if queue >= len(policy.thresholds):
        return None
    return (policy.thresholds[queue] - (state.attained - state.base)) / state.job.gpus


def _schedule(active: list[_State], gpus: int, policy: Policy, now: float) -> None:
    if policy.kind == "fifo":
        free = gpus - sum(s.job.gpus for s in active if s.running)
        for state in sorted(active, key=lambda s: (s.job.arrival, s.job.id)):
            if state.running:
                continue
            if state.job.gpus > free:
                break  # head-of-line blocking
            _start(state, policy.restart_s)
            free -= state.job.gpus
        return
    if policy.kind == "dlas" and policy.starvation > 0:
        slack = _tol(now)
        for state in active:
            if (
                not state.running
                and state.started
                and now >= _promotion_due(state, policy) - slack
                and _queue(state, policy) > 0
            ):
                state.base = state.attained  # promoted to the top queue
    if policy.kind == "las":
        order = sorted(active, key=lambda s: (s.attained, s.job.arrival, s.job.id))
    else:
        order = sorted(active, key=lambda s: (_queue(s, policy), s.job.arrival, s.job.id))
    free = gpus
    keep: list[_State] = []
    for state in order:
        if state.job.gpus <= free:
            keep.append(state)
            free -= state.job.gpus
    chosen = {id(s) for s in keep}
    for state in active:
        if state.running and id(state) not in chosen:
            state.running = False
            state.preemptions += 1
            state.last_stop = now
            state.restart_left = 0.0
    for state in keep:
        if not state.running:
            _start(state, policy.restart_s)


def _start(state: _State, restart_s: float = 0.0) -> None:
    state.running = True
    if state.started:
        state.restart_left = restart_s
    state.started = True


def _percentile(ordered: list[float], q: float) -> float:
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# -- traces and clusters ----------------------------------------------------------------------
def read_tiresias(path: Path) -> list[Job]:
    """Tiresias's CSV (``job_id,num_gpu,submit_time,iterations,model_name,duration,...``)."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [
        Job(int(r["job_id"]), float(r["submit_time"]), int(r["num_gpu"]), float(r["duration"]))
        for r in rows
    ]


def read_gavel(path: Path, throughputs: Path, gpu: str = "v100") -> list[Job]:
    """A Gavel/Philly TSV trace with durations from the throughput table (module doc)."""
    table = json.loads(throughputs.read_text(encoding="utf-8"))[gpu]
    rates: dict[str, dict[int, float]] = {}
    for key, value in table.items():
        name, scale = ast.literal_eval(key)
        rates.setdefault(name, {})[int(scale)] = float(value["null"])
    jobs = []
    with open(path, encoding="utf-8") as handle:
        for i, line in enumerate(handle):
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 7:
                continue
            name, steps, arrival, scale = parts[0], float(parts[4]), float(parts[5]), int(parts[6])
            known = rates[name]
            below = max(k for k in known if k <= scale)
            rate = known[below] * scale / below
            jobs.append(Job(i, arrival, scale, steps / rate))
    return jobs


def cluster_gpus(path: Path) -> int:
    """GPUs in a Tiresias cluster spec CSV (switches x nodes per switch x GPUs per node)."""
    with open(path, newline="", encoding="utf-8") as handle:
        row = next(csv.DictReader(handle))
    return int(row["num_switch"]) * int(row["num_node_p_switch"]) * int(row["num_gpu_p_node"])
