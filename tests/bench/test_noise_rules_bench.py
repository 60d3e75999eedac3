"""bench.noise_rules: one search confirmed by each rule on the real SQLite target, fixed-3
read from fixed-5's first rounds, and the summary of claims against redeployed gains."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tomllib
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench import noise, noise_rules
from runner.measurement import DEFAULT_PROTOCOL
from tuner.confirmation import Remeasured, judge
from tuner.measurement_stats import ratio_interval
from tuner.space import FloatKnob, SearchSpace
from tuner.study import Goal, Objective, StudySpec
from tuner.trial import StepKind, Trial


def spec() -> StudySpec:
    space = SearchSpace((FloatKnob("x", low=0.0, high=1.0, default=0.5),))
    return StudySpec(name="s", space=space, objectives=(Objective("tps", Goal.MAXIMIZE),))


def rounds(trial: Trial, values: list[float]) -> Remeasured:
    return Remeasured(trial, tuple({"tps": v} for v in values), (True,) * len(values), (), "tps")


def test_fixed_three_is_fixed_five_judged_on_its_first_three_rounds() -> None:
    default = Trial(1, {"x": 0.5}, step=StepKind.DEFAULT)
    best = Trial(2, {"x": 0.9})
    base, cand = [100.0, 104.0, 98.0, 101.0, 99.0], [110.0, 115.0, 108.0, 95.0, 90.0]
    found = judge(spec(), (rounds(default, base), rounds(best, cand)), True, None)
    short = noise_rules.first_rounds(spec(), found, 3, {})
    expected = ratio_interval(base[:3], cand[:3], maximize=True)
    assert short.rounds == 3 and short.interval == expected
    assert short.significant and not found.significant  # the two rules disagree here
    told = noise_rules.verdict(short, 4.0)
    assert told["claims"] and told["chosen_trial"] == 2 and told["best"] == {"x": 0.9}
    assert noise_rules.verdict(found, 6.0)["best"] == {}  # no claim: the default is kept


def test_each_rule_gets_its_stopping_and_window_and_the_fixed_ones_exactly_five_rounds() -> None:
    protocol = DEFAULT_PROTOCOL
    fixed_spec, fixed = noise_rules.settings("fixed5", spec(), protocol)
    seq_spec, seq = noise_rules.settings("sequential", spec(), protocol)
    _, windowed = noise_rules.settings("noise", spec(), protocol)
    assert not fixed_spec.stopping.sequential and fixed.confirm == 5 and fixed.confirm_max == 0
    assert seq_spec.stopping.sequential and seq.confirm == 5 and seq.confirm_window == "trials"
    assert windowed.confirm_window == "noise"


def test_the_report_workload_reaches_the_config_the_search_runs(tmp_path: Path) -> None:
    args = argparse.Namespace(system=noise.SYSTEMS["sqlite"], db_mb=1.0, measure_s=0.1,
                              warmup_s=0.0)  # fmt: skip
    options = noise_rules.WORKLOADS["report"]["sqlite"]
    path = noise.write_config(0, args, tmp_path, "study", target=options)
    written = tomllib.loads(path.read_text())["target"]
    assert written["write_fraction"] == 0.05 and written["db_mb"] == 1.0
    assert noise_rules.WORKLOADS["report"]["postgres"] == {"workload": "select-only"}


def cell(level: str, rules: dict[str, tuple[bool, float, float, float]]) -> dict[str, Any]:
    """A finished cell: per rule (claims, interval low, high, redeployed gain)."""
    out: dict[str, Any] = {"level": level, "seed": 0}
    for rule, (claims, low, high, again) in rules.items():
        out[rule] = {"claims": claims, "interval": [low, high], "ratio": (low + high) / 2,
                     "rounds": 5, "seconds": 10.0, "redeployed": {"gain": again}}  # fmt: skip
    return out


def test_the_summary_counts_gains_found_intervals_that_held_and_false_claims() -> None:
    cells = [
        cell("quiet", {"fixed5": (True, 1.1, 1.4, 1.2)}),  # found, held
        cell("quiet", {"fixed5": (False, 0.9, 1.5, 1.3)}),  # a real gain missed
        cell("quiet", {"fixed5": (True, 1.05, 1.2, 0.98)}),  # a false claim, not held
        cell("quiet", {"fixed5": (False, 0.9, 1.1, 1.0)}),  # no gain, none claimed
        cell("moderate", {"fixed5": (True, 1.2, 1.6, 1.5)}),
    ]
    rows = {(r["level"], r["rule"]): r for r in noise_rules.summarize_rules(cells)}
    quiet = rows["quiet", "fixed5"]
    assert quiet["sessions"] == 4 and quiet["claims"] == 2 and quiet["real"] == 2
    assert quiet["found"] == (0.5, 1, 2)
    assert quiet["held"] == (0.5, 1, 2) and quiet["false"] == (0.5, 1, 2)
    assert rows["moderate", "fixed5"]["false"] == (0.0, 0, 1)
    assert ("quiet", "sequential") not in rows
    nothing = noise_rules.summarize_rules([cell("quiet", {"fixed3": (False, 0.9, 1.1, 1.0)})])
    assert math.isnan(nothing[0]["found"][0]) and math.isnan(nothing[0]["held"][0])


@pytest.mark.slow
def test_a_tiny_run_confirms_one_search_by_every_rule_and_redeploys(tmp_path: Path) -> None:
    argv = ["--seeds", "1", "--levels", "quiet", "--trials", "3", "--measure-s", "0.05",
            "--warmup-s", "0.02", "--db-mb", "1", "--redeploy", "2", "--workload", "report",
            "--out", str(tmp_path)]  # fmt: skip
    assert noise_rules.main(argv) == 0
    [done] = json.loads((tmp_path / "cells.json").read_text())["cells"]
    assert done["workload"] == "report" and done["order"] == ["fixed5", "sequential", "noise"]
    assert done["tuned_s"] > 0
    for rule in noise_rules.RULES:
        got = done[rule]
        assert got["rounds"] >= (3 if rule == "fixed3" else 5) and got["seconds"] > 0
        if got["chosen"] is not None:
            assert got["redeployed"]["gain"] is None or got["redeployed"]["gain"] > 0
    assert done["fixed3"]["rounds"] == 3 and done["fixed5"]["rounds"] == 5
    assert done["fixed3"]["chosen_trial"] == done["fixed5"]["chosen_trial"]
    assert done["fixed3"]["seconds"] < done["fixed5"]["seconds"]
    assert done["sequential"]["stopped"] and not done["fixed5"]["stopped"]
    assert (tmp_path / "rules.png").stat().st_size > 0
    assert noise_rules.main(argv) == 0  # resumes: nothing run again
    assert len(json.loads((tmp_path / "cells.json").read_text())["cells"]) == 1


def test_the_decision_follows_the_rule_written_before_the_runs() -> None:
    def run(seq: tuple[bool, float, float, float], noise: tuple[bool, float, float, float],
            noise_s: float = 10.0) -> list[str]:  # fmt: skip
        cells = [cell("quiet", {"fixed5": (True, 1.2, 1.5, 1.3), "sequential": seq,
                                "noise": noise}) for _ in range(3)]  # fmt: skip
        cells.append(cell("moderate", {"fixed5": (False, 0.9, 1.2, 1.0),
                                       "sequential": (False, 0.9, 1.1, 1.0),
                                       "noise": (False, 0.9, 1.1, 1.0)}))  # fmt: skip
        for c in cells:
            c["noise"]["seconds"] = noise_s
        return noise_rules.decide(cells)[1]

    good = (True, 1.2, 1.5, 1.3)
    said = run(good, good)
    assert said[0].startswith('confirm = "sequential" default: yes') and "yes" in said[1]
    missed = run((False, 0.9, 1.5, 1.3), good)  # finds fewer than fixed5
    assert "no (found 0 < fixed5's 3)" in missed[0] and "not considered" in missed[1]
    wide_miss = run((True, 1.05, 1.15, 1.3), good)  # claims, but its interval misses
    assert "held 0% < 90%" in wide_miss[0]
    slow = run(good, good, noise_s=16.0)  # 16 s against sequential's 10 s on each session
    assert slow[0].endswith("of 3 real gains)") and "1.60x sequential's > 1.5x" in slow[1]
    totals, lone = noise_rules.decide([cell("quiet", {"fixed5": (False, 0.9, 1.1, 1.0)})])
    assert totals[0]["found"][1] == 0 and math.isnan(totals[0]["false"][0])
    assert lone[0].startswith("no decision")


def test_the_noise_windows_time_is_compared_session_by_session() -> None:
    """Two systems, one ten times slower, and one session where the noise window took 3x:
    pooled medians would compare the slowest quick session with the quickest slow one
    (here 3.0x); per session the noise window costs nothing at the median."""
    cells = []
    for seconds, level in ((20.0, "quiet"), (20.0, "quiet"), (200.0, "moderate")):
        c = cell(level, {r: (False, 0.9, 1.1, 1.0) for r in ("fixed5", "sequential", "noise")})
        for r in ("sequential", "noise"):
            c[r]["seconds"] = seconds
        cells.append(c)
    cells[1]["noise"]["seconds"] = 60.0
    assert statistics.median([20.0, 60.0, 200.0]) / statistics.median([20.0, 20.0, 200.0]) == 3
    assert noise_rules.paired_slowdown(cells, "noise", "sequential") == 1.0
    totals, said = noise_rules.decide(cells)
    assert "median time 1.00x sequential's" in said[1]
    by = {t["rule"]: t for t in totals}
    assert by["noise"]["vs_sequential"] == 1.0
    assert by["fixed5"]["vs_sequential"] == 0.5  # 10 s against 20, 20 and 200 s
    assert by["noise"]["median_s"] == 60.0  # the pooled median, shown but not tested
    shown = Console(width=200, record=True)
    shown.print(noise_rules.decision_table(totals))
    text = shown.export_text()
    assert "time / sequential" in text and "1.00x" in text and "0.50x" in text
