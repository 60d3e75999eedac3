"""The scheduler simulator against schedules computed by hand on tiny traces."""

from __future__ import annotations

import random

import pytest

from targets.scheduler.gpusched import SHIPPED_TRACES
from targets.scheduler.simulator import (
    Job,
    Policy,
    cluster_gpus,
    read_gavel,
    read_tiresias,
    simulate,
)

TRACES = SHIPPED_TRACES  # the published traces shipped with the target


def finishes(jobs: list[Job], gpus: int, policy: Policy) -> dict[int, float]:
    return {j.id: round(j.finish, 6) for j in simulate(jobs, gpus, policy).jobs}


A_B = [Job(0, 0.0, 1, 10.0), Job(1, 1.0, 1, 2.0)]  # a long job, then a short one


def test_fifo_runs_jobs_to_completion_in_arrival_order() -> None:
    assert finishes(A_B, 1, Policy("fifo")) == {0: 10.0, 1: 12.0}
    result = simulate(A_B, 1, Policy("fifo")).summary()
    assert result["avg_jct_s"] == pytest.approx((10 + 11) / 2)
    assert result["mean_wait_s"] == pytest.approx((0 + 9) / 2)
    assert result["makespan_s"] == 12.0 and result["preemptions"] == 0


def test_fifo_head_of_line_blocks_smaller_jobs() -> None:
    jobs = [Job(0, 0.0, 2, 4.0), Job(1, 0.5, 2, 1.0), Job(2, 0.5, 1, 1.0)]
    # job 1 waits for both GPUs; job 2 would fit on the third GPU... there is none: 2 GPUs
    assert finishes(jobs, 2, Policy("fifo")) == {0: 4.0, 1: 5.0, 2: 6.0}
    # with 3 GPUs job 2 still waits behind job 1 (no backfill)
    assert finishes(jobs, 3, Policy("fifo")) == {0: 4.0, 1: 5.0, 2: 5.0}


def test_las_preempts_for_the_job_with_less_attained_gpu_time() -> None:
    assert finishes(A_B, 1, Policy("las")) == {0: 12.0, 1: 3.0}
    assert simulate(A_B, 1, Policy("las")).summary()["preemptions"] == 1


def test_las_counts_gpu_time_not_wall_time() -> None:
    # at t=2 the 4-GPU job has 8 GPU-s, the 1-GPU job arriving at t=1 has 0: it goes first
    jobs = [Job(0, 0.0, 4, 5.0), Job(1, 1.0, 4, 1.0)]
    assert finishes(jobs, 4, Policy("las")) == {0: 6.0, 1: 2.0}


def test_dlas_keeps_fifo_within_a_queue_and_demotes_at_the_threshold() -> None:
    # threshold 5 GPU-s: A stays ahead of B until it has run 5 s, then B (queue 0) runs
    policy = Policy("dlas", thresholds=(5.0,))
    assert finishes(A_B, 1, policy) == {0: 12.0, 1: 7.0}
    # a threshold above A's demand: plain FIFO
    assert finishes(A_B, 1, Policy("dlas", thresholds=(100.0,))) == {0: 10.0, 1: 12.0}


def test_dlas_thresholds_are_on_gpu_time() -> None:
    # a 2-GPU job crosses 5 GPU-s after 2.5 s
    jobs = [Job(0, 0.0, 2, 10.0), Job(1, 1.0, 2, 2.0)]
    assert finishes(jobs, 2, Policy("dlas", thresholds=(5.0,))) == {0: 12.0, 1: 4.5}


def test_starvation_promotes_a_job_that_waited_long_enough() -> None:
    # B (20 s) arrives first, A (5 s) at 0.5; one threshold at 1 GPU-s. Without starvation
    # handling both end in queue 1 where B, the earlier arrival, runs to the end: B 21, A 25.
    jobs = [Job(0, 0.0, 1, 20.0), Job(1, 0.5, 1, 5.0)]
    assert finishes(jobs, 1, Policy("dlas", thresholds=(1.0,))) == {0: 21.0, 1: 25.0}
    # factor 1, re-planned every second: A is promoted whenever it has waited as long as it
    # has run (at 3, 6, 10 and 15), runs 1 GPU-s in queue 0 each time and ends at 16; B at 25
    starving = Policy("dlas", thresholds=(1.0,), starvation=1.0, interval_s=1.0)
    assert finishes(jobs, 1, starving) == {0: 25.0, 1: 16.0}


def test_a_resumed_job_pays_the_restart_time() -> None:
    assert finishes(A_B, 1, Policy("las", restart_s=0.5)) == {0: 12.5, 1: 3.0}


