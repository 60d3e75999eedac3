"""Re-measuring what a session found (``server.session.confirm``) and ``[session] confirm``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from server.cli import main
from server.session import SessionResult, confirm, summarize
from targets.base import Target, TrialOutcome
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial, TrialStatus

SPEC = StudySpec.from_dict(
    {
        "name": "noisy",
        "knobs": [{"name": "x", "kind": "int", "low": 0, "high": 9, "default": 0}],
        "objectives": [{"name": "tps", "goal": "maximize"}],
        "outcome_constraints": ["p95_ms <= 10"],
    }
)


class Scripted:
    """A target whose measurements of each ``x`` come from a list, in turn."""

    def __init__(self, script: dict[int, list[tuple[float, float]]]) -> None:
        self.script = {x: list(values) for x, values in script.items()}
        self.calls: list[int] = []

    def run_trial(self, config: dict[str, Any]) -> TrialOutcome:
        x = int(config["x"])
        self.calls.append(x)
        tps, p95 = self.script[x].pop(0)
        return TrialOutcome(TrialStatus.COMPLETED, {"tps": tps, "p95_ms": p95})


def session(first: dict[int, float]) -> SessionResult:
    """A finished study: the default (x = 0) first, then one trial per other ``x``."""
    trials = [
        Trial(i + 1, {"x": x}, TrialStatus.COMPLETED, {"tps": tps, "p95_ms": 5.0},
              step=StepKind.DEFAULT if x == 0 else StepKind.GLOBAL)
        for i, (x, tps) in enumerate(first.items())
    ]  # fmt: skip
    return summarize(SPEC, trials)


def test_a_lucky_measurement_is_not_confirmed() -> None:
    """x = 3 was measured once at 190 by luck; measured again it is the default's equal."""
    result = session({0: 100.0, 1: 120.0, 2: 110.0, 3: 190.0, 4: 90.0})
    assert result.best is not None and result.best.config == {"x": 3}
    target = Scripted(
        {
            0: [(100.0, 5.0), (104.0, 5.0), (96.0, 5.0)],
            3: [(99.0, 5.0), (105.0, 5.0), (98.0, 5.0)],
            1: [(101.0, 5.0), (95.0, 5.0), (103.0, 5.0)],
            2: [(97.0, 5.0), (100.0, 5.0), (102.0, 5.0)],
        }
    )
    done: list[tuple[int, int]] = []
    outcome = confirm(cast(Target, target), result, repeats=3, on_measure=lambda *a: done.append(a))
    # the default and the three best, round-robin: drift touches every one alike
    assert target.calls == [0, 3, 1, 2] * 3
    assert done[-1] == (12, 12)
    assert [m.trial.config["x"] for m in outcome.measured] == [0, 3, 1, 2]
    assert outcome.measured[0].mean == pytest.approx(100.0)
    assert outcome.best is not None and outcome.best.trial.config == {"x": 3}
    assert outcome.ratio == pytest.approx(302 / 300)
    assert not outcome.significant


def test_a_real_improvement_is_confirmed_and_infeasible_repeats_disqualify() -> None:
    result = session({0: 100.0, 1: 150.0, 2: 180.0})
    target = Scripted(
        {
            0: [(100.0, 5.0), (102.0, 5.0), (98.0, 5.0)],
            2: [(200.0, 5.0), (205.0, 12.0), (210.0, 5.0)],  # breaks p95 once
            1: [(150.0, 5.0), (148.0, 5.0), (153.0, 5.0)],
        }
    )
    outcome = confirm(cast(Target, target), result, repeats=3)
    by_x = {m.trial.config["x"]: m for m in outcome.measured}
    assert by_x[2].values == (200.0, 210.0) and len(by_x[2].reasons) == 1
    assert outcome.best is not None and outcome.best.trial.config == {"x": 1}
    assert outcome.ratio == pytest.approx(451 / 300)
    assert outcome.significant


CONFIG = """
[study]
name = "confirm"
objectives = [{{ name = "ops_per_s", goal = "maximize" }}]
[study.designer]
seed = 1
initial_trials = 2

[target]
kind = "sqlite"
db_mb = 1
measure_s = 0.1
warmup_s = 0.05
knobs = ["journal_mode", "synchronous", "cache_size"]
workdir = "{workdir}"

[session]
trials = 4
db = "{db}"
plot = "{plot}"
confirm = {confirm}
"""


def write(tmp_path: Path, confirm: object) -> Path:
    (tmp_path / "work").mkdir(exist_ok=True)
    path = tmp_path / "c.toml"
    path.write_text(
        CONFIG.format(
            workdir=tmp_path / "work",
            db=tmp_path / "runs" / "tuner.db",
            plot=tmp_path / "runs" / "c.png",
            confirm=confirm,
        )
    )
    return path


@pytest.mark.slow
def test_tune_re_measures_the_default_and_the_best_on_the_real_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", str(write(tmp_path, 2))]) == 0
    out = capsys.readouterr().out
    assert "re-measurements:" in out and ("confirmed" in out or "no candidate" in out)
    saved = json.loads((tmp_path / "runs" / "c-confirm.json").read_text())
    measured = saved["measured"]
    assert measured[0]["source"] == "default" and len(measured) == 4  # default + 3 best
    assert all(m["repeats"] == 2 and len(m["values"]) + len(m["not_counted"]) == 2
               for m in measured)  # fmt: skip
    assert all(v > 0 for m in measured for v in m["values"])
    assert not list((tmp_path / "work").iterdir()), "the target left files behind"


@pytest.mark.parametrize("bad", ["-1", "101", "1.5", "true", '"3"'])
def test_confirm_must_be_a_small_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    assert main(["tune", str(write(tmp_path, bad))]) == 1
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert "ValidationError" in err and "session.confirm" in err and "[0, 100]" in err
