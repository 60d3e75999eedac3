"""The problems of issue 26's suite, built from ``bench/suite.toml`` as ``SuiteProblem``s.

Names are ``<family>:<name>``; ``suite_names(half)`` lists a half's problems without
building anything, ``build(names, ...)`` builds the ones asked for (data is read from
``../shared/benchdata`` at run time, never copied into the repository) and says why any
cannot be built here. Families:

* ``db:<set>``: MySQL/PostgreSQL knob tuning on random-forest surrogates of KnobsTuningEA's
  measurements: ``sysbench-20``, ``job-5``, ``sysbench-5`` (``bench/dbsurrogate.py``: tps
  max, latency min, tps max), ``tpcc-100``, ``ycsb-100``, ``seats-100``, ``tatp-100``,
  ``voter-100`` (tps max, 100 knobs) and their 20-knob restrictions ``<set>-20``, ``pg-5``
  (JOB latency min on PostgreSQL), whose logs hold failed runs: a configuration the failure
  classifier predicts to fail is ``infeasible`` (``bench/dbres.py``). LlamaTune embedding
  of 16 dimensions from 20 knobs up, 4 on the 5-knob sets (as ``bench/llamatune.py``).
  **Noisy twins** ``db:<set>~cov05`` / ``~cov15`` (``noisy_twin``): each measurement is the
  true value times ``exp(N(mu, sigma^2))`` with ``sigma^2 = ln(1 + cov^2)`` and
  ``mu = -sigma^2 / 2`` (a log-normal factor of mean 1 and coefficient of variation
  ``cov``), and with probability ``outlier_rate`` it is also multiplied or divided (even
  odds) by ``outlier_factor`` (``[suite]`` of the toml); the outliers move the mean by
  ``rate x (factor + 1/factor - 2) / 2``, +1.3 % at 2 % and 3x. ``true_value`` is the
  noise-free surrogate.
* ``hdbo:<name>``: ALEBO's Branin D=100 and Hartmann6 D=100/1000 and the Hartmann6-in-20
  guard (``bench/hdbo.py``), 16-dimensional embedding, known optima.
* ``cloud:<workload>:<objective>``: one Scout workload (both input sizes of each listed
  application, ``_bigdata`` and ``_huge``) and ``runtime_s`` or ``cost_usd``, minimized
  over the ``cloud_replay`` target's measured deployments (``targets/cloud/target.py``): the
  candidates are those deployments, their features the totals of ``vcpus`` and
  ``memory_gib`` (as ``bench/cloud.py`` passes them); a failed or timed-out run is
  ``infeasible``; the optimum is the best completed run (``bench.cloud.optima``). The knobs
  lose the catalog's default deployment, as in ``bench/cloud.py`` (no method gets a free
  known point).
* ``sched:gavel:<trace>``: Tiresias 2D-LAS parameters (``targets/scheduler/gpusched.py``) on
  one Gavel trace, cluster and restart cost as ``bench/gpusched.py`` (load 0.9, 30 s, first 300
  jobs); minimize ``jct_ratio`` subject to ``p99_ratio <= 1.1`` (ratios to Tiresias's
  defaults, which the knobs keep as their defaults: the configuration a user starts from).
  The simulator is deterministic, so each problem caches its evaluations by configuration.
* ``yahpo:<scenario>-<instance>``: YAHPO Gym surrogates (``bench/yahpo_bridge.py``),
  evaluated in ``bench/.venv-yahpo`` through one child process; skipped with a message
  naming ``bench/setup_yahpo.sh`` when that environment is missing.

Knobs never carry expert priors here (``recommended``): every method sees the same space.
"""

from __future__ import annotations

import math
import random
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from bench import dbres, dbsurrogate, hdbo, yahpo_bridge
from bench.cloud import optima
from bench.contract import Measurement, SuiteProblem
from bench.gpusched import LOAD, MAX_JOBS, P99_LIMIT, RESTART_S
from bench.hdbo import KnobProblem
from targets.base import full_config
from targets.cloud.target import CloudReplayTarget
from targets.scheduler.gpusched import GpuSchedTarget
from tuner.space import Config, value_key
from tuner.trial import TrialStatus

