"""Scoring of the suite (``bench/suite_score.py``) on hand-made runs with known answers."""

from __future__ import annotations

import io
import random
from dataclasses import replace

import pytest
from rich.console import Console

from bench import suite_score as ss
from bench.contract import Measurement, MethodRun, SuiteProblem
from bench.suite_report import problem_table, summary_tables


def _problem(goal: str = "minimize", optimum: float | None = None) -> SuiteProblem:
    """``true_value = x``; a negative ``x`` is infeasible (None)."""

    def true_value(config: dict) -> float | None:
        return None if config["x"] < 0 else float(config["x"])

    def measure(config: dict, rng: random.Random) -> Measurement:
        value = true_value(config)
        return (
            Measurement("infeasible") if value is None else Measurement("completed", {"y": value})
        )

    knobs = ({"name": "x", "kind": "float", "low": -1.0, "high": 10.0},)
    return SuiteProblem(
        "hdbo:toy", "hdbo", "develop", knobs, "y", goal, (), 4, measure, true_value, optimum=optimum
    )


def _run(method: str, seed: int, reported: list[float | None]) -> MethodRun:
    configs = [{"x": 0.0}] * len(reported)
    return MethodRun(
        method=method,
        problem="hdbo:toy",
        seed=seed,
        configs=configs,
        measurements=[Measurement("completed", {"y": 0.0})] * len(reported),
        reported=[None if x is None else {"x": x} for x in reported],
        seconds=1.0,
    )


def _scored(method: str, seed: int, reported: list[float | None]) -> ss.ScoredRun:
    return ss.score_run(_problem(), _run(method, seed, reported), {})


def test_a_scored_run_keeps_the_true_curve_to_twelve_digits() -> None:
    scored = _scored("ours", 3, [None, -1.0, 1 / 3, 2.0])
    assert (scored.method, scored.problem, scored.seed) == ("ours", "hdbo:toy", 3)
    assert scored.curve == [None, None, 0.333333333333, 2.0]


def test_checkpoints_keep_marks_within_the_budget_and_add_it() -> None:
    assert ss.checkpoints(30, (10, 25, 50, 100)) == [10, 25, 30]
    assert ss.checkpoints(100, (10, 25, 50, 100)) == [10, 25, 50, 100]
    assert ss.checkpoints(5, (10,)) == [5]


def test_true_curve_scores_the_reported_configuration_not_the_sample() -> None:
    problem, cache = _problem(), {}
    curve = ss.true_curve(problem, _run("ours", 0, [None, -1.0, 3.0, 2.0]), cache)
    assert curve == [None, None, 3.0, 2.0]  # no report, an infeasible report, then values
    assert ss.worst_value([curve, [5.0, None]], 1.0) == 5.0
    assert ss.worst_value([curve], -1.0) == 2.0  # maximizing: the smallest is the worst
    assert ss.worst_value([[None]], 1.0) is None
    assert ss.filled(curve, 9.0) == [9.0, 9.0, 3.0, 2.0]


def test_trials_to_reach_and_time_to_target() -> None:
    assert ss.trials_to_reach([None, 5.0, 3.0, 1.0], 3.0, 1.0) == 3
    assert ss.trials_to_reach([None, 5.0, 3.0, 1.0], 0.5, 1.0) is None
    assert ss.trials_to_reach([1.0, 4.0], 3.0, -1.0) == 2  # maximize: 4 >= 3
    result = ss.time_to_target([[5.0, 3.0, 1.0, 1.0], [None, 9.0, 9.0, 9.0]], 3.0, 1.0, 2)
    assert result["trials"] == [2, None]
    assert result["mean_ratio"] == pytest.approx((2 / 2 + 4 / 2) / 2)  # unreached: the budget
    assert result["reached"] == 1 and result["seeds"] == 2


def test_mean_ranks_share_ties_and_use_common_seeds() -> None:
    values = {"a": {0: 1.0, 1: 2.0, 2: 0.0}, "b": {0: 1.0, 1: 1.0}, "c": {0: 3.0, 1: 3.0}}
    ranks = ss.mean_ranks(values, 1.0)
    assert ranks == {
        "a": pytest.approx((1.5 + 2) / 2),
        "b": pytest.approx((1.5 + 1) / 2),
        "c": pytest.approx(3.0),
    }
    assert ss.mean_ranks(values, -1.0)["c"] == pytest.approx(1.0)


