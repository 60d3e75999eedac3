"""Database surrogates with failures, fitted on KnobsTuningEA's ``.res`` sample logs.

``bench/dbsurrogate.py`` fits forests on the CSV samples (every row a measured value). The
100-knob MySQL sets and the PostgreSQL set are logs of KnobsTuningEA's own tuner instead
(``shared/benchdata/dbtune_knobsTuningEA/*.res``, read at run time, nothing cached on disk),
one line per configuration::

    {'knob': value, ...}|tps_<v>|lat_<v>|qps_<v>|tpsVar_<v>|...|data_<v>|[internal metrics]|65d

What was read in them (this module checks the first two points when it loads a log):

* Every line of a file holds the same knobs (PostgreSQL's last 200 lines in another order,
  a second session); every value lies in the range
  of its knob in the JSON named below (enum values as strings among ``enum_values``).
* **Failed runs.** KnobsTuningEA writes ``{knobs}|tps_<-random()>|[]|65d`` when MySQL did not
  start or the benchmark failed (``autotune/tuner.py``, LHS sampling: ``metrics[0] < 0``), and
  ``tps_0|lat_300|qps_0`` when the benchmark raised (``autotune/dbenv_bench.py``). YCSB also
  has 243 complete-looking lines with ``tps_0``, ``cpu_0`` and ``lat_0.001``: nothing ran.
  A line with ``tps <= 0`` is a failed run here. Failures are not noise: a forest classifier
  predicts them from the knobs with a 5-fold cross-validated ROC AUC of 0.995 (TPC-C), 0.996
  (YCSB) and 0.999 (PostgreSQL); TPC-C's are mostly ``completion_type = RELEASE`` (150 of
  158), PostgreSQL's ``max_worker_processes`` above ~169,000.
* ``tpcc-100``: ``mysql197_tpcc.res``, 600 lines, 100 knobs (46 integer, 54 enum) out of
  KnobsTuningEA's 197 MySQL 5.7 knobs; 158 failed (26 %); ``tps`` (transactions/s) of the
  other 442 is bimodal, 206 runs near 700 and 236 near 12,000-14,500, decided by
  ``lower_case_table_names`` (only 1 reaches the high mode; a guess, not checked: under 0
  and 2 the benchmark's table names do not resolve and most transactions fail), then by
  ``log_output`` and ``general_log``. Metric ``tps``, maximize.
* ``ycsb-100``: ``mysql197_ycsb_lhs.res``, 500 lines, the same 100 knobs; 314 failed
  (71 negative, 243 zero: 63 %); ``tps`` of the other 186 from 14,000 to 62,600. Metric
  ``tps``, maximize.
* ``seats-100``, ``tatp-100``, ``voter-100``: ``mysql197_{seats,tatp,voter}.res``, BenchBase
  SEATS (600 lines, 305 failed), TATP (433, 6 failed) and Voter (600, 9 failed) on the same
  100 knobs; metric ``tps``, maximize. Added for issue 57's report half.
* ``<set>-20`` (``RESTRICTIONS``): a 100-knob set with only its 20 most important knobs free
  (``important_knobs``: the rule, fixed in the commit that made the split) and the other 80 at
  the knob JSON's defaults; the surrogate is the 100-knob one.
* ``pg-5``: ``PG_5knob_lhs.res``, 1,317 lines, 5 PostgreSQL knobs (``max_worker_processes``,
  ``shared_buffers``, ``wal_buffers``, ``checkpoint_completion_target`` (float),
  ``backend_flush_after``); the workload is JOB (KnobsTuningEA's
  ``scripts/experiment/compare_knob_selection_pg.sh`` tunes ``Y="lat"`` for JOB), ``tps`` is a
  constant 25 on every run that completed, so the metric is ``lat``: seconds for the query
  list, minimize. 45 failed (``tps_0|lat_300``); 451 of the rest sit at 240 s, the benchmark's
  timeout, kept as a value as in ``job-5``.
* Knob ranges: the 197 MySQL knobs' ``SYSBENCH_shap_knobs.json`` (its ranges equal
  ``JOB_shap_knobs.json``'s for all 100 knobs; only the SHAP ranks differ) and
  ``PG_knobs_postgres_shap_1.json``. Kinds and encodings as in ``bench/dbsurrogate.py``
  (``json_knob``): ``integer`` -> int knob, ``float`` -> float knob, ``enum`` -> categorical
  over the sorted ``enum_values``, the surrogate seeing the index (KnobsTuningEA's
  ``get_states``). One range is cut: ``innodb_online_alter_log_max_size`` runs to
  1.8e19 (2^64), past what int64-based peers (scikit-optimize, ConfigSpace) can hold, so its
  high is ``INT64_MAX``; the forests still see the logged values.
* Special values (LlamaTune's special-value bias): the MySQL ones of ``bench/dbsurrogate.py``,
  and PostgreSQL's ``wal_buffers = -1`` (sized from ``shared_buffers``) and
  ``backend_flush_after = 0`` (no forced writeback), from the PostgreSQL manual's
  "Write Ahead Log" and "Resource Consumption" sections (not re-read here).

Surrogate: a ``RandomForestClassifier(n_estimators=100, random_state=0)`` on "failed" over all
lines, and a ``RandomForestRegressor(n_estimators=100, random_state=0)`` on the metric over the
runs that did not fail. A configuration whose predicted probability of failing is at least
0.5 is infeasible (``predict`` returns None); otherwise the regressor's prediction is its
value. ``validate`` gives the 5-fold cross-validated R^2 and AUC that
``tests/bench/test_suite_problems.py`` checks and ``bench/README.md`` ("The suite") lists.

Source: ``PKU-DAIR/KnobsTuningEA@13290f8`` (no license file: internal benchmarking only).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from bench.dbsurrogate import FOLDER, TREES, encode, feature, json_knob
from tuner.space import Config

INT64_MAX = 2**63 - 1
FAIL_PROBABILITY = 0.5
PG_SPECIAL_VALUES = {"wal_buffers": -1, "backend_flush_after": 0}


@dataclass(frozen=True)
class ResSet:
    """One ``.res`` log and how to read it.

    Attributes:
        name: Problem name.
        log: The ``.res`` file.
        knobs_json: Knob ranges and types.
        metric: The metric's name in the study.
        field: The metric's field in the log (``tps`` or ``lat``).
        goal: ``maximize`` or ``minimize``.
        embed_dims: LlamaTune embedding dimension (16 for >= 20 knobs, 4 for 5 knobs).
    """

    name: str
    log: str
    knobs_json: str
    metric: str
    field: str
    goal: str
    embed_dims: int


def _mysql_tps(name: str, log: str) -> ResSet:
    """A KnobsTuningEA MySQL 5.7 log over the 100 SYSBENCH SHAP knobs, throughput maximized."""
    return ResSet(name, log, "SYSBENCH_shap_knobs.json", "tps", "tps", "maximize", 16)


RES_SETS = {
    s.name: s
    for s in (
        _mysql_tps("tpcc-100", "mysql197_tpcc.res"),
        _mysql_tps("ycsb-100", "mysql197_ycsb_lhs.res"),
        _mysql_tps("seats-100", "mysql197_seats.res"),
        _mysql_tps("tatp-100", "mysql197_tatp.res"),
        _mysql_tps("voter-100", "mysql197_voter.res"),
        ResSet(
            "pg-5",
            "PG_5knob_lhs.res",
            "PG_knobs_postgres_shap_1.json",
            "latency",
            "lat",
            "minimize",
            4,
        ),
    )
}


@dataclass(frozen=True)
class Restriction:
    """A 100-knob set with only its ``count`` most important knobs free (``important_knobs``),
    the others held at the knob JSON's ``default`` (KnobsTuningEA's defaults: MySQL's,
    except a few such as a 13 GB ``innodb_buffer_pool_size``)."""

    name: str
    base: str
    count: int


RESTRICTIONS = {
    r.name: r
    for r in (
        Restriction("tpcc-20", "tpcc-100", 20),
        Restriction("ycsb-20", "ycsb-100", 20),
        Restriction("seats-20", "seats-100", 20),
        Restriction("tatp-20", "tatp-100", 20),
        Restriction("voter-20", "voter-100", 20),
    )
}


@dataclass(frozen=True)
class ResSamples:
    """Knobs and encoded lines of one log.

    Attributes:
        knobs: Knob dictionaries (``tuner.space.knob_from_dict`` form), in the log's order.
        X: ``n x d`` features (numbers, enum indices).
        y: ``n`` metric values (NaN on failed runs).
        failed: ``n`` flags: the run failed (``tps <= 0``).
    """

    knobs: tuple[dict[str, Any], ...]
    X: np.ndarray
    y: np.ndarray
    failed: np.ndarray


@dataclass(frozen=True)
class ResSurrogate:
    """A failure classifier and a metric regressor over the same features."""

    knobs: tuple[dict[str, Any], ...]
    classifier: Any
    regressor: Any

    def predict(self, config: Config) -> float | None:
        """The predicted metric, or None when the configuration is predicted to fail."""
        x = np.array([encode(self.knobs, config)])
        if self._fail_probability(x) >= FAIL_PROBABILITY:
            return None
        return float(self.regressor.predict(x)[0])

    def _fail_probability(self, x: np.ndarray) -> float:
        classes = list(self.classifier.classes_)
        if True not in classes:
            return 0.0
        return float(self.classifier.predict_proba(x)[0][classes.index(True)])


def read_log(path: Path) -> list[tuple[dict[str, Any], dict[str, float]]]:
    """``(configuration, fields)`` per line of a ``.res`` log (``tps``, ``lat``, ...)."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("|")
        try:
            config = ast.literal_eval(parts[0])
            fields = {}
            for part in parts[1:]:
                if part.startswith("[") or "_" not in part:
                    continue  # internal metrics vector, "65d"
                key, value = part.rsplit("_", 1)
                fields[key] = float(value)
        except (ValueError, SyntaxError) as err:
            raise ValueError(f"{path.name} line {number}: {err}") from err
        if not isinstance(config, dict) or "tps" not in fields:
            raise ValueError(f"{path.name} line {number}: no configuration or no tps field")
        out.append((config, fields))
    return out