SUITE_TOML = Path(__file__).resolve().with_name("suite.toml")
#: The benchmark data beside the checkout (its README names each set's source and license).
DATA = Path(__file__).resolve().parents[2] / "shared" / "benchdata"
FAMILIES = ("db", "hdbo", "cloud", "sched", "yahpo")
CLOUD_SIZES = ("bigdata", "huge")
CLOUD_TABLE = Path("cloud_config_scout_bbo_arena") / "cloud_config_lookup.csv"
GAVEL = Path("gpu_sched_traces") / "gavel_msr_seed0"
SEPARATORS = (":", "~", "_", "-")
_PRIOR_KEYS = ("recommended", "recommended_source")

ValueOf = Callable[[Config], float | None]


def read_suite(path: Path = SUITE_TOML) -> dict[str, Any]:
    """The suite's definition (``bench/suite.toml``)."""
    with path.open("rb") as handle:
        return tomllib.load(handle)


def suite_names(half: str, suite: dict[str, Any]) -> list[str]:
    """Every problem of ``half`` (noisy twins after their problem), without building one."""
    part, noise = suite[half], suite["suite"]["noise_cov"]
    names: list[str] = []
    for base in part.get("db", ()):
        names += [f"db:{base}", *(f"db:{base}{twin_suffix(c)}" for c in noise)]
    names += [f"hdbo:{name}" for name in part.get("hdbo", ())]
    names += [
        f"cloud:{app}_{size}:{objective}"
        for app in part.get("cloud_apps", ())
        for size in CLOUD_SIZES
        for objective in part.get("cloud_objectives", ())
    ]
    names += [f"sched:{name}" for name in part.get("sched", ())]
    names += [f"yahpo:{name}" for name in part.get("yahpo", ())]
    return names


def select(names: Iterable[str], filters: Iterable[str]) -> list[str]:
    """The names equal to a filter or starting with it followed by ``: ~ _ -``; a filter
    written ``=name`` keeps that name only (``=db:ycsb-100``: not its noisy twins)."""
    given = [f for f in filters if f]
    wanted = [f for f in given if not f.startswith("=")]
    exact = {f[1:] for f in given if f.startswith("=")}
    return [
        n
        for n in names
        if n in exact or any(n == f or any(n.startswith(f + s) for s in SEPARATORS) for f in wanted)
    ]


def twin_suffix(cov: float) -> str:
    """``0.05`` -> ``~cov05``."""
    return f"~cov{round(cov * 100):02d}"


def build(
    names: Iterable[str],
    half: str,
    suite: dict[str, Any],
    data_dir: Path = DATA,
    yahpo_python: Path = yahpo_bridge.DEFAULT_PYTHON,
) -> tuple[list[SuiteProblem], dict[str, str]]:
    """The named problems of ``half``, and ``name -> reason`` for those not buildable here."""
    names = list(names)
    known = set(suite_names(half, suite))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a {half} problem of {SUITE_TOML.name}")
    missing = {
        "db": data_dir / dbsurrogate.FOLDER,
        "cloud": data_dir / CLOUD_TABLE,
        "sched": data_dir / GAVEL,
        "yahpo": data_dir / yahpo_bridge.FOLDER,
    }
    yahpo_reason = None
    if any(n.startswith("yahpo:") for n in names):
        yahpo_reason = yahpo_bridge.unavailable(yahpo_python)
    problems, skipped = [], {}
    for name in names:
        family = name.split(":", 1)[0]
        if family in missing and not missing[family].exists():
            skipped[name] = f"{missing[family]} not found (use --data)"
        elif family == "yahpo" and yahpo_reason is not None:
            skipped[name] = f"{yahpo_reason} (YAHPO Gym's own environment)"
        else:
            problems.append(_build_one(name, half, suite, data_dir, yahpo_python))
    return problems, skipped


def noisy_twin(problem: SuiteProblem, cov: float, rate: float, factor: float) -> SuiteProblem:
    """``problem`` with mean-one log-normal noise of CoV ``cov`` and rare outliers (module doc).

    Infeasible and failed measurements stay as they are; ``true_value`` is unchanged.
    """
    sigma = math.sqrt(math.log1p(cov * cov))
    mu = -0.5 * sigma * sigma
    objective = problem.objective

    def measure(config: Config, rng: random.Random) -> Measurement:
        clean = problem.measure(config, rng)
        if clean.status != "completed":
            return clean
        value = clean.metrics[objective] * math.exp(rng.gauss(mu, sigma))
        if rng.random() < rate:
            value = value * factor if rng.random() < 0.5 else value / factor
        return Measurement("completed", {**clean.metrics, objective: value})

    return replace(
        problem,
        name=problem.name + twin_suffix(cov),
        measure=measure,
        source=f"{problem.source}; log-normal noise CoV {cov:g}, outliers x/÷{factor:g} "
        f"at rate {rate:g}",
    )


