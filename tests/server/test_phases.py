"""Phased sessions (PolyThrottle's two-phase mode): each phase tunes its knobs while the
others are held at their defaults or at an earlier phase's best; real subprocess target."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from runner.config import parse_config
from runner.session import run_phases
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.errors import ValidationError

PROGRAM = (
    "import json, sys; a, b, c = map(int, sys.argv[1:]); "
    "print(json.dumps(dict(y=-(a - 3) ** 2 - (b - 5) ** 2 - c, a_seen=a, b_seen=b, c_seen=c)))"
)


def config(phases: Any = None, **session: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "study": {
            "name": "two-phase",
            "objectives": [{"name": "y", "goal": "maximize"}],
            "designer": {"seed": 2, "initial_trials": 3},
            "knobs": [
                {"name": "a", "kind": "int", "low": 0, "high": 9, "default": 9},
                {"name": "b", "kind": "int", "low": 0, "high": 9, "default": 0},
                {"name": "c", "kind": "int", "low": 0, "high": 1, "default": 1},
            ],
        },
        "target": {
            "kind": "command",
            "command": [sys.executable, "-c", PROGRAM, "{a}", "{b}", "{c}"],
            "metrics": ["y", "a_seen", "b_seen", "c_seen"],
        },
        "session": dict(session),
    }
    if phases is not None:
        data["session"]["phases"] = phases
    return data


PHASES = [{"knobs": ["a"], "trials": 7}, {"knobs": ["b"], "trials": 7}]


def phased(parsed: Any, tmp_path: Path) -> list[Any]:
    """``run_phases`` on a config's target, against a fresh database."""
    service = TuningService(SQLiteStorage(tmp_path / "t.db"))
    try:
        with parsed.target as target:
            return run_phases(service, target, parsed.spec, parsed.phases)
    finally:
        service.close()


@pytest.mark.slow
def test_each_phase_tunes_its_knobs_and_holds_the_rest(tmp_path: Path) -> None:
    parsed = parse_config(config(PHASES), {})
    assert parsed.trials == 14 and [p.knobs for p in parsed.phases] == [("a",), ("b",)]
    first, second = phased(parsed, tmp_path)
    assert first.result.spec.name == "two-phase-phase1"
    assert first.result.spec.space.names == ("a",)
    assert first.held == {"b": 0, "c": 1}  # defaults
    assert all(t.metrics["b_seen"] == 0 and t.metrics["c_seen"] == 1 for t in first.result.trials)
    assert first.result.best is not None and first.result.best.config == {"a": 3}
    assert second.held == {"a": 3, "c": 1}  # phase 1's best; c was in no phase
    assert all(t.metrics["a_seen"] == 3 for t in second.result.trials)
    assert second.best_config == {"a": 3, "b": 5, "c": 1}


def test_a_phase_whose_default_no_trial_beat_hands_on_its_default(tmp_path: Path) -> None:
    """a = 3 is the optimum and its default, so every other trial of phase 1 is worse: phase 2
    holds a at 3, not at the best of the worse trials (a change measured to lose)."""
    data = config([{"knobs": ["a"], "trials": 3}, {"knobs": ["b"], "trials": 2}])
    data["study"]["knobs"][0]["default"] = 3
    parsed = parse_config(data, {})
    first, second = phased(parsed, tmp_path)
    assert first.result.best is not None and first.result.best.config != {"a": 3}
    assert first.result.best.metrics["y"] < first.result.trials[0].metrics["y"]  # the default's
    assert first.carried is first.result.default and first.best_config == {"a": 3, "b": 0, "c": 1}
    assert second.held == {"a": 3, "c": 1}
    assert all(t.metrics["a_seen"] == 3 for t in second.result.trials)


@pytest.mark.slow
def test_tune_runs_phases_from_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = tmp_path / "phases.toml"
    data = config([{"knobs": ["a", "c"], "trials": 4}, {"knobs": ["b"], "trials": 4}])
    data["session"].update(db=str(tmp_path / "t.db"), plot=str(tmp_path / "p.png"))
    lines = ["[study]", f"name = {json.dumps(data['study']['name'])}"]
    lines += ['objectives = [{ name = "y", goal = "maximize" }]']
    lines += ["knobs = " + _toml(data["study"]["knobs"])]
    lines += ["[study.designer]", "seed = 2", "initial_trials = 3", "[target]"]
    lines += [f"{k} = {_toml(v)}" for k, v in data["target"].items()]
    lines += ["[session]"] + [f"{k} = {_toml(v)}" for k, v in data["session"].items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["tune", str(path)]) == 0
    out = capsys.readouterr().out
    assert "phase 1 (two-phase-phase1): tuning a, c; holding b=0" in out
    assert "phase 2 (two-phase-phase2): tuning b; holding a=" in out
    assert "best configuration over all phases" in out
    assert (tmp_path / "p-phase1.png").exists() and (tmp_path / "p-phase2.png").exists()


def _toml(value: Any) -> str:
    import json

    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


@pytest.mark.parametrize(
    ("phases", "session", "field"),
    [
        ([{"knobs": ["z"], "trials": 3}], {}, "session.phases[0].knobs[0]"),
        (
            [{"knobs": ["a"], "trials": 3}, {"knobs": ["a"], "trials": 3}],
            {},
            "session.phases[1].knobs[0]",
        ),
        ([{"knobs": ["a"], "trials": 0}], {}, "session.phases[0].trials"),
        ([{"knobs": ["a"]}], {}, "session.phases[0]"),
        ([], {}, "session.phases"),
        (PHASES, {"trials": 10}, "session.trials"),
        (PHASES, {"confirm": 2}, "session.confirm"),
    ],
)
def test_bad_phases_name_the_field(phases: Any, session: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_config(config(phases, **session), {})
    assert info.value.field == field


def test_a_held_knob_needs_a_default() -> None:
    data = config(PHASES)
    del data["study"]["knobs"][2]["default"]
    with pytest.raises(ValidationError) as info:
        parse_config(data, {})
    assert info.value.field == "knobs.c.default"
