"""The replay target: knobs from a table's columns, repetitions replayed in a seeded order,
replayed failures, and a real tuning session over it."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from runner.config import parse_config
from targets.registry import build_target
from targets.replay import ReplayTarget
from tuner.errors import ValidationError
from tuner.space import CategoricalKnob, OrdinalKnob
from tuner.trial import TrialStatus

TABLE = """sm_mhz,precision,latency_ms,energy_j,status,reason
1980,fp16,10.0,5.0,,
1980,fp16,11.0,5.2,,
1980,fp16,12.0,5.4,,
1410,fp16,13.0,4.0,,
1410,fp16,13.5,4.1,,
990,fp16,19.0,3.3,,
990,fp16,0,0,INFEASIBLE,latency SLO broken
1980,int8,7.0,3.0,,
1410,int8,9.0,2.5,,
990,int8,0,0,TIMED_OUT,over 60 s
"""


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "sweep.csv"
    path.write_text(TABLE, encoding="utf-8")
    return path


def replay(table: Path, **options: Any) -> ReplayTarget:
    built = build_target(
        "replay", {"table": str(table), "metrics": ["latency_ms", "energy_j"], **options}
    )
    assert isinstance(built, ReplayTarget)
    return built


def test_knobs_come_from_the_columns(table: Path) -> None:
    target = replay(table)
    sm, precision = target.describe_knobs()
    assert isinstance(sm, OrdinalKnob) and sm.choices == (990, 1410, 1980) and sm.default == 1980
    assert isinstance(precision, CategoricalKnob) and precision.choices == ("fp16", "int8")
    assert target.cells == 6 and set(target.describe_metrics()) == {"latency_ms", "energy_j"}


def test_repetitions_are_replayed_in_a_seeded_order(table: Path) -> None:
    def serve(seed: int) -> list[float]:
        with replay(table, seed=seed) as target:
            return [
                target.run_trial({"sm_mhz": 1980, "precision": "fp16"}).metrics["latency_ms"]
                for _ in range(6)
            ]

    first = serve(0)
    assert sorted(first[:3]) == sorted(first[3:]) == [10.0, 11.0, 12.0]  # each rep once a round
    assert serve(0) == first  # the same seed replays the same sequence
    assert any(serve(s) != first for s in range(1, 6))
    assert statistics.fmean(first) == 11.0


def test_recorded_failures_replay_and_unmeasured_cells_fail(table: Path) -> None:
    with replay(table) as target:
        outcomes = [target.run_trial({"sm_mhz": 990, "precision": "fp16"}) for _ in range(4)]
        assert {o.status for o in outcomes} == {TrialStatus.COMPLETED, TrialStatus.INFEASIBLE}
        assert "latency SLO broken" in {o.reason for o in outcomes}
        timed_out = target.run_trial({"sm_mhz": 990, "precision": "int8"})
        assert (timed_out.status, timed_out.reason) == (TrialStatus.TIMED_OUT, "over 60 s")
    sparse = table.with_name("sparse.csv")
    sparse.write_text("a,b,y\n1,x,1.0\n2,y,2.0\n", encoding="utf-8")
    with build_target("replay", {"table": str(sparse), "metrics": ["y"]}) as target:
        missing = target.run_trial({"a": 1, "b": "y"})
    assert missing.status is TrialStatus.FAILED
    assert missing.reason == "not measured: sparse.csv has no row for {'a': 1, 'b': 'y'}"


@pytest.mark.parametrize(
    ("text", "options", "field"),
    [
        (TABLE, {"metrics": ["watts"]}, "target.metrics.watts"),
        ("a,y\n1,2\n", {"metrics": ["y"]}, "target.table column a"),
        ("a,y\n1,2\n2,x\n", {"metrics": ["y"]}, "target.table line 3"),
        ("a,y,status\n1,2,OK\n2,3,\n", {"metrics": ["y"]}, "target.table line 2"),
        ("y\n1\n", {"metrics": ["y"]}, "target.table"),
        ("a,b,y\n1,x,2\n2,y\n", {"metrics": ["y"]}, "target.table line 3"),  # a short row
        ("a,b,y\n1,x,2,9\n", {"metrics": ["y"]}, "target.table line 2"),  # a long one
    ],
)
def test_bad_tables_name_the_field(
    tmp_path: Path, text: str, options: dict[str, Any], field: str
) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValidationError) as info:
        build_target("replay", {"table": str(path), **options})
    assert info.value.field == field


@pytest.mark.slow
def test_a_bo_session_over_a_replayed_table_finds_the_best_cell(table: Path) -> None:
    config = {
        "study": {
            "name": "replayed",
            "objectives": [{"name": "energy_j", "goal": "minimize"}],
            "outcome_constraints": ["latency_ms <= 12.5"],
            "designer": {"seed": 1, "initial_trials": 3},
        },
        "target": {"kind": "replay", "table": str(table), "metrics": ["latency_ms", "energy_j"]},
    }
    parsed = parse_config(config, {})
    from runner.session import run_session
    from server.service import TuningService
    from server.storage import SQLiteStorage

    storage = SQLiteStorage(table.with_name("s.db"))
    service = TuningService(storage)
    try:
        with parsed.target as target:
            result = run_session(service, target, parsed.spec, 6)
    finally:
        service.close()
    assert result.best is not None and result.best.config == {"sm_mhz": 1410, "precision": "int8"}


def test_named_knob_columns_leave_the_other_metric_columns_out(table: Path) -> None:
    # a sweep table records more metrics than a study uses: without ``knobs`` the unused
    # column would become a knob and split every cell into one-row cells
    loose = ReplayTarget(table=str(table), metrics=["energy_j"])
    assert loose.knob_names == ("sm_mhz", "precision", "latency_ms")
    named = ReplayTarget(table=str(table), metrics=["energy_j"], knobs=["sm_mhz", "precision"])
    assert named.knob_names == ("sm_mhz", "precision") and named.cells == 6
    assert len(named.cell_rows()[(1980, "fp16")]) == 3
    with pytest.raises(ValidationError) as info:
        ReplayTarget(table=str(table), metrics=["energy_j"], knobs=["sm_mhz", "batch"])
    assert info.value.field == "target.knobs[1]"
    assert "'batch'" in str(info.value) and "precision" in str(info.value)  # names the allowed