def load_res(data_dir: Path, name: str) -> ResSamples:
    """Read one log and its knob ranges from ``data_dir/dbtune_knobsTuningEA``."""
    spec = RES_SETS[name]
    folder = data_dir / FOLDER
    ranges = json.loads((folder / spec.knobs_json).read_text())
    lines = read_log(folder / spec.log)
    names = list(lines[0][0])
    knobs = tuple(_knob(n, ranges[n]) for n in names)
    rows, values, failed = [], [], []
    for number, (config, fields) in enumerate(lines, start=1):
        if set(config) != set(names):
            raise ValueError(f"{spec.log} line {number}: knobs differ from the first line's")
        rows.append([feature(k, config[k["name"]]) for k in knobs])
        bad = fields["tps"] <= 0
        failed.append(bad)
        values.append(np.nan if bad else fields[spec.field])
    return ResSamples(knobs, np.array(rows), np.array(values), np.array(failed))


def fit(samples: ResSamples, seed: int = 0, trees: int = TREES) -> ResSurrogate:
    """The classifier on all lines, the regressor on the lines that did not fail."""
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    ok = ~samples.failed
    classifier = RandomForestClassifier(n_estimators=trees, random_state=seed)
    regressor = RandomForestRegressor(n_estimators=trees, random_state=seed)
    return ResSurrogate(
        samples.knobs,
        classifier.fit(samples.X, samples.failed),
        regressor.fit(samples.X[ok], samples.y[ok]),
    )


