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
* ``sysbench-5``: ``SYSBENCH_5knob.csv`` (6,250 rows, the five most important SYSBENCH knobs:
  ``max_heap_table_size``, ``tmp_table_size``, ``innodb_doublewrite`` (codes, as in the 20-knob
  file), ``query_prealloc_size``, ``innodb_thread_concurrency``), metric ``tps``, maximize;
  ranges from ``SYSBENCH_shap_knobs.json``; a report problem of ``bench/suite.toml``.

The 100-knob TPC-C and YCSB logs and the PostgreSQL log (``.res`` files, with failed runs) are
read by ``bench/dbres.py``, which builds its knobs with ``json_knob`` below.

Knobs: JSON ``integer`` -> an ``int`` knob on ``[min, max]`` (linear, as in LlamaTune and
KnobsTuningEA); JSON ``enum`` -> a ``categorical`` knob over ``enum_values``. JOB's CSV stores
the enum strings. SYSBENCH's stores codes ``0, 1, 2``, read as indices into the *sorted*
``enum_values`` (so ``innodb_doublewrite`` and ``general_log`` are ``OFF, ON`` and
``log_output`` is ``FILE, NONE, TABLE``, in that order): KnobsTuningEA's own surrogate
benchmark encodes an enum that way when it queries the forest trained on these rows
(``autotune/dbenv_bench.py``, ``get_states``: ``tmp.sort(); tmp.index(value)``). Choice
``i`` is code ``i``, so every method sees the numbers it saw when the codes were read in JSON
order (checked: random, Optuna and ours-full curves on sysbench-20, seed 0, unchanged); only
the names moved, and names matter once a prior names a value. No knob carries a default, so
no method starts from MySQL's defaults.

Expert priors (``PRIORS``; used only by ``ours-priors`` in ``bench/llamatune.py``, every
other method ignores them). Each is a recommendation read in the source named, region inside
the knob's range:

* ``innodb_lru_scan_depth`` in ``[100, 1024]`` (sysbench): the MySQL manual's text as NetApp
  republishes it, "A setting smaller than the default is suitable for most workloads" (the
  default is 1024). NetApp's own table for ONTAP storage says 8192, for arrays with spare
  I/O; the KnobsTuningEA cloud disks are not described, so the general advice is kept.
* ``innodb_doublewrite`` ``OFF`` (sysbench): MySQL 8.4 manual §17.6.4, disable it "if you
  are more concerned with performance than data integrity, as may be the case when
  performing benchmarks". Crash safety is traded away: acceptable for a tps benchmark only.
* ``innodb_log_file_size`` in ``[128 MiB, 1 GiB]`` (sysbench): NetApp, "between 128M and
  512M" is typically good; the MySQL 5.7 manual §8.5.4 says to make the redo log "big, even
  as big as the buffer pool" (>= 9.6 GB here), so the region runs to the range's top.
* ``general_log`` ``OFF`` (sysbench): the Debian/Ubuntu packaged ``mysqld.cnf``, "Be aware
  that this log type is a performance killer."
* ``innodb_thread_concurrency`` ``[0, 0]``, no limit (sysbench and job): MySQL 5.7 manual
  §14.8.5, "most workloads run well without any limit on the number of concurrent threads".
* ``innodb_stats_persistent`` ``ON`` (job): MySQL 5.7 manual §14.8.11.1, persistent
  statistics improve plan stability.

No prior, for want of a host-independent recommendation read for it: ``innodb_buffer_pool_size``
(a share of RAM, and the paper's supplement lists four hosts, 8-64 GB, without saying which
ran SYSBENCH and JOB), ``innodb_io_capacity_max`` (storage IOPS, not described),
``tmp_table_size``/``max_heap_table_size`` (the manual's advice is for "many advanced GROUP
BY queries", which sysbench does not run), ``log_output`` (the manual prefers FILE to TABLE
only while a log is on, which the ``general_log`` prior rules out), the query-cache,
MyISAM, full-text and transient-statistics knobs (idle for these workloads under
KnobsTuningEA's ``my.cnf``: query cache off by default in 5.7, InnoDB tables, no FULLTEXT
index, persistent statistics on) and the rest, for which no recommended region was found.

