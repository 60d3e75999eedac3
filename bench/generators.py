"""Which step made each configuration of ours' suite runs: one line of letters per run.

``python -m bench.generators OUT --method ours --problem db:tatp-20 --seeds 0,1,2`` reads
``OUT/suite-runs.jsonl`` (``bench.suite``'s full log; ``MethodRun.generators``, logged by
ours since issue 57) and prints, for each matching run, its trials' steps
(``tuner.trial.StepKind``) as letters, ``LETTERS``' legend first. A run logged before the
field existed has none and is named as such.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from pathlib import Path

from bench.contract import MethodRun
from bench.suite import RUNS_LOG, run_from_json
from tuner.trial import StepKind

#: One letter per step kind (upper case: a model or design step; lower case: a stand-in).
LETTERS = {
    StepKind.DEFAULT: "D",
    StepKind.SOBOL: "S",
    StepKind.PRIOR: "P",
    StepKind.GLOBAL: "G",
    StepKind.LOCAL: "L",
    StepKind.TREND: "T",
    StepKind.RANDOM: "R",
    StepKind.FILL_IN: "f",
    StepKind.FALLBACK: "b",
    StepKind.IMPORT: "I",
    StepKind.FOREST: "F",
    StepKind.EXPLORE: "E",
    StepKind.TRANSFER: "X",
}


def letters(generators: Iterable[str]) -> str:
    """A run's steps as letters; a step kind this module does not know is ``?``."""
    known = {kind.value: letter for kind, letter in LETTERS.items()}
    return "".join(known.get(name, "?") for name in generators)


def matching(
    runs: Iterable[MethodRun], method: str, problem: str, seeds: Sequence[int]
) -> list[MethodRun]:
    """The runs of ``method`` on ``problem`` with one of ``seeds``, by seed; the last logged
    run of a seed wins (``--resume`` appends)."""
    found = {r.seed: r for r in runs if r.method == method and r.problem == problem}
    return [found[s] for s in sorted(found) if s in seeds]


def lines(runs: Sequence[MethodRun]) -> list[str]:
    """The legend, then one line per run (module doc)."""
    legend = ", ".join(f"{letter} {kind.value}" for kind, letter in LETTERS.items())
    out = [legend]
    for run in runs:
        steps = letters(run.generators) if run.generators else "(not logged: an older run)"
        out.append(f"{run.method} {run.problem} seed {run.seed}  {steps}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a bench.suite --out folder")
    parser.add_argument("--method", default="ours")
    parser.add_argument("--problem", required=True)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated (default 0,1,2)")
    args = parser.parse_args(argv)
    log = args.out / RUNS_LOG
    if not log.is_file():
        parser.error(f"no {RUNS_LOG} in {args.out}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    with log.open() as handle:
        runs = matching((run_from_json(line) for line in handle if line.strip()), args.method,
                        args.problem, seeds)  # fmt: skip
    if not runs:
        parser.error(f"no {args.method} run of {args.problem} with seeds {args.seeds} in {log}")
    print("\n".join(lines(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