def test_problem_summary_target_time_to_target_and_ranks() -> None:
    runs = [
        _scored("ours", 0, [None, 4.0, 2.0, 1.0]),
        _scored("ours", 1, [6.0, 6.0, 3.0, 3.0]),
        _scored("random", 0, [5.0, 5.0, 5.0, 2.0]),
        _scored("random", 1, [8.0, 8.0, 4.0, 4.0]),
        _scored("ours-full", 0, [7.0, 7.0, 7.0, 7.0]),
        _scored("ours-full", 1, [7.0, 7.0, 7.0, 7.0]),
    ]
    summary = ss.summarize_problem(_problem(optimum=0.0), runs, (2, 10))
    assert summary["checkpoints"] == [2, 4] and summary["worst"] == 8.0
    ours = summary["methods"]["ours"]
    assert ours["at"]["2"]["mean"] == pytest.approx((4.0 + 6.0) / 2)
    assert ours["mean_curve"][0] == pytest.approx((8.0 + 6.0) / 2)  # None counts as the worst
    assert ours["no_feasible"]["2"] == 0
    # the only peer is random: target = its mean at min(100, 4) = (2 + 4) / 2 = 3
    assert summary["target"] == {"ref": 4, "value": 3.0, "by": "random"}
    ttt = summary["time_to_target"]
    assert ttt["ours"]["trials"] == [3, 3] and ttt["ours"]["mean_ratio"] == pytest.approx(0.75)
    assert ttt["random"]["trials"] == [4, None] and ttt["random"]["reached"] == 1
    assert ttt["ours-full"]["mean_ratio"] == pytest.approx(1.0)
    assert summary["ranks"]["4"] == {"ours": 1.0, "random": 2.0, "ours-full": 3.0}
    norm = summary["normalized"]["ours"]
    assert norm[-1] == pytest.approx(2.0 / 8.0)  # (mean 2 - optimum 0) / (worst 8 - 0)


def test_a_problem_without_any_feasible_report_is_left_unscored() -> None:
    summary = ss.summarize_problem(_problem(), [_scored("random", 0, [None, -1.0])], (10,))
    assert summary["worst"] is None and summary["methods"] == {} and summary["target"] is None


def test_suite_summary_reach_fraction_ranks_and_noisy_twins() -> None:
    problem = _problem(goal="maximize")
    good = [_scored("ours", s, [1.0, 5.0, 9.0, 9.0]) for s in (0, 1)]
    peer = [_scored("random", s, [2.0, 4.0, 6.0, 8.0]) for s in (0, 1)]
    bad = [_scored("ours", s, [1.0, 1.0, 1.0, 1.0]) for s in (0, 1)]
    summaries = {
        "hdbo:a": ss.summarize_problem(problem, good + peer, (2,)),
        "hdbo:b~cov05": ss.summarize_problem(problem, bad + peer, (2,)),
    }
    suite = ss.summarize_suite(summaries)
    assert suite["ours"]["ours"]["problems"] == 2
    assert suite["ours"]["ours"]["reach_fraction"] == 0.5
    assert suite["ours"]["ours"]["median_ratio"] == pytest.approx((3 / 4 + 4 / 4) / 2)
    assert suite["ranks"]["50"] == {"ours": 1.5, "random": 1.5}  # at the budget, 4
    assert suite["twins"] == {"hdbo:b~cov05": {"ours": {"50": False, "100": False}}}
    assert suite["ours"]["ours"]["keeps_up"] == {"25": 0.5, "50": 0.5}  # budget 4: 9 vs 8
    assert "hdbo:a" not in suite["twins"]
    assert ss.is_peer("random") and not ss.is_peer("ours-full") and not ss.is_peer("ours")


def test_a_method_missing_on_some_problems_gets_a_summary_over_the_complete_ones() -> None:
    """A slow peer ran one problem of two: the summary says how many problems each method's
    mean rank covers, and gives reach and ranks again over the problem every method ran."""
    problem = _problem(goal="maximize")
    ours = [_scored("ours", s, [1.0, 5.0, 9.0, 9.0]) for s in (0, 1, 2)]
    rand = [_scored("random", s, [2.0, 4.0, 6.0, 8.0]) for s in (0, 1, 2)]
    slow = [_scored("slow", s, [9.0, 9.0, 9.0, 9.5]) for s in (0, 1)]  # seeds 0-1 only
    summaries = {
        "hdbo:all": ss.summarize_problem(problem, ours + rand + slow, (2,)),
        "hdbo:two": ss.summarize_problem(problem, ours + rand, (2,)),
    }
    assert summaries["hdbo:all"]["rank_seeds"] == 2 and summaries["hdbo:two"]["rank_seeds"] == 3
    suite = ss.summarize_suite(summaries)
    assert suite["complete"] == ["hdbo:all"]
    assert suite["rank_problems"] == {"ours": 2, "random": 2, "slow": 1}
    # over both problems ours' rank mixes a rank among three and one among two
    assert suite["ranks"]["100"] == {"ours": 1.5, "random": 2.5, "slow": 1.0}
    assert suite["ranks_complete"]["100"] == {"ours": 2.0, "random": 3.0, "slow": 1.0}
    assert suite["ours"]["ours"]["reach_fraction"] == 0.5  # reaches random's 8, not slow's 9.5
    assert suite["ours_complete"]["ours"] == {
        "problems": 1,
        "reach_fraction": 0.0,
        "median_ratio": pytest.approx(1.0),
        "keeps_up": {"25": 0.0, "50": 0.0},  # at the budget, 4: slow's 9.5 against 9
    }
    titles = [t.title for t in summary_tables(suite)]
    assert "Mean rank over the 1 problems every method ran" in titles
    table = problem_table("hdbo:all", summaries["hdbo:all"])
    assert "ranks over 2 common seeds" in str(table.title)
    console = Console(width=300, record=True, file=io.StringIO())
    console.print(table)
    rows = {line.split()[1]: line.split()[3] for line in console.export_text().splitlines()
            if line.startswith("│ ")}  # fmt: skip
    assert rows == {"ours": "0-2", "random": "0-2", "slow": "0-1"}


