"""The closing confirmation (``runner.confirm.confirm``) and ``[session] confirm``."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from cli.main import main
from runner.confirm import confirm
from targets.base import Target, TrialOutcome
from tuner.confirmation import stored_confirmation
from tuner.measurement_stats import sequential_ratio_interval
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, StepKind, Trial, TrialStatus

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

    def run_trial(self, config: dict[str, Any], progress: Any = None) -> TrialOutcome:
        x = int(config["x"])
        self.calls.append(x)
        tps, p95 = self.script[x].pop(0)
        return TrialOutcome(TrialStatus.COMPLETED, {"tps": tps, "p95_ms": p95})


def by_value(trials: list[Trial]) -> list[Trial]:
    """The candidates best first by their measured tps (the default left out)."""
    return sorted(trials[1:], key=lambda t: -t.metrics["tps"])


def study(first: dict[int, float]) -> list[Trial]:
    """A finished study: the default (x = 0) first, then one trial per other ``x``."""
    return [
        Trial(i + 1, {"x": x}, TrialStatus.COMPLETED, {"tps": tps, "p95_ms": 5.0},
              step=StepKind.DEFAULT if x == 0 else StepKind.GLOBAL)
        for i, (x, tps) in enumerate(first.items())
    ]  # fmt: skip


def test_a_lucky_measurement_is_not_confirmed() -> None:
    """x = 3 was measured once at 190 by luck; measured again it is the default's equal."""
    trials = study({0: 100.0, 1: 120.0, 2: 110.0, 3: 190.0, 4: 90.0})
    target = Scripted(
        {
            0: [(100.0, 5.0), (104.0, 5.0), (96.0, 5.0)],
            3: [(99.0, 5.0), (105.0, 5.0), (98.0, 5.0)],
            1: [(101.0, 5.0), (95.0, 5.0), (103.0, 5.0)],
            2: [(97.0, 5.0), (100.0, 5.0), (102.0, 5.0)],
        }
    )
    done: list[tuple[int, int]] = []
    stored: list[tuple[int, Measurement]] = []
    outcome = confirm(
        cast(Target, target), SPEC, trials, by_value(trials), rounds=3,
        on_measure=lambda *a: done.append(a), store=lambda i, m: stored.append((i, m)),
    )  # fmt: skip
    # the default and the three best by their means, in alternating order round by round:
    # a machine that slows down during a round touches each pair alike over two rounds
    assert target.calls == [0, 3, 1, 2, 2, 1, 3, 0, 0, 3, 1, 2]
    assert done[-1] == (12, 12)
    assert [m.trial.config["x"] for m in outcome.measured] == [0, 3, 1, 2]
    assert outcome.measured[0].mean == pytest.approx(100.0)
    assert outcome.interval is not None and outcome.interval.low < 1.0 < outcome.interval.high
    assert not outcome.significant
    # every run is kept as a CONFIRM measurement of its trial, with its round
    assert [(i, m.round) for i, m in stored][:4] == [(1, 1), (4, 1), (2, 1), (3, 1)]
    assert all(m.kind is MeasurementKind.CONFIRM and m.at > 0 for _, m in stored)


def test_a_real_improvement_is_confirmed_and_infeasible_rounds_disqualify() -> None:
    trials = study({0: 100.0, 1: 150.0, 2: 180.0})
    target = Scripted(
        {
            0: [(100.0, 5.0), (102.0, 5.0), (98.0, 5.0)],
            2: [(200.0, 5.0), (205.0, 12.0), (210.0, 5.0)],  # breaks p95 once
            1: [(150.0, 5.0), (148.0, 5.0), (153.0, 5.0)],
        }
    )
    outcome = confirm(cast(Target, target), SPEC, trials, by_value(trials), rounds=3)
    by_x = {m.trial.config["x"]: m for m in outcome.measured}
    assert by_x[2].values == (200.0, 210.0) and by_x[2].feasible == (True, False, True)
    assert outcome.best is not None and outcome.best.trial.config == {"x": 1}
    assert outcome.interval is not None
    assert outcome.ratio == pytest.approx((150 / 100 * 148 / 102 * 153 / 98) ** (1 / 3))
    assert outcome.significant and 1.3 < outcome.interval.low < 1.5 < outcome.interval.high


def test_pairing_by_round_sees_through_a_machine_that_slows_down() -> None:
    """The machine halves its speed every round; x = 1 is truly 1.2x the default. The
    means of all rounds overlap, but each round's pair shows the 1.2x."""
    trials = study({0: 100.0, 1: 120.0})
    speeds = [1.0, 0.5, 0.25, 0.125]
    target = Scripted(
        {
            0: [(100.0 * s * (1 + 0.01 * (-1) ** i), 5.0) for i, s in enumerate(speeds)],
            1: [(120.0 * s, 5.0) for s in speeds],
        }
    )
    outcome = confirm(cast(Target, target), SPEC, trials, by_value(trials), rounds=4)
    assert outcome.interval is not None and outcome.significant
    assert outcome.interval.low > 1.15 and outcome.interval.high < 1.25


