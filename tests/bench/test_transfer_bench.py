"""``bench.transfer``: its tables from logged runs, and the arms' preparations (shuffled
sources keep their values, imported trials are completed to the target's knobs); a real run
on the MySQL surrogates when ``../shared/benchdata`` is there."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from bench import transfer
from bench.common import BENCHDATA
from runner.memory import MemoryAPI
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus


def _run(arm: str, seed: int, curve: list[float]) -> dict[str, object]:
    return {"target": "tpcc", "variant": "20", "arm": arm, "seed": seed, "curve": curve}


def test_the_tables_give_marks_trials_to_reach_and_ratios() -> None:
    rising = [float(i) for i in range(1, 51)]  # none: 50 at 50 on both seeds
    faster = [min(50.0, 5.0 * i) for i in range(1, 51)]  # reaches 50 at trial 10
    worse = [0.9 * v for v in rising]
    runs = [
        *(_run("none", s, rising) for s in (0, 1)),
        *(_run("transfer", s, faster) for s in (0, 1)),
        _run("unrelated", 0, worse),
    ]
    text = transfer.tables(runs)
    rows = {line.split("|")[2].strip(): line for line in text.splitlines() if "tpcc-20" in line}
    assert rows["none"].split("|")[-2].strip() == "50"
    assert rows["transfer"].split("|")[-2].strip() == "10"
    assert rows["unrelated"].split("|")[-2].strip() == "never"
    summary = {line.split("|")[1].strip(): line for line in text.splitlines()[-4:]}
    assert summary["transfer"].split("|")[2].strip() == "10"
    assert float(summary["unrelated"].split("|")[3]) == pytest.approx(0.9)


def test_shuffled_sources_keep_their_values_and_imports_fill_missing_knobs() -> None:
    trials = [
        Trial(i, {"a": i / 10}, TrialStatus.COMPLETED, {"tps": float(i)}) for i in range(1, 9)
    ] + [Trial(9, {"a": 0.9}, TrialStatus.INFEASIBLE)]
    shuffled = transfer._shuffled(trials, "tps", "salt")
    values = [t.metrics.get("tps") for t in shuffled[:8]]
    assert sorted(values) == [float(i) for i in range(1, 9)] and values != sorted(values)
    assert [t.config for t in shuffled] == [t.config for t in trials]
    assert shuffled[8].status is TrialStatus.INFEASIBLE
    api = MemoryAPI()
    knobs = [{"name": n, "kind": "float", "low": 0.0, "high": 1.0} for n in ("a", "b")]
    source = StudySpec.from_dict(
        {"name": "src", "knobs": knobs[:1], "objectives": [{"name": "tps"}]}
    )
    target = StudySpec.from_dict({"name": "t", "knobs": knobs, "objectives": [{"name": "tps"}]})
    api.create_study(source)
    api.import_trials("src", trials)
    imported = transfer._imported(target, api, ["src"])
    assert len(imported) == 8 and all(t.config["b"] == 0.5 for t in imported)
    assert statistics.mean(t.metrics["tps"] for t in imported) == 4.5


@pytest.mark.skipif(
    not (BENCHDATA / "dbtune_knobsTuningEA").exists(),
    reason=f"{BENCHDATA / 'dbtune_knobsTuningEA'} not found (bench/README.md, 'Benchmark data')",
)
def test_a_transfer_run_on_the_mysql_surrogates(tmp_path: Path) -> None:
    """A short source and a short target run: the target's first trials are the sources'
    best, and its model steps carry the weights."""
    data = str(BENCHDATA)
    source = transfer.problem("tpcc-100", data)
    spec = transfer.ours.study_spec(source, 0)
    _, trials = transfer.ours.run_study(source, spec, 0, 12)
    logged = [transfer._trial_json(t) for t in trials]
    run = transfer.run_target("ycsb", "20", "transfer", 0, 12, data, {"tpcc": logged})
    assert run["steps"][0] == "transfer"
    weights = [w for w, step in zip(run["weights"], run["steps"], strict=True)
               if step in ("global", "local", "trend")]  # fmt: skip
    assert weights and all(set(w) == {"src-tpcc", ""} for w in weights)
    assert len(run["curve"]) == 12