def validate(samples: ResSamples, folds: int = 5, seed: int = 0) -> dict[str, float]:
    """Cross-validated quality: the regressor's R^2 on completed runs, the classifier's AUC
    and accuracy on all runs (``folds``-fold, shuffled with ``seed``)."""
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
    from sklearn.model_selection import KFold, cross_val_predict, cross_val_score

    ok = ~samples.failed
    split = KFold(folds, shuffle=True, random_state=seed)
    regressor = RandomForestRegressor(n_estimators=TREES, random_state=seed)
    r2 = cross_val_score(regressor, samples.X[ok], samples.y[ok], cv=split, scoring="r2")
    out = {"r2": float(np.mean(r2)), "failed": float(np.mean(samples.failed))}
    if samples.failed.any():
        classifier = RandomForestClassifier(n_estimators=TREES, random_state=seed)
        auc = cross_val_score(classifier, samples.X, samples.failed, cv=split, scoring="roc_auc")
        guess = cross_val_predict(classifier, samples.X, samples.failed, cv=split)
        out["auc"] = float(np.mean(auc))
        out["accuracy"] = float(np.mean(guess == samples.failed))
    return out


@lru_cache(maxsize=4)
def surrogate(data_dir: Path, name: str) -> ResSurrogate:
    """The fitted surrogate of a set (cached per process: fitting takes seconds)."""
    return fit(load_res(data_dir, name))