def test_a_default_that_breaks_a_constraint_is_reported_beside_the_best() -> None:
    trials = study({0: 100.0, 1: 90.0})
    target = Scripted({0: [(100.0, 20.0), (101.0, 21.0)], 1: [(90.0, 5.0), (91.0, 5.0)]})
    outcome = confirm(cast(Target, target), SPEC, trials, by_value(trials), rounds=2)
    assert not outcome.default_feasible
    assert outcome.best is not None and outcome.best.trial.config == {"x": 1}
    assert outcome.measured[0].metric_mean("p95_ms") == pytest.approx(20.5)


def test_selection_rounds_choose_and_fresh_rounds_estimate() -> None:
    """x = 1 and x = 2 are both truly 1.1x. In the selection rounds x = 2 looks 1.5x by
    luck and is chosen; its headline comes from the fresh rounds alone, where it is 1.1x."""
    trials = study({0: 100.0, 1: 120.0, 2: 118.0, 3: 90.0})
    target = Scripted(
        {
            0: [(100.0, 5.0)] * 5,
            1: [(111.0, 5.0), (109.0, 5.0)],
            2: [(150.0, 5.0), (151.0, 5.0), (111.0, 5.0), (109.0, 5.0), (110.0, 5.0)],
            3: [(90.0, 5.0), (91.0, 5.0)],
        }
    )
    stored: list[tuple[int, Measurement]] = []
    done: list[tuple[int, int]] = []
    outcome = confirm(
        cast(Target, target), SPEC, trials, by_value(trials), rounds=3, select=2,
        on_measure=lambda *a: done.append(a), store=lambda i, m: stored.append((i, m)),
    )  # fmt: skip
    assert target.calls == [0, 1, 2, 3, 3, 2, 1, 0, 0, 2, 2, 0, 0, 2]
    assert done[-1] == (14, 14)
    assert [m.trial.config["x"] for m in outcome.selection] == [0, 1, 2, 3]
    assert [m.trial.config["x"] for m in outcome.measured] == [0, 2]
    assert outcome.best is not None and outcome.best.trial.config == {"x": 2}
    assert outcome.best.values == (111.0, 109.0, 110.0)
    assert outcome.ratio == pytest.approx(1.1, rel=0.01)  # not the 1.5x that chose it
    chose = outcome.selection_intervals
    assert chose[4].ratio == pytest.approx(0.905, rel=0.01)  # x = 3
    assert chose[3].ratio == pytest.approx(1.505, rel=0.01)  # what chose x = 2
    assert outcome.intervals == {3: outcome.interval}
    assert [m.round for _, m in stored] == [1] * 4 + [2] * 4 + [3, 3, 4, 4, 5, 5]


def test_a_selection_that_finds_no_feasible_candidate_measures_no_more() -> None:
    trials = study({0: 100.0, 1: 120.0, 2: 118.0})
    target = Scripted(
        {0: [(100.0, 5.0)] * 2, 1: [(130.0, 50.0), (131.0, 5.0)], 2: [(140.0, 5.0), (141.0, 40.0)]}
    )
    outcome = confirm(cast(Target, target), SPEC, trials, by_value(trials), rounds=5, select=2)
    assert len(target.calls) == 6 and outcome.best is None and outcome.interval is None
    assert [m.trial.config["x"] for m in outcome.measured] == [0]
    assert len(outcome.selection) == 3 and not outcome.significant


def test_one_candidate_needs_no_selection() -> None:
    trials = study({0: 100.0, 1: 120.0})
    target = Scripted({0: [(100.0, 5.0)] * 3, 1: [(120.0, 5.0), (121.0, 5.0), (119.0, 5.0)]})
    outcome = confirm(cast(Target, target), SPEC, trials, by_value(trials), rounds=3, select=2)
    assert len(target.calls) == 6 and outcome.selection == ()
    assert outcome.significant and outcome.ratio == pytest.approx(1.2, rel=0.01)


GROWING = {0: [(100.0, 5.0)] * 10, 1: [(150.0, 5.0), (100.0, 5.0)] + [(125.0, 5.0)] * 8}