# -- one builder per family ------------------------------------------------------------------


def _build_one(
    name: str, half: str, suite: dict[str, Any], data_dir: Path, yahpo_python: Path
) -> SuiteProblem:
    family, rest = name.split(":", 1)
    budget = int(suite["budget"][family])
    if family == "db":
        base, _, twin = rest.partition("~")
        problem = _db(base, half, budget, data_dir)
        if not twin:
            return problem
        settings = suite["suite"]
        cov = next(c for c in settings["noise_cov"] if twin_suffix(c) == f"~{twin}")
        return noisy_twin(problem, cov, settings["outlier_rate"], settings["outlier_factor"])
    if family == "hdbo":
        return _hdbo(rest, half, budget)
    if family == "cloud":
        workload, objective = rest.split(":")
        return _cloud(workload, objective, half, budget, data_dir)
    if family == "sched":
        return _sched(rest, half, budget, data_dir)
    return _yahpo(rest, half, budget, data_dir, yahpo_python)


def db_problem(base: str, budget: int, data_dir: Path = DATA) -> SuiteProblem:
    """``db:<base>`` outside the suite's halves (``bench/transfer.py`` picks its own split)."""
    return _db(base, "transfer", budget, data_dir)


def _db(base: str, half: str, budget: int, data_dir: Path) -> SuiteProblem:
    data_dir = data_dir.resolve()
    if base in dbsurrogate.SAMPLE_SETS:
        return _from_knob_problem("db", half, dbsurrogate.surrogate_problem(data_dir, base), budget)
    restriction = dbres.RESTRICTIONS.get(base)
    spec = dbres.RES_SETS[restriction.base if restriction else base]
    source = (
        f"KnobsTuningEA {spec.log}, RandomForestClassifier (fails) + RandomForestRegressor("
        f"n_estimators={dbsurrogate.TREES}, random_state=0)"
    )
    predict: ValueOf
    if restriction is None:
        model = dbres.surrogate(data_dir, base)
        knobs, predict = model.knobs, model.predict
    else:
        knobs, held, predict = dbres.restricted(data_dir, base)
        source += (
            f"; its {restriction.count} most important knobs free, the other {len(held)} at "
            "the knob JSON's defaults (bench/dbres.py, important_knobs)"
        )
    return _valued(
        f"db:{base}",
        half,
        knobs,
        spec.metric,
        spec.goal,
        budget,
        predict,
        embed_dims=spec.embed_dims,
        source=source,
    )


def _hdbo(name: str, half: str, budget: int) -> SuiteProblem:
    guard = hdbo.hartmann6_guard_problem()
    problem = guard if name == guard.name else hdbo.alebo_problems()[name]
    return _from_knob_problem("hdbo", half, problem, budget)


def _cloud(workload: str, objective: str, half: str, budget: int, data_dir: Path) -> SuiteProblem:
    table = data_dir / CLOUD_TABLE
    target = CloudReplayTarget(workload=workload, table=str(table))
    knobs = tuple(
        {k: v for k, v in knob.to_dict().items() if k != "default"}
        for knob in target.describe_knobs()
    )
    status = {TrialStatus.COMPLETED: "completed", TrialStatus.INFEASIBLE: "infeasible"}

    def measure(config: Config, rng: random.Random) -> Measurement:
        outcome = target.run_trial(config)
        return Measurement(status.get(outcome.status, "failed"), dict(outcome.metrics))

    def true_value(config: Config) -> float | None:
        return measure(config, random.Random(0)).metrics.get(objective)

    return SuiteProblem(
        name=f"cloud:{workload}:{objective}",
        family="cloud",
        half=half,
        knobs=knobs,
        objective=objective,
        goal="minimize",
        constraints=(),
        budget=budget,
        measure=measure,
        true_value=true_value,
        candidates=target.describe_candidates(),
        candidate_features=target.describe_candidate_features(),
        optimum=_cloud_optima(table)[(workload, objective)],
        source=f"Scout via bbo-arena, {CLOUD_TABLE.name}: {workload} (targets/cloud/target.py)",
    )


