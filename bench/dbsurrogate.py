"""MySQL knob-tuning surrogates fitted on KnobsTuningEA's measured samples.

Zhang et al. (VLDB 2022) measured MySQL 5.7 under SYSBENCH and JOB for thousands of knob
configurations and benchmarked tuners on a random-forest *surrogate* of those measurements.
Their trained models are not reachable from here, so this module re-trains one with
scikit-learn from the samples in ``shared/benchdata/dbtune_knobsTuningEA/`` (read at run time,
never copied into the repository, nothing cached on disk):

* ``sysbench-20``: ``SYSBENCH_20knob.csv`` (5,290 rows, 20 knobs), metric ``tps``, maximize;
  knob ranges from ``SYSBENCH_shap_knobs.json``.
* ``job-5``: ``JOB_5knob.csv`` (6,250 rows, 5 knobs), metric ``latency`` in seconds (240 =
  the benchmark's timeout, 44 % of the rows), minimize; ranges from ``JOB_shap_knobs.json``.

Knobs: JSON ``integer`` -> an ``int`` knob on ``[min, max]`` (linear, as in LlamaTune and
KnobsTuningEA); JSON ``enum`` -> a ``categorical`` knob over ``enum_values``. SYSBENCH's CSV
stores enums as codes ``0, 1, 2`` (read as indices into ``enum_values``, an assumption that
only changes labels); JOB's stores the strings. No knob carries a default, so no method
starts from MySQL's defaults.

Surrogate: ``RandomForestRegressor(n_estimators=100, random_state=0)`` (scikit-learn
defaults otherwise) on all rows; features are the int values and the enum indices (a forest
is invariant to monotone rescaling of a feature). ``tests/bench`` checks R^2 > 0.5 on
held-out rows (measured here: 0.92 for SYSBENCH, 0.98 for JOB, 20 % held out).

Special values (for the LlamaTune special-value bias of ours and of mlos-core), on int
knobs whose lower bound switches a behaviour: ``innodb_thread_concurrency = 0`` (no
concurrency limit; MySQL 5.7 manual §14.8.5), ``innodb_adaptive_max_sleep_delay = 0``
(disables the adaptive sleep delay; MariaDB's reference for the same variable),
``expire_logs_days = 0`` (no automatic binlog removal) and
``innodb_compression_failure_threshold_pct = 0`` (disables the compression-failure
padding); the last two from the MySQL manual, not re-read here.

Source: ``PKU-DAIR/KnobsTuningEA@13290f8`` ``tuning_benchmark/data/`` (no license file:
internal benchmarking only; see ``shared/benchdata/README.md``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from bench.hdbo import KnobProblem
from tuner.space import Scalar

FOLDER = "dbtune_knobsTuningEA"
TREES = 100
SPECIAL_VALUES = {
    "innodb_thread_concurrency": 0,
    "innodb_adaptive_max_sleep_delay": 0,
    "expire_logs_days": 0,
    "innodb_compression_failure_threshold_pct": 0,
}


@dataclass(frozen=True)
class SampleSet:
    """One workload's measured samples.

    Attributes:
        name: Problem name.
        csv: Samples file (first column a row id, then knobs, then the metric).
        knobs_json: Knob ranges and types.
        metric: The metric's name in the study.
        column: The metric's column (the CSV's last).
        goal: ``maximize`` (throughput) or ``minimize`` (latency).
        embed_dims: LlamaTune embedding dimension: 16 (the paper's) below the knob count;
            mlos-core requires fewer low dimensions than knobs, so 4 for 5 knobs.
    """

    name: str
    csv: str
    knobs_json: str
    metric: str
    column: str
    goal: str
    embed_dims: int


SAMPLE_SETS = {
    s.name: s
    for s in (
        SampleSet(
            "sysbench-20",
            "SYSBENCH_20knob.csv",
            "SYSBENCH_shap_knobs.json",
            "tps",
            "tps",
            "maximize",
            16,
        ),
        SampleSet("job-5", "JOB_5knob.csv", "JOB_shap_knobs.json", "latency", "lat", "minimize", 4),
    )
}


@dataclass(frozen=True)
class Samples:
    """Knob definitions and the encoded sample matrix of one workload.

    Attributes:
        knobs: Knob dictionaries (``tuner.space.knob_from_dict`` form), in CSV column order.
        X: ``n x d`` features (int values, enum indices).
        y: ``n`` measured metric values.
    """

    knobs: tuple[dict[str, Any], ...]
    X: np.ndarray
    y: np.ndarray


def load_samples(data_dir: Path, name: str) -> Samples:
    """Read one workload's knob ranges and samples from ``data_dir/dbtune_knobsTuningEA``."""
    spec = SAMPLE_SETS[name]
    folder = data_dir / FOLDER
    ranges = json.loads((folder / spec.knobs_json).read_text())
    with (folder / spec.csv).open(newline="") as handle:
        rows = list(csv.reader(handle))
    header, body = rows[0], rows[1:]
    if header[-1] != spec.column:
        raise ValueError(f"{spec.csv}: last column is {header[-1]!r}, expected {spec.column!r}")
    names = header[1:-1]
    knobs = tuple(_knob(n, ranges[n]) for n in names)
    X = np.array(
        [[_feature(k, cell) for k, cell in zip(knobs, row[1:-1], strict=True)] for row in body]
    )
    y = np.array([float(row[-1]) for row in body])
    return Samples(knobs, X, y)


def fit_surrogate(samples: Samples, seed: int = 0, trees: int = TREES) -> Any:
    """A seeded ``RandomForestRegressor`` fitted on all samples."""
    from sklearn.ensemble import RandomForestRegressor

    model = RandomForestRegressor(n_estimators=trees, random_state=seed)
    return model.fit(samples.X, samples.y)


def encode(knobs: tuple[dict[str, Any], ...], config: Mapping[str, Scalar]) -> list[float]:
    """A configuration as the surrogate's feature vector."""
    return [_feature(k, config[k["name"]]) for k in knobs]


def surrogate_problem(data_dir: Path, name: str, budget: int = 100) -> KnobProblem:
    """The workload as a ``KnobProblem`` whose ``evaluate`` is the fitted forest's prediction."""
    spec = SAMPLE_SETS[name]
    samples, model = _fitted(data_dir.resolve(), name)
    knobs = samples.knobs

    def evaluate(config: Mapping[str, Scalar]) -> float:
        return float(model.predict(np.array([encode(knobs, config)]))[0])

    return KnobProblem(
        name=name,
        knobs=knobs,
        evaluate=evaluate,
        metric=spec.metric,
        goal=spec.goal,
        budget=budget,
        quick_budget=30,
        embed_dims=spec.embed_dims,
        source=f"KnobsTuningEA {spec.csv} ({len(samples.y)} rows), RandomForestRegressor("
        f"n_estimators={TREES}, random_state=0)",
    )


@lru_cache(maxsize=4)
def _fitted(data_dir: Path, name: str) -> tuple[Samples, Any]:
    samples = load_samples(data_dir, name)
    return samples, fit_surrogate(samples)


def _knob(name: str, info: dict[str, Any]) -> dict[str, Any]:
    if info["type"] == "enum":
        return {"name": name, "kind": "categorical", "choices": list(info["enum_values"])}
    if info["type"] != "integer":
        raise ValueError(f"knob {name}: unsupported type {info['type']!r}")
    knob: dict[str, Any] = {"name": name, "kind": "int", "low": info["min"], "high": info["max"]}
    if name in SPECIAL_VALUES:
        knob["special_values"] = [SPECIAL_VALUES[name]]
    return knob


def _feature(knob: dict[str, Any], value: Any) -> float:
    """An int value as a float; an enum as the index of its choice (a code or the string)."""
    if knob["kind"] != "categorical":
        return float(value)
    choices = knob["choices"]
    if value in choices:
        return float(choices.index(value))
    code = int(float(value))
    if not 0 <= code < len(choices):
        raise ValueError(f"knob {knob['name']}: code {value!r} outside {choices}")
    return float(code)