@pytest.mark.parametrize(("grow_to", "rounds"), [(0, 3), (4, 4), (8, 5), (3, 3)])
def test_a_wide_interval_buys_more_rounds_up_to_the_cap(grow_to: int, rounds: int) -> None:
    """x = 1 is truly 1.25x, but its first rounds scatter (1.5x, 1.0x): after 3 rounds the
    interval spans 0.74-2.04. One more round at a time runs while it is wider than 1.5
    (high / low): at 5 rounds it is 1.04-1.48 and the estimate stops, or at the cap."""
    trials = study({0: 100.0, 1: 130.0})
    target = Scripted(GROWING)
    done: list[tuple[int, int]] = []
    rows: list[tuple[int, Measurement]] = []
    outcome = confirm(
        cast(Target, target), SPEC, trials, by_value(trials), rounds=3, grow_to=grow_to,
        width=1.5, on_measure=lambda *a: done.append(a), store=lambda i, m: rows.append((i, m)),
    )  # fmt: skip
    # the rounds go on alternating their order: drift still touches each pair alike
    assert target.calls == ([0, 1, 1, 0] * 3)[: 2 * rounds]
    assert done[-1] == (2 * rounds, 2 * rounds)
    assert outcome.best is not None and outcome.best.repeats == rounds
    assert outcome.interval is not None
    assert (outcome.interval.high / outcome.interval.low <= 1.5) == (rounds == 5)
    assert outcome.significant == (rounds == 5)  # 0.95-1.61 at 4 rounds
    assert sorted({m.round for _, m in rows}) == list(range(1, rounds + 1))
    again = stored_confirmation(SPEC, trials, _stored(rows))
    assert again is not None and again.interval == outcome.interval


def test_a_precise_estimate_runs_no_more_rounds() -> None:
    trials = study({0: 100.0, 1: 120.0})
    target = Scripted({0: [(100.0, 5.0)] * 3, 1: [(120.0, 5.0), (121.0, 5.0), (119.0, 5.0)]})
    outcome = confirm(cast(Target, target), SPEC, trials, by_value(trials), rounds=3, grow_to=9)
    assert len(target.calls) == 6 and outcome.significant


def test_the_estimate_grows_after_a_selection() -> None:
    """Two selection rounds choose x = 1 over x = 2; the estimate of x = 1 grows as above."""
    trials = study({0: 100.0, 1: 130.0, 2: 110.0})
    script = {0: [(100.0, 5.0)] * 12, 1: [(140.0, 5.0)] * 2 + GROWING[1], 2: [(90.0, 5.0)] * 2}
    target = Scripted(script)
    outcome = confirm(
        cast(Target, target), SPEC, trials, by_value(trials), rounds=3, select=2, grow_to=10
    )
    assert outcome.best is not None and outcome.best.trial.config == {"x": 1}
    assert outcome.best.repeats == 5 and len(target.calls) == 6 + 10


def test_an_inconclusive_confirmation_keeps_the_default() -> None:
    """Neither candidate met p95 <= 10 in every round: the default, which did, is kept
    (not the model's favourite that the confirmation just failed)."""
    trials = study({0: 100.0, 1: 120.0, 2: 118.0})
    target = Scripted(
        {0: [(100.0, 5.0)] * 2, 1: [(130.0, 50.0), (131.0, 5.0)], 2: [(140.0, 5.0), (141.0, 40.0)]}
    )
    outcome = confirm(cast(Target, target), SPEC, trials, by_value(trials), rounds=2)
    assert outcome.best is None and outcome.default_feasible
    kept = outcome.kept(SPEC.objective.goal)
    assert kept is not None and kept.step is StepKind.DEFAULT


def test_a_candidate_confirmed_worse_than_the_default_is_not_kept() -> None:
    """Every candidate measured below the default in every round, beyond noise: the
    default is what to keep, not the least bad of them."""
    trials = study({0: 100.0, 1: 120.0, 2: 118.0})
    target = Scripted({0: [(100.0, 5.0), (102.0, 5.0), (99.0, 5.0)],
                       1: [(80.0, 5.0), (81.0, 5.0), (79.0, 5.0)],
                       2: [(70.0, 5.0), (72.0, 5.0), (69.0, 5.0)]})  # fmt: skip
    outcome = confirm(cast(Target, target), SPEC, trials, by_value(trials), rounds=3)
    assert outcome.best is not None and outcome.interval is not None
    assert outcome.interval.high < 1.0
    kept = outcome.kept(SPEC.objective.goal)
    assert kept is not None and kept.step is StepKind.DEFAULT


#: A replayed table, one run per cell: the best measured cell (x = 6) stands alone among
#: wiggles that look like noise, beside a plateau the objective's GP ranks above it.
NOISELESS = (100, 102, 99, 101, 98, 102, 106, 99, 101, 100, 104, 104.2, 104.1, 104, 103.8, 104.1)


