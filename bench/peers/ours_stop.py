"""Ours with early stopping on a simulated progression, scored at equal measured time.

The suite's problems measure a configuration in one piece; a real trial reports its
measurement window by window. Here every measurement (``problem.measure`` with the run's
generator: the noisy twins' noise and outliers included) is split into ``WINDOWS`` windows
whose geometric mean is that measurement exactly: ``window_i = value * exp(e_i - mean(e))``
with ``e_i ~ N(0, c)``, ``c`` the twin's coefficient of variation (``~cov05``: 0.05,
``~cov15``: 0.15) and 0.05 on the noise-free problems. So the mean of the first ``k``
windows is noisy, and the noise shrinks as windows arrive; the full measurement is the
suite's. Each window goes to the study (``runner.memory.MemoryAPI.report_progress``, as a
session sends it to the server), whose rule (``[study.stopping]``, ``tuner.stopping``) may
stop the trial: it is then EARLY_STOPPED with the mean of its windows so far. As a session's
protocol does, the default (on problems without one: the first trial) is measured again
after every 5 trials (controls): the rule judges a metric only once the study measured its
run-to-run noise. Controls are not counted
in the time: a session measures them with or without stopping, and ``ours`` (which runs
none) is the same designer without them.

The budget is **measured time**, in whole measurements: a stopped trial costs the share of
its windows it ran, a completed one 1 (an INFEASIBLE or FAILED one, too: a real system spends
its window finding out). The run goes on until it spent ``budget``, so at equal time it may
measure more configurations than ``ours``; ``reported[j]`` is the configuration ours would
report (``tuner.confirmation.best_of``) once ``j + 1`` measurements' worth of time was spent,
so the suite's curves, its checkpoints and its tables compare methods at equal measured time.
``ours-screen`` adds the short-window screen (``screen_windows = 3``).
"""

from __future__ import annotations

import math
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from bench.contract import Measurement, MethodRun, SuiteProblem, run_rng
from bench.peers.ours import STATUS, study_spec
from runner.loop import run_loop
from runner.measurement import Measured
from runner.memory import MemoryAPI
from tuner.confirmation import best_of
from tuner.study import StoppingSettings
from tuner.trial import Measurement as StoredMeasurement
from tuner.trial import MeasurementKind, StepKind, Trial, TrialStatus

NAME = "ours-stop"
#: Windows a measurement is split into (the SQLite target's ``windows`` default).
WINDOWS = 10
#: Window noise on the problems without measurement noise.
QUIET_COV = 0.05
STOPPING = {"early_stop": True}
#: Trials a run may make at most, per unit of budget (stopped trials cost less than 1).
MAX_TRIALS_PER_BUDGET = 4
#: The default measured again after every this many trials (the session's protocol).
CONTROL_EVERY = 5


def available() -> str | None:
    """Always usable."""
    return None


def window_cov(problem: SuiteProblem) -> float:
    """The window noise of ``problem``: its twin's coefficient of variation, else QUIET_COV."""
    found = re.search(r"~cov(\d+)$", problem.name)
    return int(found.group(1)) / 100 if found else QUIET_COV


def windows_of(
    metrics: Mapping[str, float], cov: float, rng: random.Random
) -> list[dict[str, float]]:
    """``WINDOWS`` windows whose geometric mean per metric is ``metrics`` (module doc); a
    non-positive metric is the same in every window."""
    out: list[dict[str, float]] = [{} for _ in range(WINDOWS)]
    for name, value in metrics.items():
        shocks = [rng.gauss(0.0, cov) for _ in range(WINDOWS)]
        centre = sum(shocks) / WINDOWS
        for window, shock in zip(out, shocks, strict=True):
            window[name] = value * math.exp(shock - centre) if value > 0 else value
    return out


