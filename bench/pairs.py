"""Seed-paired head to head of one method's suite runs before and after a change.

``python -m bench.pairs BEFORE AFTER --half develop --problems db --seeds 8`` reads the
curves logs (``suite-curves.jsonl``) of two sets of ``bench.suite --out`` folders
(comma-separated; where several hold a run, the first named wins, as with ``--also``) and
compares ``--method`` (default ``ours``; ``--after-method`` when the other side is logged
under another name) seed by seed: for each problem and checkpoint (25, 50, 100 within the
budget) both sides' mean true value over the seeds both ran, and the count of seeds where
the after side is strictly better and strictly worse. The totals over problems come with a
two-sided sign test (ties dropped): the chance of a split at least that uneven between two
equally good sides. A curve's ``None`` (no feasible report yet) is worse than any value.

This is the check behind "a policy change must not make a family worse": a mean rank moves
with the peers' ranks too, the pairs see only the change.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from bench import suite_problems, yahpo_bridge
from bench.common import show
from bench.suite import CURVES_LOG, logged_curves
from bench.suite_score import SUMMARY_AT, Curve, checkpoints

Side = dict[tuple[str, int], Curve]


@dataclass(frozen=True)
class Cell:
    """One problem at one checkpoint: the means over the paired seeds and the split."""

    before: float | None
    after: float | None
    better: int
    worse: int
    pairs: int


def read_side(folders: Sequence[Path], method: str) -> Side:
    """``(problem, seed) -> curve`` of ``method`` in the folders' curves logs; the first
    folder holding a run wins."""
    out: Side = {}
    for folder in folders:
        log = folder / CURVES_LOG
        if not log.is_file():
            raise SystemExit(f"{folder}: no {CURVES_LOG} there")
        for (problem, seed, logged), run in logged_curves(log, None).items():
            if logged == method:
                out.setdefault((problem, seed), run.curve)
    return out


def better(a: float | None, b: float | None, sign: float) -> bool:
    """Whether ``a`` is strictly better than ``b`` (``sign`` 1: larger is better)."""
    if a is None:
        return False
    return b is None or sign * (a - b) > 0


def compare(
    before: Side, after: Side, problem: str, seeds: Sequence[int], at: int, sign: float
) -> Cell:
    """The cell of ``problem`` at ``at`` evaluations over the seeds both sides ran that far."""
    paired = [
        (before[(problem, s)][at - 1], after[(problem, s)][at - 1])
        for s in seeds
        if len(before.get((problem, s), ())) >= at and len(after.get((problem, s), ())) >= at
    ]
    return Cell(
        before=_mean([b for b, _ in paired]),
        after=_mean([a for _, a in paired]),
        better=sum(better(b, a, sign) for a, b in paired),
        worse=sum(better(a, b, sign) for a, b in paired),
        pairs=len(paired),
    )


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test: the chance, under even odds, of a split of ``wins +
    losses`` at least as uneven as this one (1.0 when there is nothing to split)."""
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def tables(
    before: Side, after: Side, goals: Mapping[str, str], budgets: Mapping[str, int],
    seeds: Sequence[int],
) -> list[Table]:  # fmt: skip
    """Per problem, then the totals with their sign tests (module doc)."""
    marks = sorted({m for b in budgets.values() for m in checkpoints(b, SUMMARY_AT)})
    per = Table(title="after vs before: mean true value, seeds better-worse")
    per.add_column("problem")
    for at in marks:
        per.add_column(f"@{at}", justify="right")
    totals = {at: [0, 0, 0] for at in marks}
    for problem in sorted(goals):
        sign = 1.0 if goals[problem] == "maximize" else -1.0
        row = [problem]
        for at in marks:
            if at not in checkpoints(budgets[problem], SUMMARY_AT):
                row.append("")
                continue
            cell = compare(before, after, problem, seeds, at, sign)
            if not cell.pairs:
                row.append("no pairs")
                continue
            totals[at][0] += cell.better
            totals[at][1] += cell.worse
            totals[at][2] += cell.pairs
            row.append(f"{_num(cell.before)} -> {_num(cell.after)} ({cell.better}-{cell.worse})")
        per.add_row(*row)
    total = Table(title="after vs before over the problems: seed pairs")
    for name in ("at", "after better", "after worse", "ties", "sign test p"):
        total.add_column(name, justify="right")
    for at, (won, lost, pairs) in totals.items():
        total.add_row(f"@{at}", str(won), str(lost), str(pairs - won - lost),
                      f"{sign_test(won, lost):.3f}")  # fmt: skip
    return [per, total]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="comma-separated bench.suite --out folders")
    parser.add_argument("after", help="comma-separated bench.suite --out folders")
    parser.add_argument("--half", choices=("develop", "report"), default="develop")
    parser.add_argument("--problems", help="bench.suite's --problems filter (default: all)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--method", default="ours")
    parser.add_argument("--after-method", help="the method's name on the after side")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--data", type=Path, default=suite_problems.DATA)
    parser.add_argument("--yahpo-python", type=Path, default=yahpo_bridge.DEFAULT_PYTHON)
    args = parser.parse_args(argv)
    suite = suite_problems.read_suite()
    names = suite_problems.suite_names(args.half, suite)
    if args.problems:
        names = suite_problems.select(names, args.problems.split(","))
    before = read_side([Path(f) for f in args.before.split(",")], args.method)
    after = read_side([Path(f) for f in args.after.split(",")], args.after_method or args.method)
    names = [n for n in names if any(p == n for p, _ in after)]
    if not names:
        parser.error(f"no {args.half} problem matching {args.problems!r} in {args.after}")
    problems, skipped = suite_problems.build(names, args.half, suite, args.data, args.yahpo_python)
    for name, reason in skipped.items():
        print(f"skipping {name}: {reason}")
    goals = {p.name: p.goal for p in problems}
    budgets = {p.name: p.budget for p in problems}
    for table in tables(before, after, goals, budgets, range(args.seeds)):
        show(table, args.markdown)
    return 0


def _mean(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not ``None`` (None when there are none)."""
    known = [v for v in values if v is not None]
    return statistics.mean(known) if known else None


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


if __name__ == "__main__":
    raise SystemExit(main())