def _sched(name: str, half: str, budget: int, data_dir: Path) -> SuiteProblem:
    trace = name.removeprefix("gavel:")
    path = data_dir / GAVEL / f"{trace}.trace"
    options = {"traces": [str(path)], "load": LOAD, "restart_s": RESTART_S, "max_jobs": MAX_JOBS}
    target = GpuSchedTarget.from_options(options)
    target.setup()  # simulates Tiresias's defaults once: the ratios' denominators
    knobs = target.describe_knobs()
    seen: dict[tuple[Any, ...], Measurement] = {}

    def measure(config: Config, rng: random.Random) -> Measurement:
        full = full_config(target.kind, knobs, config)
        key = tuple(sorted((k, value_key(v)) for k, v in full.items()))
        if key not in seen:
            outcome = target.run_trial(full)
            ok = outcome.status == TrialStatus.COMPLETED
            seen[key] = Measurement("completed" if ok else "failed", dict(outcome.metrics))
        return seen[key]

    def true_value(config: Config) -> float | None:
        metrics = measure(config, random.Random(0)).metrics
        if not metrics or metrics["p99_ratio"] > P99_LIMIT:
            return None
        return metrics["jct_ratio"]

    return SuiteProblem(
        name=f"sched:{name}",
        family="sched",
        half=half,
        knobs=tuple(k.to_dict() for k in knobs),
        objective="jct_ratio",
        goal="minimize",
        constraints=(f"p99_ratio <= {P99_LIMIT}",),
        budget=budget,
        measure=measure,
        true_value=true_value,
        source=f"Gavel trace {trace} (stanford-futuredata/gavel@c4fa400), first {MAX_JOBS} "
        f"jobs, load {LOAD}, restart {RESTART_S:g} s (targets/scheduler/gpusched.py)",
    )


def _yahpo(name: str, half: str, budget: int, data_dir: Path, python: Path) -> SuiteProblem:
    scenario, instance = yahpo_bridge.split_name(name)
    knobs, fixed = yahpo_bridge.scenario_knobs(data_dir, scenario, instance)
    rule = yahpo_bridge.SCENARIOS[scenario]

    def value(config: Config) -> float:
        bridge = yahpo_bridge.shared_bridge(python, data_dir)  # started on first use
        return bridge.evaluate(scenario, dict(config), fixed)[rule.objective]

    fixed_text = ", ".join(f"{k}={v}" for k, v in fixed.items())
    source = f"YAHPO Gym 1.0.2 {scenario} (slds-lmu/yahpo_data@efdab90), {fixed_text}"
    return _valued(
        f"yahpo:{name}", half, knobs, rule.objective, rule.goal, budget, value, source=source
    )


# -- private helpers -------------------------------------------------------------------------


def _valued(
    name: str,
    half: str,
    knobs: Iterable[dict[str, Any]],
    objective: str,
    goal: str,
    budget: int,
    value: ValueOf,
    **extra: Any,
) -> SuiteProblem:
    """A problem measured by a deterministic ``value`` (None: the configuration breaks the
    system); ``extra``: ``embed_dims``, ``optimum``, ``source``."""

    def measure(config: Config, rng: random.Random) -> Measurement:
        result = value(config)
        if result is None:
            return Measurement("infeasible")
        return Measurement("completed", {objective: result})

    return SuiteProblem(
        name=name,
        family=name.split(":", 1)[0],
        half=half,
        knobs=tuple({k: v for k, v in knob.items() if k not in _PRIOR_KEYS} for knob in knobs),
        objective=objective,
        goal=goal,
        constraints=(),
        budget=budget,
        measure=measure,
        true_value=value,
        **extra,
    )


def _from_knob_problem(family: str, half: str, problem: KnobProblem, budget: int) -> SuiteProblem:
    return _valued(
        f"{family}:{problem.name}",
        half,
        problem.knobs,
        problem.metric,
        problem.goal,
        budget,
        problem.evaluate,
        embed_dims=problem.embed_dims,
        optimum=problem.optimum,
        source=problem.source,
    )


@lru_cache(maxsize=2)
def _cloud_optima(table: Path) -> dict[tuple[str, str], float]:
    return optima(table)