def run(
    problem: SuiteProblem,
    seed: int,
    budget: int,
    on_eval: Callable[[], None] | None = None,
    stopping: Mapping[str, Any] | None = None,
    name: str = NAME,
) -> MethodRun:
    """Ours with ``stopping`` (default: early stopping) until ``budget`` measurements' worth
    of time is spent (module doc)."""
    spec = study_spec(problem, seed)
    spec = type(spec).from_dict(
        {**spec.to_dict(), "stopping": StoppingSettings(**(stopping or STOPPING)).to_dict()}
    )
    rng = run_rng(problem.name, seed)
    noise = random.Random(f"{problem.name}:{seed}:windows")
    cov = window_cov(problem)
    api = MemoryAPI()
    measurements: list[Measurement] = []
    spent: list[float] = []  # the time spent after each trial, in measurements

    def measure(trial: Trial) -> Measured:
        measurement = problem.measure(trial.config, rng)
        measurements.append(measurement)
        status = STATUS[measurement.status]
        total = spent[-1] if spent else 0.0
        if status is not TrialStatus.COMPLETED:
            spent.append(total + 1.0)
            return Measured(status, reason=f"the measurement was {measurement.status}")
        windows = windows_of(measurement.metrics, cov, noise)
        for index, window in enumerate(windows[:-1]):
            decision = api.report_progress(spec.name, trial.id, window, trial.client_id)
            if decision.stop:
                ran = windows[: index + 1]
                spent.append(total + len(ran) / WINDOWS)
                means = {k: math.exp(sum(math.log(w[k]) for w in ran) / len(ran))
                         if all(w[k] > 0 for w in ran) else ran[-1][k] for k in ran[0]}  # fmt: skip
                return Measured(TrialStatus.EARLY_STOPPED, reason=decision.reason, metrics=means)
        api.report_progress(spec.name, trial.id, windows[-1], trial.client_id)
        spent.append(total + 1.0)
        return Measured(TrialStatus.COMPLETED, metrics=dict(measurement.metrics))

    def after(trial: Trial, measured: Measured, finished: int) -> None:
        if on_eval is not None:
            on_eval()
        designed = sum(t.step is not StepKind.DEFAULT for t in api.list_trials(spec.name))
        if trial.step is not StepKind.DEFAULT and designed % CONTROL_EVERY == 0:
            control(problem, api, spec.name, rng)

    start = time.perf_counter()
    run_loop(
        api, spec, MAX_TRIALS_PER_BUDGET * budget, measure, after=after,
        stop=lambda: bool(spent) and spent[-1] >= budget,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    trials = api.list_trials(spec.name)
    reported = reported_by_time(spec, trials, spent, budget)
    steps = Counter(t.step.value for t in trials)
    steps["stopped"] = sum(t.status is TrialStatus.EARLY_STOPPED for t in trials)
    steps["trials"] = len(trials)
    return MethodRun(
        method=name,
        problem=problem.name,
        seed=seed,
        configs=[dict(t.config) for t in trials],
        measurements=measurements,
        reported=reported,
        seconds=seconds,
        notes=dict(steps),
        generators=[t.step.value for t in trials],
    )


def control(problem: SuiteProblem, api: MemoryAPI, study: str, rng: random.Random) -> None:
    """The default measured once more and stored as a CONTROL of its trial: the run-to-run
    noise the stopping rule needs, as a session's protocol measures it. The suite's problems
    without a default configuration (the DB surrogates' knobs have none) re-measure their
    first measured trial instead."""
    measured = [t for t in api.list_trials(study) if t.status.measured]
    default = next((t for t in measured if t.step is StepKind.DEFAULT), None)
    default = default or (measured[0] if measured else None)
    if default is None:
        return
    again = problem.measure(default.config, rng)
    if again.status == "completed":
        api.add_measurements(
            study, default.id, [StoredMeasurement(dict(again.metrics), MeasurementKind.CONTROL)]
        )


def reported_by_time(
    spec: Any, trials: list[Trial], spent: list[float], budget: int
) -> list[dict[str, Any] | None]:
    """What ours reports once ``j + 1`` measurements' worth of time was spent, for each
    ``j < budget``: the best of the trials finished by then (``best_of``)."""
    out: list[dict[str, Any] | None] = []
    done = 0
    for j in range(budget):
        while done < len(trials) and spent[done] <= j + 1 + 1e-9:
            done += 1
        best = best_of(spec, trials[:done], ()).trial if done else None
        out.append(None if best is None else dict(best.config))
    return out