def important_knobs(model: ResSurrogate, count: int) -> list[str]:
    """The rule that picks a restriction's knobs, fixed before any run on them (issue 57):
    the ``count`` knobs of the highest mean of the two forests' impurity importances (each
    sums to 1 over the knobs; the classifier's is 0 on a set without failures), ties by
    name. Both forests count: on these logs a few knobs decide whether MySQL runs at all
    (TPC-C's ``completion_type``), others how fast."""
    score = np.asarray(model.regressor.feature_importances_, dtype=float)
    if len(model.classifier.classes_) > 1:
        score = (score + np.asarray(model.classifier.feature_importances_, dtype=float)) / 2
    names = [k["name"] for k in model.knobs]
    order = sorted(range(len(names)), key=lambda i: (-score[i], names[i]))
    return [names[i] for i in order[:count]]


def restricted(
    data_dir: Path, name: str
) -> tuple[tuple[dict[str, Any], ...], dict[str, Any], Callable[[Config], float | None]]:
    """A restriction's free knobs, the values of the held ones, and its predictor."""
    spec = RESTRICTIONS[name]
    base = RES_SETS[spec.base]
    model = surrogate(data_dir, spec.base)
    free = set(important_knobs(model, spec.count))
    ranges = json.loads((data_dir / FOLDER / base.knobs_json).read_text())
    held = {k["name"]: _default(k, ranges[k["name"]]) for k in model.knobs if k["name"] not in free}

    def predict(config: Config) -> float | None:
        return model.predict({**held, **config})

    return tuple(k for k in model.knobs if k["name"] in free), held, predict


def _default(knob: dict[str, Any], info: dict[str, Any]) -> Any:
    """The JSON's default as a value of ``knob`` (an enum's choice is matched as text)."""
    default = info["default"]
    if knob["kind"] == "categorical":
        return next(c for c in knob["choices"] if str(c) == str(default))
    return default


def _knob(name: str, info: dict[str, Any]) -> dict[str, Any]:
    knob = json_knob(name, info, sorted_enums=True)
    if knob["kind"] == "int" and knob["high"] > INT64_MAX:
        knob["high"] = INT64_MAX
    if name in PG_SPECIAL_VALUES:
        knob["special_values"] = [PG_SPECIAL_VALUES[name]]
    return knob