def test_periodic_ticks_only_matter_where_the_policy_says() -> None:
    for policy in (Policy("fifo"), Policy("dlas", thresholds=(5.0,))):
        ticking = Policy(policy.kind, thresholds=policy.thresholds, interval_s=0.3)
        assert finishes(A_B, 1, ticking) == finishes(A_B, 1, policy)
    # LAS re-planned every 0.3 s shares the GPU once B has caught up with A's 1 GPU-s
    shared = finishes(A_B, 1, Policy("las", interval_s=0.3))
    assert shared[1] > 3.0 and shared[0] == pytest.approx(12.0)


def test_bad_inputs_are_errors() -> None:
    with pytest.raises(ValueError, match="needs 8 GPUs"):
        simulate([Job(0, 0.0, 8, 1.0)], 4, Policy("fifo"))
    with pytest.raises(ValueError, match="thresholds must increase"):
        Policy("dlas", thresholds=(10.0, 5.0))
    with pytest.raises(ValueError, match="unknown policy"):
        Policy("srtf")


def test_the_published_traces_load_and_2d_las_beats_fifo_on_tiresias_60() -> None:
    jobs = read_tiresias(TRACES / "tiresias" / "60_job.csv")
    gpus = cluster_gpus(TRACES / "tiresias" / "cluster_spec.csv")
    assert len(jobs) == 60 and gpus == 64
    fifo = simulate(jobs, gpus, Policy("fifo")).summary()
    dlas = simulate(jobs, gpus, Policy("dlas")).summary()
    assert fifo["jobs"] == dlas["jobs"] == 60
    assert dlas["avg_jct_s"] <= fifo["avg_jct_s"]
    gavel = read_gavel(TRACES / "gavel_msr_seed0" / "51b7ef.trace",
                       TRACES / "gavel_simulation_throughputs.json")  # fmt: skip
    assert len(gavel) == 18 and all(j.duration > 0 for j in gavel)


@pytest.mark.timeout(60)
def test_starvation_at_large_clock_values_terminates() -> None:
    # Philly traces put arrivals at ~1e7 s, where an absolute 1e-9 s is below a float's step:
    # a promotion due "now" used to be rescheduled at now + 1e-9 == now, forever.
    import random

    rng = random.Random(1)
    start = 3.3e7
    jobs = [
        Job(i, start + rng.uniform(0, 5e5), rng.choice([1, 2]), rng.uniform(50, 5e4))
        for i in range(40)
    ]
    for interval in (7.3, 119.9):
        policy = Policy("dlas", (1199.9, 1559.9, 1871.9), 9.1, interval, restart_s=30)
        result = simulate(jobs, 4, policy)
        assert len(result.jobs) == 40
        assert all(j.finish >= j.arrival + j.duration - 1e-6 for j in result.jobs)
        assert result.summary()["preemptions"] > 0


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (
            Policy("dlas", thresholds=(500.0, 4000.0), starvation=0.05, interval_s=7.0,
                   restart_s=3.0),
            (6527.2231927026705, 35439.772699101624, 43483.578755739734, 1352),
        ),
        (
            Policy("dlas", thresholds=(200.0,), starvation=2.0, restart_s=10.0),
            (9011.931574711434, 31185.209230586253, 46827.61126005179, 1316),
        ),
        (
            Policy("las", interval_s=30.0, restart_s=5.0),
            (5821.367132345829, 39648.50791315427, 47692.31396979238, 1109),
        ),
        (Policy("fifo"), (18518.761837791222, 40408.78559032967, 58559.00263801068, 0)),
    ],
)  # fmt: skip
def test_a_random_trace_gives_the_schedules_of_the_reference_simulator(
    policy: Policy, expected: tuple[float, float, float, int]
) -> None:
    """Stored benchmark runs (``bench/results/``) were scored with this simulator, so a
    faster one must give the same schedules. The expected values are those of the simulator
    before its speed-up (commit a8d5f0e): 60 seeded jobs on 8 GPUs, with starvation
    promotions on ticks and without, threshold crossings, restarts and LAS's ticks."""
    rng = random.Random(11)
    jobs, arrival = [], 0.0
    for i in range(60):
        arrival += rng.expovariate(1 / 300)
        jobs.append(Job(i, arrival, rng.choice([1, 1, 2, 4, 8]), rng.lognormvariate(7, 1.5)))
    got = simulate(jobs, 8, policy).summary()
    average, p99, makespan, preemptions = expected
    assert got["preemptions"] == preemptions
    assert (got["avg_jct_s"], got["p99_jct_s"], got["makespan_s"]) == pytest.approx(
        (average, p99, makespan), rel=1e-12
    )