def test_on_a_target_without_noise_the_best_measured_trial_is_confirmed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table without repeated runs is noiseless (``ReplayTarget.noiseless``): the
    confirmation's candidates are the best measured trials, so the session, ``tuner best``
    and ``tuner studies`` name the best measured one, not the model's top three."""
    table = tmp_path / "table.csv"
    table.write_text("x,tps\n" + "".join(f"{x},{v}\n" for x, v in enumerate(NOISELESS)))
    config = tmp_path / "replay.toml"
    config.write_text(
        '[study]\nname = "table"\nobjectives = [{ name = "tps", goal = "maximize" }]\n'
        "[study.designer]\nseed = 0\ninitial_trials = 16\n"
        f'[target]\nkind = "replay"\ntable = "{table}"\nmetrics = ["tps"]\n'
        f'[session]\ntrials = 16\ndb = "{tmp_path / "t.db"}"\nplot = "{tmp_path / "p.png"}"\n'
        "confirm = 2\nconfirm_select = 1\n",
        encoding="utf-8",
    )
    assert main(["tune", str(config)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    from server.storage import SQLiteStorage
    from tuner.designer.models.posterior_best import rank_by_posterior

    with SQLiteStorage(tmp_path / "t.db", read_only=True) as storage:
        trials = storage.list_trials("table")
    spec = StudySpec.from_dict({"name": "table", "objectives": [{"name": "tps"}]},
                               knobs=config_knobs(table))  # fmt: skip
    best_measured = max(trials, key=lambda t: t.metrics["tps"])
    assert best_measured.config == {"x": 6}
    model_top = rank_by_posterior(spec, trials, trials)[:3]
    assert best_measured not in model_top  # the model alone would not have confirmed it
    assert f"confirmed: trial {best_measured.id} is 1.06x (1.06–1.06) the default" in out, out
    assert main(["best", "table", "--db", str(tmp_path / "t.db"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == best_measured.id


def config_knobs(table: Path) -> tuple[Any, ...]:
    from targets.replay import ReplayTarget

    return ReplayTarget(table=str(table), metrics=["tps"]).describe_knobs()


def test_without_a_default_the_candidate_feasible_most_often_is_kept() -> None:
    """No default to fall back on and no candidate feasible in every round: the one that met
    the constraint in 3 of 4 rounds, over one that met it in 2 with a larger mean."""
    trials = [
        Trial(i, {"x": x}, TrialStatus.COMPLETED, {"tps": 100.0 + x, "p95_ms": 5.0})
        for i, x in ((1, 1), (2, 2), (3, 3))
    ]  # fmt: skip
    ranked = sorted(trials, key=lambda t: -t.metrics["tps"])
    target = Scripted(
        {
            1: [(100.0, 5.0), (101.0, 5.0), (99.0, 5.0), (100.0, 50.0)],
            2: [(150.0, 5.0), (151.0, 50.0), (149.0, 5.0), (150.0, 50.0)],
            3: [(90.0, 50.0)] * 4,
        }
    )
    outcome = confirm(cast(Target, target), SPEC, trials, ranked, rounds=4)
    assert outcome.best is None and outcome.default is None
    kept = outcome.kept(SPEC.objective.goal)
    assert kept is not None and kept.config == {"x": 1}
    never = Scripted({x: [(100.0, 50.0)] * 2 for x in (1, 2, 3)})
    assert (
        confirm(cast(Target, never), SPEC, trials, ranked, rounds=2).kept(SPEC.objective.goal)
        is None
    )


def test_tuner_best_keeps_the_default_when_the_confirmation_failed_every_candidate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from server.service import TuningService
    from server.storage import SQLiteStorage

    service = TuningService(SQLiteStorage(tmp_path / "t.db"))
    spec = replace(SPEC, designer=replace(SPEC.designer, initial_trials=5))
    service.create_study(spec)
    made = service.suggest_trials(spec.name, 3, "w")
    tps = {t.id: v for t, v in zip(made, (100.0, 190.0, 120.0), strict=True)}
    for t in made:
        service.complete_trial(spec.name, t.id, {"tps": tps[t.id], "p95_ms": 5.0})
    rounds = {1: (5.0, 50.0, 5.0), 2: (5.0, 5.0, 50.0)}  # p95 of the default, then each
    for r, p95s in rounds.items():
        for t, p95 in zip(made, p95s, strict=True):
            m = Measurement({"tps": tps[t.id], "p95_ms": p95}, MeasurementKind.CONFIRM,
                            0.0, r)  # fmt: skip
            service.add_measurements(spec.name, t.id, [m])
    assert service.get_best_trial(spec.name).id == made[0].id
    assert service.get_study(spec.name).best_trial_id == made[0].id
    service.close()
    assert main(["best", spec.name, "--db", str(tmp_path / "t.db")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "not confirmed: no candidate was feasible and stable in every round; keep the default"
        in out
    )
    assert out.endswith("the default configuration"), out


CONFIG = """
[study]
name = "confirm"
objectives = [{{ name = "ops_per_s", goal = "maximize" }}]
[study.designer]
seed = 1
initial_trials = 2
[study.stopping]
confirm = "fixed"  # exactly the session's rounds, counted below

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
def test_tune_confirms_the_best_against_the_default_on_the_real_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", str(write(tmp_path, 2))]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "confirmation rounds:" in out
    assert "2 interleaved repeats each" in out or "not confirmed: no candidate" in out
    saved = json.loads((tmp_path / "runs" / "c-confirm.json").read_text())
    # two selection rounds of the default and the three best choose one; two fresh rounds
    # of the default and that one estimate its ratio
    selection, measured = saved["selection"], saved["measured"]
    assert selection[0]["source"] == "default" and len(selection) == 4
    assert [m["trial"] for m in measured] == [selection[0]["trial"], saved["best_trial"]]
    assert saved["best_trial"] in [m["trial"] for m in selection[1:]]
    assert all(m["repeats"] == 2 and len(m["values"]) + len(m["not_counted"]) <= 2
               for m in selection + measured)  # fmt: skip
    assert all(v > 0 for m in measured for v in m["values"])
    assert not list((tmp_path / "work").iterdir()), "the target left files behind"
    # the rounds are stored with the study, as CONFIRM measurements numbered on
    assert main(["measurements", "confirm", "--db", str(tmp_path / "runs" / "tuner.db"),
                 "--kind", "confirm", "--json"]) == 0  # fmt: skip
    rows = json.loads(capsys.readouterr().out)
    completed = sum(r is not None for m in selection + measured for r in m["rounds"])
    assert len(rows) == completed == 12 - sum(len(m["not_counted"]) for m in selection + measured)
    assert {r["round"] for r in rows} <= {1, 2, 3, 4} and {r["kind"] for r in rows} == {"confirm"}


@pytest.mark.parametrize("bad", ["-1", "101", "1.5", "true", '"3"'])
def test_confirm_must_be_a_small_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    assert main(["tune", str(write(tmp_path, bad))]) == 1
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert "ValidationError" in err and "session.confirm" in err and "[0, 100]" in err


def _stored(rows: list[tuple[int, Measurement]]) -> list[Measurement]:
    return [replace(m, trial_id=i) for i, m in rows]


@pytest.mark.parametrize("select", [0, 2])
def test_the_stored_rounds_give_back_the_confirmation(select: int) -> None:
    """``tuner best`` and GetBestTrial judge from the stored CONFIRM measurements: the same
    best, interval, and selection as the live confirmation."""
    trials = study({0: 100.0, 1: 120.0, 2: 118.0, 3: 90.0})
    script = {
        0: [(100.0, 5.0), (103.0, 5.0), (98.0, 5.0), (101.0, 5.0), (99.0, 5.0)],
        1: [(111.0, 5.0), (109.0, 12.0), (112.0, 5.0), (108.0, 5.0), (110.0, 5.0)],
        2: [(150.0, 5.0), (151.0, 5.0), (121.0, 5.0), (119.0, 5.0), (118.0, 5.0)],
        3: [(90.0, 5.0), (91.0, 5.0), (92.0, 5.0), (89.0, 5.0), (90.0, 5.0)],
    }
    rows: list[tuple[int, Measurement]] = []
    live = confirm(
        cast(Target, Scripted(script)), SPEC, trials, by_value(trials), rounds=3 if select else 5,
        store=lambda i, m: rows.append((i, m)), select=select,
    )  # fmt: skip
    again = stored_confirmation(SPEC, trials, _stored(rows))
    assert again is not None and live.best is not None and again.best is not None
    assert again.best.trial.id == live.best.trial.id == 3  # x = 2
    assert again.interval == live.interval and again.intervals == live.intervals
    assert again.selection_intervals == live.selection_intervals
    assert [m.trial.id for m in again.selection] == [m.trial.id for m in live.selection]
    assert [m.feasible for m in again.measured] == [m.feasible for m in live.measured]
    assert stored_confirmation(SPEC, trials, []) is None


def test_the_service_reports_the_confirmed_best_not_the_luckiest_mean(tmp_path: Path) -> None:
    from server.service import TuningService
    from server.storage import SQLiteStorage

    service = TuningService(SQLiteStorage(tmp_path / "t.db"))
    spec = replace(SPEC, designer=replace(SPEC.designer, initial_trials=5))
    service.create_study(spec)
    made = service.suggest_trials(spec.name, 4, "w")
    assert made[0].step is StepKind.DEFAULT
    means = {made[0].id: 100.0, made[1].id: 190.0, made[2].id: 120.0, made[3].id: 110.0}
    for t in made:
        service.complete_trial(spec.name, t.id, {"tps": means[t.id], "p95_ms": 5.0})
    assert service.get_best_trial(spec.name).id == made[1].id  # by its lucky sample
    lucky, real = made[1].id, made[2].id
    rounds = {
        1: {made[0].id: 100, lucky: 101, real: 121},
        2: {made[0].id: 99, lucky: 98, real: 118},
    }
    rounds.update({r: {made[0].id: 100 + r, real: 120 + r} for r in (3, 4, 5)})
    for r, values in rounds.items():
        for trial_id, tps in values.items():
            m = Measurement({"tps": float(tps), "p95_ms": 5.0}, MeasurementKind.CONFIRM, 0.0, r)
            service.add_measurements(spec.name, trial_id, [m])
    assert service.get_best_trial(spec.name).id == real
    assert service.get_study(spec.name).best_trial_id == real
    service.close()


# -- the sequential rule ----------------------------------------------------------------------
SEQUENTIAL = replace(SPEC, stopping=replace(SPEC.stopping, confirm="sequential"))


class Noisy:
    """``tps`` of ``x = 1`` is ``gain`` times the default's, each measurement off by a
    log-normal factor of ``noise`` (seeded)."""

    def __init__(self, gain: float, noise: float = 0.1, seed: int = 0) -> None:
        import numpy as np

        self.gain, self.rng, self.noise = gain, np.random.default_rng(seed), noise
        self.calls = 0

    def measurement_window(self) -> tuple[float, float] | None:
        return None  # as ``Target``'s: a window that cannot be lengthened

    def run_trial(self, config: dict[str, Any], progress: Any = None) -> TrialOutcome:
        self.calls += 1
        tps = 100.0 * (self.gain if config["x"] else 1.0) * self.rng.lognormal(0.0, self.noise)
        return TrialOutcome(TrialStatus.COMPLETED, {"tps": float(tps), "p95_ms": 5.0})


def test_a_sequential_confirmation_measures_until_its_interval_excludes_one() -> None:
    """A true 1.3x gain: after the first 3 rounds (an interval without bounds yet) the
    rounds go on one at a time until the confidence sequence lies above 1; the stored
    rounds give back the same sequence and reason."""
    trials = study({0: 100.0, 1: 130.0})
    rows: list[tuple[int, Measurement]] = []
    found = confirm(
        cast(Target, Noisy(1.3)), SEQUENTIAL, trials, by_value(trials), rounds=3,
        width=1.1, store=lambda i, m: rows.append((i, m)),
    )  # fmt: skip
    assert found.interval is not None and found.interval.sequential and found.significant
    assert 4 <= found.rounds <= 15 and found.stopped == "the interval lies above 1"
    shorter = sequential_ratio_interval(
        [r["tps"] for r in found.measured[0].rounds[:-1] if r],
        [r["tps"] for r in found.measured[1].rounds[:-1] if r], maximize=True,
    )  # fmt: skip
    assert shorter is not None and not shorter.significant  # it stopped at the first chance
    again = stored_confirmation(SEQUENTIAL, trials, _stored(rows))
    assert again is not None and again.interval == found.interval
    assert again.stopped == found.stopped
    fixed = stored_confirmation(SPEC, trials, _stored(rows))  # the t interval: narrower
    assert fixed is not None and fixed.interval is not None and not fixed.interval.sequential
    assert fixed.interval.low > found.interval.low and fixed.stopped == ""


def test_without_a_gain_the_sequence_stops_when_narrow_or_at_its_limits() -> None:
    """No gain: the sequence keeps 1 inside and the rounds stop once it is narrower than
    the width (the ratio is settled near 1), at ``grow_to``, or when time is up."""
    trials = study({0: 100.0, 1: 100.0})
    narrow = confirm(cast(Target, Noisy(1.0, seed=2)), SEQUENTIAL, trials, by_value(trials),
                     rounds=3, width=1.5)  # fmt: skip
    assert narrow.interval is not None and not narrow.interval.significant
    assert narrow.interval.high <= 1.5 * narrow.interval.low
    assert narrow.stopped == "the interval is narrower than 1.5x" and narrow.rounds > 3
    capped = confirm(cast(Target, Noisy(1.0, seed=2)), SEQUENTIAL, trials, by_value(trials),
                     rounds=3, width=1.01, grow_to=6)  # fmt: skip
    assert capped.rounds == 6 and capped.stopped == "its round or time limit was reached"
    target = Noisy(1.0, seed=2)
    timed = confirm(cast(Target, target), SEQUENTIAL, trials, by_value(trials), rounds=3,
                    width=1.01, max_seconds=1e-9)  # fmt: skip
    assert timed.rounds == 3 and target.calls == 6 and "limit" in timed.stopped
    assert "no bound yet after 3 rounds" in str(timed.interval)


def test_the_confirmation_rule_is_a_stopping_setting_with_named_values() -> None:
    from tuner.errors import ValidationError
    from tuner.study import StoppingSettings

    assert StoppingSettings.from_dict({"confirm": "sequential"}).sequential
    assert "confirm" not in StoppingSettings().to_dict()  # older specs keep their fingerprint
    with pytest.raises(ValidationError) as info:
        StoppingSettings.from_dict({"confirm": "sprt"})
    assert info.value.field == "stopping.confirm" and "sequential" in str(info.value)
    with pytest.raises(ValidationError, match=r"session.confirm_share.*\[0, 0.9\]"):
        from runner.measurement import MeasurementProtocol

        MeasurementProtocol(confirm_share=0.95)
    assert MeasurementProtocol(confirm_share=0.5).confirm_seconds(60.0) == 60.0
    assert MeasurementProtocol(confirm_share=0).confirm_seconds(60.0) == 0.0


COMMAND_STUDY = """
[study]
name = "again"
objectives = [{{ name = "tps", goal = "maximize" }}]
{stopping}

[[study.knobs]]
name = "x"
kind = "float"
low = 0.0
high = 1.0
default = 0.0

[target]
kind = "command"
command = [{python}, "-c", {program}, "{{x}}"]
metrics = ["tps"]

[session]
trials = 4
db = "{db}"
plot = "{plot}"
confirm = {confirm}
confirm_select = 2
"""
PROGRAM = (
    "import json, random, sys; x = float(sys.argv[1]); "
    "print(json.dumps(dict(tps=100 * (1 + x) * random.uniform(0.97, 1.03))))"
)


def _command_study(tmp_path: Path, confirm: int, stopping: str = "") -> Path:
    import sys

    path = tmp_path / "again.toml"
    path.write_text(COMMAND_STUDY.format(
        python=json.dumps(sys.executable), program=json.dumps(PROGRAM), db=tmp_path / "t.db",
        plot=tmp_path / "p.png", confirm=confirm, stopping=stopping,
    ))  # fmt: skip
    return path


def _confirm_rounds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["measurements", "again", "--db", str(tmp_path / "t.db"), "--kind", "confirm",
                 "--json"]) == 0  # fmt: skip
    return list(json.loads(capsys.readouterr().out))


def test_tuner_confirm_adds_rounds_to_a_finished_studys_estimate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The session confirmed with 2 selection and 3 estimate rounds; ``tuner confirm
    --rounds 2`` measures the default and the chosen trial twice more, numbered on, and the
    verdict (here and in ``tuner best``) reads all 5 estimate rounds. On a study with the
    fixed rule it warns that rounds added after a verdict bias its t interval."""
    config = _command_study(tmp_path, 3, '\n[study.stopping]\nconfirm = "fixed"\n')
    assert main(["tune", str(config)]) == 0
    before = _confirm_rounds(tmp_path, capsys)
    assert max(r["round"] for r in before) == 5
    assert main(["confirm", str(config), "--rounds", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 more rounds of the default and trial" in out and "after 5 stored rounds" in out
    assert "bias a t interval" in out and "5 interleaved repeats each" in out
    added = [r for r in _confirm_rounds(tmp_path, capsys) if r["round"] > 5]
    assert sorted({r["round"] for r in added}) == [6, 7] and len(added) == 4
    assert main(["best", "again", "--db", str(tmp_path / "t.db")]) == 0
    assert "5 interleaved repeats each" in " ".join(capsys.readouterr().out.split())


def test_tuner_confirm_runs_a_whole_confirmation_on_a_study_never_confirmed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _command_study(tmp_path, 0, '\n[study.stopping]\nconfirm = "sequential"\n')
    assert main(["tune", str(config)]) == 0
    assert _confirm_rounds(tmp_path, capsys) == []
    assert main(["confirm", str(config), "--rounds", "4"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "a confirmation of its 3 best" in out and "bias" not in out
    assert "(sequential: stopped as" in out or "keep the default" in out
    rounds = _confirm_rounds(tmp_path, capsys)
    assert min(r["round"] for r in rounds) == 1 and max(r["round"] for r in rounds) >= 6


def test_a_config_naming_no_rule_gets_the_sequential_one_and_an_older_study_keeps_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default rule is the config's (``runner.config.DEFAULT_CONFIRM_RULE``), not the
    spec's: a study stored before it changed (no rule stored: fixed) resumes with the fixed
    rule and says so, where a config that names a different rule fails as a different spec."""
    from runner.config import load_config
    from server.service import TuningService
    from server.storage import SQLiteStorage
    from tuner.study import StoppingSettings

    config = _command_study(tmp_path, 3)
    parsed = load_config(config)
    assert parsed.spec.stopping.sequential and not parsed.rule_given
    assert parsed.protocol.confirm_window == "noise"
    older = replace(parsed.spec, stopping=StoppingSettings())
    assert "stopping" not in older.to_dict()  # as a study of an older version was stored
    with SQLiteStorage(tmp_path / "t.db") as storage:
        TuningService(storage).create_study(older)
    assert main(["tune", str(config)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "keeps the fixed confirmation rule it was created with" in out
    assert "(sequential: stopped as" not in out and "3 interleaved repeats each" in out
    with SQLiteStorage(tmp_path / "t.db", read_only=True) as storage:
        assert storage.get_study("again").spec.fingerprint() == older.fingerprint()

    named = _command_study(tmp_path, 3, '\n[study.stopping]\nconfirm = "sequential"\n')
    assert load_config(named).rule_given
    assert main(["tune", str(named)]) == 1
    assert "differs in: stopping" in " ".join(capsys.readouterr().err.split())


def test_a_study_that_cannot_confirm_keeps_the_stored_default_rule() -> None:
    """Several objectives, or phases, run no confirmation: the config's default rule is not
    written into their specs (their fingerprints stay those of older versions)."""
    from runner.config import with_default_rule
    from tuner.space import FloatKnob, SearchSpace
    from tuner.study import Goal, Objective

    space = SearchSpace((FloatKnob("x", low=0.0, high=1.0, default=0.5),))
    one = StudySpec(name="s", space=space, objectives=(Objective("tps", Goal.MAXIMIZE),))
    two = replace(one, objectives=(*one.objectives, Objective("p99", Goal.MINIMIZE)))
    assert with_default_rule(one, {})[0].stopping.sequential
    assert with_default_rule(one, {"stopping": {"confirm": "fixed"}}) == (one, True)
    assert with_default_rule(two, {}) == (two, False)
    assert with_default_rule(one, {}, phases=True) == (one, False)


# -- a confirmation round's window from the measured noise ------------------------------------
class Windowed(Noisy):
    """``Noisy`` whose measurement has a window that can be lengthened, as SQLite's."""

    kind = "windowed"

    def __init__(self, gain: float) -> None:
        super().__init__(gain)
        self.window = (0.5, 3.0)
        self.seen: list[tuple[float, float]] = []

    def measurement_window(self) -> tuple[float, float] | None:
        return self.window

    def set_measurement_window(self, warmup_s: float, measure_s: float) -> None:
        self.window = (warmup_s, measure_s)

    def run_trial(self, config: dict[str, Any], progress: Any = None) -> TrialOutcome:
        self.seen.append(self.window)
        return super().run_trial(config, progress)


def _measured(first_shift: float, between: float) -> tuple[list[Trial], list[Measurement]]:
    """A study of 6 trials, each run 10 s for a 3 s window, with 10 progress windows each
    (log spread 0.2, the first ``first_shift`` off) and the default's repeats spread by
    ``between`` beyond what its windows explain."""
    import numpy as np

    rng = np.random.default_rng(1)
    trials = [
        Trial(i, {"x": i - 1}, TrialStatus.COMPLETED, {"tps": 100.0, "p95_ms": 5.0},
              step=StepKind.DEFAULT if i == 1 else StepKind.GLOBAL,
              created_at=100.0 * i, updated_at=100.0 * i + 10.0)
        for i in range(1, 7)
    ]  # fmt: skip
    rows = []
    for t in trials:
        logs = rng.normal(0.0, 0.2, 10)
        logs[0] += first_shift
        rows += [Measurement({"tps": float(100 * np.exp(v))}, MeasurementKind.PROGRESS, 0.0,
                             trial_id=t.id) for v in logs]  # fmt: skip
    spread = math.sqrt(0.04 / 10 + between)
    rows += [Measurement({"tps": float(100 * np.exp(v))}, MeasurementKind.REPEAT, 0.0,
                         trial_id=1) for v in rng.normal(0.0, spread, 8)]  # fmt: skip
    return trials, rows


def test_a_round_is_longer_where_the_noise_averages_within_a_run() -> None:
    from runner.confirm import round_window

    target = Windowed(1.3)
    trials, rows = _measured(0.0, 0.0)
    got = round_window(cast(Target, target), SPEC, trials, rows)
    assert got is not None and got.factor > 1 and got.measure_s == 3.0 * got.factor
    assert got.warmup_s == 0.5 and "averages within a run" in got.reason
    trials, rows = _measured(0.0, 0.05)  # the runs scatter far beyond their windows
    between = round_window(cast(Target, target), SPEC, trials, rows)
    assert between is not None and between.factor == 1 and "between runs" in between.reason
    trials, rows = _measured(0.6, 0.0)  # the first window of every run is off: warming up
    warming = round_window(cast(Target, target), SPEC, trials, rows)
    assert warming is not None and warming.warmup_s == pytest.approx(0.5 + 0.3)
    assert round_window(cast(Target, Noisy(1.0)), SPEC, trials, rows) is None  # fixed window


def test_the_rounds_run_with_the_chosen_window_and_the_target_gets_its_own_back() -> None:
    from runner.confirm import RoundWindow

    target = Windowed(1.3)
    trials = study({0: 100.0, 1: 130.0})
    found = confirm(cast(Target, target), SPEC, trials, by_value(trials), rounds=3,
                    window=RoundWindow(1.0, 9.0, 3, "test"))  # fmt: skip
    assert found.rounds == 3 and set(target.seen) == {(1.0, 9.0)}
    assert target.window == (0.5, 3.0)