def test_keeping_up_early_is_against_the_best_peer_at_that_checkpoint() -> None:
    """Minimizing. On a: at 25 ours (5) beats both peers, at 50 the fast peer (4) is best and
    ours (6) is not as good. On b ours ties the best peer within the tolerance at 25 (slow's
    6) and at 50 (fast's 4), which keeps up. The table prints both fractions."""
    problem = replace(_problem(), budget=100)

    def curve(at25: float, at50: float) -> list[float | None]:
        return [at25] * 49 + [at50] * 51

    ours = [_scored("ours", s, []) for s in (0, 1)]
    summaries = {}
    for name, mine in (("hdbo:a", curve(5.0, 6.0)), ("hdbo:b", curve(6.0 + 1e-12, 4.0))):
        runs = [replace(r, curve=mine) for r in ours]
        runs += [replace(_scored("fast", s, []), curve=curve(7.0, 4.0)) for s in (0, 1)]
        runs += [replace(_scored("slow", s, []), curve=curve(6.0, 5.0)) for s in (0, 1)]
        summaries[name] = ss.summarize_problem(problem, runs, (10, 25, 50, 100))
    suite = ss.summarize_suite(summaries)
    assert suite["ours"]["ours"]["keeps_up"] == {"25": 1.0, "50": 0.5}
    console = Console(width=300, record=True, file=io.StringIO())
    console.print(summary_tables(suite)[0])
    text = console.export_text()
    assert "no worse than the best peer @25" in text and "no worse than the best peer @50" in text
    row = next(line for line in text.splitlines() if line.startswith("│ ours"))
    assert [cell.strip() for cell in row.split("│")[-3:-1]] == ["1.00", "0.50"]


def test_a_suite_where_every_method_ran_everywhere_has_no_second_summary() -> None:
    problem = _problem(goal="maximize")
    runs = [_scored(m, s, [1.0, 2.0, 3.0, 4.0]) for m in ("ours", "random") for s in (0, 1)]
    suite = ss.summarize_suite({"hdbo:a": ss.summarize_problem(problem, runs, (2,))})
    assert suite["complete"] == ["hdbo:a"] and suite["ranks_complete"] == suite["ranks"]
    assert not any("every method ran" in str(t.title) for t in summary_tables(suite))


def test_mean_ranks_per_family_when_the_problems_span_several() -> None:
    """Ours first on the hdbo problem, last on the db one: the suite's mean rank is a draw,
    each family's says where; a suite of one family has no family table."""
    problem = _problem(goal="maximize")
    db = replace(problem, name="db:toy", family="db")
    high = [_scored("ours", s, [1.0, 5.0, 9.0, 9.0]) for s in (0, 1)]
    low = [_scored("ours", s, [1.0, 1.0, 1.0, 1.0]) for s in (0, 1)]
    peer = [_scored("random", s, [2.0, 4.0, 6.0, 8.0]) for s in (0, 1)]
    summaries = {
        "hdbo:toy": ss.summarize_problem(problem, high + peer, (2,)),
        "db:toy": ss.summarize_problem(db, low + peer, (2,)),
    }
    suite = ss.summarize_suite(summaries)
    assert suite["ranks"]["100"] == {"ours": 1.5, "random": 1.5}
    assert suite["family_ranks"]["hdbo"]["100"] == {"ours": 1.0, "random": 2.0}
    assert suite["family_ranks"]["db"]["100"] == {"ours": 2.0, "random": 1.0}
    assert suite["family_problems"] == {
        "db": {"ours": 1, "random": 1},
        "hdbo": {"ours": 1, "random": 1},
    }
    titles = [t.title for t in summary_tables(suite)]
    assert "Mean rank over each family's problems" in titles
    one = ss.summarize_suite({"hdbo:toy": summaries["hdbo:toy"]})
    assert "Mean rank over each family's problems" not in [t.title for t in summary_tables(one)]