The priors are kept as the sources state them, whatever this surrogate says. Measured here on
the sysbench-20 forest (400 uniform configurations, then the prior knobs moved into their
regions): mean predicted tps 409 uniform, 314 with every prior knob in its region; one knob
at a time, inside vs outside its region, ``innodb_doublewrite`` 432 vs 389,
``innodb_log_file_size`` 411 vs 390, ``general_log`` 413 vs 404, but
``innodb_thread_concurrency`` 395 vs 411 and ``innodb_lru_scan_depth`` 380 vs 414.

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
MIB = 1024 * 1024
TREES = 100
SPECIAL_VALUES = {
    "innodb_thread_concurrency": 0,
    "innodb_adaptive_max_sleep_delay": 0,
    "expire_logs_days": 0,
    "innodb_compression_failure_threshold_pct": 0,
}


@dataclass(frozen=True)
class Prior:
    """An expert prior of one knob (``tuner.space.Knob``'s ``recommended`` fields).

    Attributes:
        recommended: ``(low, high)`` of an int knob, or the recommended choices.
        source: The document and section or URL, with the sentence that supports it.
    """

    recommended: tuple[int | str, ...]
    source: str


PRIORS = {
    "innodb_lru_scan_depth": Prior(
        (100, 1024),
        "MySQL manual text as republished by NetApp, 'innodb_lru_scan_depth' "
        "(https://docs.netapp.com/us-en/ontap-apps-dbs/mysql/mysql-innodb_lru_scan_depth.html): "
        "'A setting smaller than the default is suitable for most workloads.' (default 1024)",
    ),
    "innodb_doublewrite": Prior(
        ("OFF",),
        "MySQL 8.4 Reference Manual, 17.6.4 Doublewrite Buffer "
        "(https://dev.mysql.com/doc/en/innodb-doublewrite-buffer.html): 'Consider "
        "disabling the doublewrite buffer if you are more concerned with performance than data "
        "integrity, as may be the case when performing benchmarks, for example.'",
    ),
    "innodb_log_file_size": Prior(
        (128 * MIB, 1024 * MIB),
        "NetApp, 'innodb_log_file_size', read in NetApp's zh-cn translation "
        "(https://docs.netapp.com/zh-cn/ontap-apps-dbs/mysql/mysql-innodb_log_file_size.html): "
        "'typically, values between 128M and 512M are good' (translated back); MySQL 5.7 "
        "Reference Manual, 8.5.4 Optimizing InnoDB Redo Logging "
        "(https://dev.mysql.com/doc/refman/5.7/en/optimizing-innodb-logging.html): 'Make your "
        "redo log files big, even as big as the buffer pool.' (so up to the range's 1 GiB)",
    ),
    "general_log": Prior(
        ("OFF",),
        "Debian/Ubuntu mysql-server package, /etc/mysql/mysql.conf.d/mysqld.cnf, on "
        "general_log: 'Be aware that this log type is a performance killer.'",
    ),
    "innodb_thread_concurrency": Prior(
        (0, 0),
        "MySQL 5.7 Reference Manual, 14.8.5 Configuring Thread Concurrency for InnoDB "
        "(https://dev.mysql.com/doc/refman/5.7/en/innodb-performance-thread_concurrency.html): "
        "'On modern operating systems and servers with multi-core processors, where context "
        "switching is efficient, most workloads run well without any limit on the number of "
        "concurrent threads.' (0 = no limit)",
    ),
    "innodb_stats_persistent": Prior(
        ("ON",),
        "MySQL 5.7 Reference Manual, 14.8.11.1 Configuring Persistent Optimizer Statistics "
        "Parameters (https://dev.mysql.com/doc/refman/5.7/en/innodb-persistent-stats.html): "
        "'The persistent optimizer statistics feature improves plan stability by "
        "storing statistics to disk ... so that the optimizer is more likely to make "
        "consistent choices each time for a given query.'",
    ),
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
        enum_codes: The CSV stores enums as codes into the sorted ``enum_values``.
    """

    name: str
    csv: str
    knobs_json: str
    metric: str
    column: str
    goal: str
    embed_dims: int
    enum_codes: bool = False


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
            enum_codes=True,
        ),
        SampleSet("job-5", "JOB_5knob.csv", "JOB_shap_knobs.json", "latency", "lat", "minimize", 4),
        SampleSet(
            "sysbench-5",
            "SYSBENCH_5knob.csv",
            "SYSBENCH_shap_knobs.json",
            "tps",
            "tps",
            "maximize",
            4,
            enum_codes=True,
        ),
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
    knobs = tuple(json_knob(n, ranges[n], spec.enum_codes) for n in names)
    X = np.array(
        [[feature(k, cell) for k, cell in zip(knobs, row[1:-1], strict=True)] for row in body]
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
    return [feature(k, config[k["name"]]) for k in knobs]


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


def json_knob(name: str, info: dict[str, Any], sorted_enums: bool = False) -> dict[str, Any]:
    """A knob dictionary from a KnobsTuningEA knob-range entry (``integer``, ``float``, ``enum``).

    ``sorted_enums`` lists an enum's choices sorted (KnobsTuningEA's encoding); the ``PRIORS``
    and ``SPECIAL_VALUES`` of the knob's name are attached.
    """
    knob: dict[str, Any]
    if info["type"] == "enum":
        choices = sorted(info["enum_values"]) if sorted_enums else list(info["enum_values"])
        knob = {"name": name, "kind": "categorical", "choices": choices}
    elif info["type"] == "integer":
        knob = {"name": name, "kind": "int", "low": info["min"], "high": info["max"]}
        if name in SPECIAL_VALUES:
            knob["special_values"] = [SPECIAL_VALUES[name]]
    elif info["type"] == "float":
        knob = {"name": name, "kind": "float", "low": info["min"], "high": info["max"]}
    else:
        raise ValueError(f"knob {name}: unsupported type {info['type']!r}")
    if name in PRIORS:
        _check_prior(knob, PRIORS[name])
        knob["recommended"] = list(PRIORS[name].recommended)
        knob["recommended_source"] = PRIORS[name].source
    return knob


def _check_prior(knob: dict[str, Any], prior: Prior) -> None:
    """A prior must lie inside its knob's range (or among its choices) and name a source."""
    values, name = prior.recommended, knob["name"]
    if not prior.source.strip():
        raise ValueError(f"knob {name}: a prior needs its source")
    if knob["kind"] == "categorical":
        if not values or any(v not in knob["choices"] for v in values):
            raise ValueError(f"knob {name}: recommended {values} not among {knob['choices']}")
        return
    low, high = values if len(values) == 2 else (None, None)
    if not isinstance(low, int) or not isinstance(high, int):
        raise ValueError(f"knob {name}: recommended {values} is not an integer [low, high]")
    if not knob["low"] <= low <= high <= knob["high"]:
        raise ValueError(
            f"knob {name}: recommended [{low}, {high}] outside [{knob['low']}, {knob['high']}]"
        )


def feature(knob: dict[str, Any], value: Any) -> float:
    """A number as a float; an enum as the index of its choice (a code or the string)."""
    if knob["kind"] != "categorical":
        return float(value)
    choices = knob["choices"]
    if value in choices:
        return float(choices.index(value))
    code = int(float(value))
    if not 0 <= code < len(choices):
        raise ValueError(f"knob {knob['name']}: code {value!r} outside {choices}")
    return float(code)
