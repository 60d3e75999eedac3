"""Our designer measured through the session's measurement protocol, on the same budget.

``ours`` measures each suggestion once and reports the configuration with the best
measured value: on a noisy problem that is often a lucky sample. This runner is what a
``tuner tune`` session does instead (``runner.measurement``, ``DEFAULT_PROTOCOL``): the
session loop (``runner.session.run_session``) over an in-memory study
(``runner.memory.MemoryAPI``) measures every trial once (racing repeats are off by
default; a protocol with ``max_repeats`` above 1 runs a promising trial again), re-measures
the default every five trials where the problem has one, ranks the candidates by the
objective GP's posterior mean, and the closing confirmation re-measures the best three in
interleaved rounds (two choose one, the rest estimate it); what it reports at the end is
the confirmation's best, or what an inconclusive confirmation keeps
(``Confirmation.kept``: the default when it met the constraints in every round, else the
candidate that met them most often), as ``tuner best`` does.

**The same budget.** The budget counts measurements, not trials: repeats, controls (only
where the problem has a default) and confirmation rounds all spend it. The session stops
suggesting while the next trial's most repeats and the confirmation at its default size
would overrun the budget (or, on a small budget, once half of it is spent); the
confirmation then gets as many rounds as the rest allows (at least the default five), and
what is left (fewer runs than candidates) re-measures the chosen configuration, so every
run has exactly ``budget`` measurements as every peer has.

**What is reported after each evaluation**: during the session the best feasible trial by
its measured mean (``tuner.trial.best_trial``); during the confirmation the session's
pick (the first of the posterior ranking); from the confirmation's last run on, its best.
The suite scores the true value of each report.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from bench.contract import Measurement, MethodRun, SuiteProblem, run_rng
from bench.peers.ours import study_spec
from runner.confirm import confirm
from runner.measurement import DEFAULT_PROTOCOL, MeasurementProtocol
from runner.memory import MemoryAPI
from runner.session import run_session
from targets.base import ConfigRejected, Target
from tuner.confirmation import machine_noise
from tuner.errors import TargetError
from tuner.space import Config, Knob
from tuner.trial import StepKind, Trial, best_trial

NAME = "ours-protocol"


def available() -> str | None:
    """Always usable."""
    return None


class ProblemTarget(Target):
    """A suite problem as a target: each run is one ``problem.measure`` with the run's
    generator; a configuration that broke the system is rejected (INFEASIBLE), a failed
    measurement is FAILED. Every run is kept with the report it was made under."""

    kind = "suite-problem"

    def __init__(self, problem: SuiteProblem, seed: int, report: Callable[[], Config | None]):
        self.problem, self.rng, self.report = problem, run_rng(problem.name, seed), report
        self.configs: list[Config] = []
        self.measurements: list[Measurement] = []
        self.reported: list[Config | None] = []
        self._config: Config = {}

    def describe_knobs(self) -> tuple[Knob, ...]:
        return ()

    def describe_metrics(self) -> dict[str, str]:
        return {}

    def apply(self, config: Config) -> None:
        self._config = dict(config)

    def measure(self) -> dict[str, float]:
        measured = self.problem.measure(self._config, self.rng)
        self.configs.append(self._config)
        self.measurements.append(measured)
        self.reported.append(self.report())
        if measured.status == "infeasible":
            raise ConfigRejected("the configuration broke the system")
        if measured.status == "failed":
            raise TargetError("the measurement failed")
        return dict(measured.metrics)

    def restore(self) -> None:
        self._config = {}


def confirm_runs(protocol: MeasurementProtocol, has_default: bool, k: int, rounds: int) -> int:
    """Measurements a confirmation of ``k`` candidates in ``rounds`` rounds takes."""
    if has_default and protocol.confirm_select and k > 1:
        return protocol.confirm_select * (1 + k) + 2 * rounds
    return rounds * (k + has_default)


def run(
    problem: SuiteProblem, seed: int, budget: int, on_eval: Callable[[], None] | None = None
) -> MethodRun:
    """``budget`` measurements of our designer under the measurement protocol (module doc)."""
    spec = study_spec(problem, seed)
    api = MemoryAPI()
    protocol = DEFAULT_PROTOCOL
    pick: list[Config | None] = []  # set during the confirmation: the session's pick

    def report() -> Config | None:
        if on_eval is not None:
            on_eval()
        if pick:
            return pick[-1]
        best = best_trial(spec, api.list_trials(spec.name))
        return None if best is None else dict(best.config)

    target = ProblemTarget(problem, seed, report)
    has_default = any(k.default is not None for k in spec.space.knobs)
    reserve = confirm_runs(protocol, has_default, protocol.confirm_top, protocol.confirm)
    reserve += protocol.most + (1 if protocol.control_every and has_default else 0)
    reserve = min(reserve, budget // 2)  # a small budget: half for the search

    def spent() -> bool:
        return len(target.measurements) + reserve > budget

    start = time.perf_counter()
    result = run_session(
        api, target, spec, budget, protocol=replace(protocol, confirm=0), stop=spent
    )
    chosen: Trial | None = result.ranking[0] if result.ranking else result.best
    left = budget - len(target.measurements)
    notes = Counter(t.step.value for t in result.trials)
    notes["trials"] = len(result.trials)
    k = min(protocol.confirm_top, len(result.ranking))
    measured = result.default is not None
    if k:
        rounds = max(
            (r for r in range(1, left + 1) if confirm_runs(protocol, measured, k, r) <= left),
            default=0,
        )
        pick.append(None if chosen is None else dict(chosen.config))
        default = result.default
        found = confirm(
            target, result.spec, result.trials, result.ranking, rounds, protocol.confirm_top,
            noise=machine_noise(
                result.spec, result.measurements, None if default is None else default.id
            ),
            select=protocol.confirm_select,
        )  # fmt: skip
        notes["confirm_rounds"] = rounds
        kept = found.kept(result.spec.objective.goal)  # as the session reports it
        if kept is not None:
            chosen = kept
            notes["confirmed_other"] = int(chosen.id != result.ranking[0].id)
        pick.append(None if chosen is None else dict(chosen.config))
        if target.reported:
            target.reported[-1] = pick[-1]
    while target.configs and len(target.measurements) < budget:  # less than a round left:
        target.run_trial(dict(chosen.config) if chosen is not None else target.configs[-1])
    notes["repeated"] = sum(t.repeats > 1 for t in result.trials if t.step is not StepKind.DEFAULT)
    return MethodRun(
        method=NAME,
        problem=problem.name,
        seed=seed,
        configs=target.configs,
        measurements=target.measurements,
        reported=target.reported,
        seconds=time.perf_counter() - start,
        notes=dict(notes),
    )
