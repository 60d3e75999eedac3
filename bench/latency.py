"""Suggest latency of one sequential BO step: ours against scikit-optimize, Optuna's GPSampler
and Ax, on continuous boxes and on mixed spaces shaped like MySQL's knobs.

Run as ``python -m bench.latency [--quick] [--reps R] [--kinds box,mixed] [--dims 6,16,100]
[--sizes 50,100,200,1000] [--cells KIND:D:N,...] [--peers skopt,optuna,ax] [--cap S]``.
The kinds ``box+c`` and ``mixed+c`` (not in the default grid) are the same spaces and
histories under one outcome constraint; GPSampler and Ax are given the same bound, and
scikit-optimize, which has no outcome constraints, does not run there
(``bench/latency_spaces.py``, ``bench/latency_peers.py``).

Every method sees the same history: ``n`` configurations drawn uniformly from the space
(seeded) with noisy values (``bench/latency_spaces.py``: the ``box`` of float knobs and the
``mixed`` space of int, float and categorical knobs). What is timed is what a study pays
between a client reporting trial ``n`` and receiving trial ``n + 1``:

* **ours**: ``make_designer(spec, cache).suggest(1, completed[:n], [])`` on the space's
  ``StudySpec`` (product defaults, no embedding), with a ``FitCache`` that already holds the
  hyperparameters fitted at ``n - 1`` (the server keeps one cache per process). On the box
  that is a warm-started GP fit + qLogNEI + multi-start L-BFGS-B; on the mixed space the GP
  has a categorical kernel and the acquisition is maximized by the local search over valid
  configurations (``tuner/designer/acquisition/local_search.py``). Below 200 observations
  every step fits the GP's hyperparameters (warm, from the cache); from 200 on a study fits
  again only every ``refit_interval(n)`` observations (10 % of ``n``;
  ``tuner/designer/models/model.py``), so the timed steps keep the hyperparameters; one
  more step is timed whose cache was fitted ``refit_interval(n)`` observations before (a
  step that fits), and the table adds it ("ours refit s") and the mean over a refit
  cycle ("ours mean s");
* **peers** (``bench/latency_peers.py``, one child process per peer and cell): scikit-optimize
  (``tell`` + ``ask``), Optuna's ``GPSampler`` (``ask``) and Ax's default generation strategy
  (``get_next_trials(1)``), each told the same points.

Each cell times ``reps`` consecutive steps ``n, n + 1, ...``, interleaved (ours, skopt,
optuna, ax, ours, ...) so that load changes on the machine hit every method, and reports
medians and the ratios peer/ours (> 1: ours is faster). A peer step that runs past ``--cap``
seconds is killed: the cell reads "> cap (capped)", and that peer is skipped at the larger
``n`` of the same space and ``d``, with the reason in the table. Results go to
``bench/results/latency.json`` (``latency-TAG.json`` with ``--tag TAG``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import Progress

from bench import latency_spaces
from bench.common import (
    completed_trial,
    console,
    limit_threads,
    load_note,
    machine_info,
    show,
    write_json,
)
from bench.latency_peers import (
    CONSTRAINED_PEERS,
    PEERS,
    PeerCapped,
    PeerError,
    PeerProcess,
    PeerUnavailable,
    probe,
)
from bench.latency_report import (
    Cell,
    PeerTimes,
    cells_from_json,
    goal_lines,
    peers_in,
    results_table,
    to_json,
)
from tuner.designer import Designer, FitCache, make_designer
from tuner.designer.models.model import refit_interval
from tuner.trial import Trial

CAP_S = 60.0  # default per-step limit of a peer
SETUP_CAP_S = 300.0  # default limit on telling a peer n - 1 points (Ax: ~0.1 s a point)


@dataclass(frozen=True)
class Preset:
    """Default repetitions, space kinds, history sizes and dimensions of a run."""

    reps: int
    kinds: tuple[str, ...]
    sizes: tuple[int, ...]
    dims: tuple[int, ...]


FULL = Preset(reps=5, kinds=("box", "mixed"), sizes=(50, 100, 200, 1000), dims=(6, 16, 100))
QUICK = Preset(reps=2, kinds=("box", "mixed"), sizes=(20,), dims=(6,))


@dataclass(frozen=True)
class PeerSettings:
    """Which peers run and how.

    Attributes:
        python: Interpreter per peer (the environment with its library).
        unavailable: Peer -> why it cannot run (probed once per run).
        cap: Seconds a peer step may take before the child is killed; the untimed warm-up
            step at ``n - 1`` may take twice as long (Optuna's is a fit from scratch).
        setup_cap: Seconds a peer may take to be told the first ``n - 1`` points.
        threads: Threads for the children's torch and BLAS (None: their defaults).
    """

    python: dict[str, str]
    unavailable: dict[str, str]
    cap: float = CAP_S
    setup_cap: float = SETUP_CAP_S
    threads: int | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.python)


def time_cell(
    kind: str,
    d: int,
    n: int,
    reps: int,
    peers: PeerSettings,
    seed: int = 0,
    cold: bool = False,
    skip: dict[str, str] | None = None,
) -> Cell:
    """Time ``reps`` sequential steps at ``n, n + 1, ...`` completed trials for every method.

    ``skip``: peer -> the reason it is not run in this cell.
    """
    configs, values = latency_spaces.history(kind, d, n + reps - 1, seed)
    bound = None
    if latency_spaces.constrained(kind):
        bound = latency_spaces.constraint_values(kind, d, configs, seed)
    spec = latency_spaces.spec(kind, d, seed)
    metrics = [{"f": v} for v in values]
    for row, c in zip(metrics, bound or [], strict=False):  # none without the constraint
        row[latency_spaces.CONSTRAINT_METRIC] = c
    pairs = enumerate(zip(configs, metrics, strict=True))
    trials = [completed_trial(i + 1, config, row, "") for i, (config, row) in pairs]
    cell = Cell(kind, d, n)
    if cold:  # a fresh cache: the first suggestion after a server restart
        start = time.perf_counter()
        make_designer(spec, FitCache()).suggest(1, trials[:n], [])
        cell.ours_cold = time.perf_counter() - start
    designer = make_designer(spec, FitCache())
    designer.suggest(1, trials[: n - 1], [])  # warms the cache, untimed
    setup = {
        "knobs": latency_spaces.knobs(kind, d),
        "configs": configs[: n - 1],
        "values": values[: n - 1],
        "seed": seed,
    }
    skip = dict(skip or {})
    if bound is not None:
        setup["constraint"] = {
            "metric": latency_spaces.CONSTRAINT_METRIC,
            "bound": latency_spaces.CONSTRAINT_BOUND,
            "values": bound[: n - 1],
        }
        for name in peers.names:
            if name not in CONSTRAINED_PEERS:
                skip.setdefault(name, "n/a: no outcome constraints")
    running: dict[str, PeerProcess] = {}
    try:
        for name in peers.names:
            cell.peers[name], process = _start_peer(name, peers, setup, skip.get(name))
            if process is not None:
                running[name] = process
        for m in range(n, n + reps):
            seconds, source = _time_ours(designer, trials[:m])
            cell.ours.append(seconds)
            cell.ours_sources.append(source)
            for name in list(running):
                told = None if bound is None else bound[m - 1]
                point = (configs[m - 1], values[m - 1], told)
                if not _step_peer(running[name], cell.peers[name], point, peers.cap):
                    running.pop(name).close()
    finally:
        for process in running.values():
            process.close()
    cell.refit_every = refit_interval(n)
    if cell.refit_every > 1:  # a step that fits: hyperparameters from refit_every trials ago
        stale = make_designer(spec, FitCache())
        stale.suggest(1, trials[: n - cell.refit_every], [])  # untimed
        cell.ours_refit, _ = _time_ours(stale, trials[:n])
    return cell


def run_latency(
    cells: list[tuple[str, int, int]],
    reps: int,
    peers: PeerSettings,
    seed: int = 0,
    cold: bool = False,
    progress: Progress | None = None,
) -> list[Cell]:
    """Every ``(kind, d, n)`` cell in order; a peer capped at some ``n`` is skipped at larger
    ``n`` of the same kind and ``d``."""
    out: list[Cell] = []
    capped_at: dict[tuple[str, str, int], int] = {}
    task = progress.add_task("latency", total=len(cells)) if progress else None
    for kind, d, n in cells:
        if progress is not None and task is not None:
            progress.update(task, description=f"{kind} d={d} n={n}")
        skip = {
            peer: f"skipped: capped at n={capped_at[(peer, kind, d)]}"
            for peer in peers.names
            if (peer, kind, d) in capped_at and capped_at[(peer, kind, d)] < n
        }
        cell = time_cell(kind, d, n, reps, peers, seed, cold, skip)
        for peer, times in cell.peers.items():
            if times.capped is not None:
                capped_at.setdefault((peer, kind, d), n)
        out.append(cell)
        if progress is not None and task is not None:
            progress.advance(task)
    return out


def grid(
    kinds: tuple[str, ...], dims: tuple[int, ...], sizes: tuple[int, ...]
) -> list[tuple[str, int, int]]:
    """The cells of a full grid, kind by kind, then ``d``, then ``n``."""
    return [(kind, d, n) for kind in kinds for d in dims for n in sorted(sizes)]


def parse_cells(text: str) -> list[tuple[str, int, int]]:
    """``KIND:D:N,...`` -> cells, sorted by kind, ``d``, ``n`` (so the cap skips work)."""
    cells = []
    for part in text.split(","):
        kind, d, n = part.strip().split(":")
        if kind not in latency_spaces.KINDS:
            raise ValueError(f"space kind must be one of {latency_spaces.KINDS}, got {kind!r}")
        cells.append((kind, int(d), int(n)))
    return sorted(cells, key=lambda c: (latency_spaces.KINDS.index(c[0]), c[1], c[2]))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.report is not None:  # re-print the table of an earlier run
        data = json.loads(args.report.read_text())
        _print_report(cells_from_json(data), data["meta"], args.markdown)
        return 0
    preset = QUICK if args.quick else FULL
    reps = args.reps or preset.reps
    if args.cells:
        cells = parse_cells(args.cells)
    else:
        kinds = tuple(args.kinds.split(",")) if args.kinds else preset.kinds
        sizes = _ints(args.sizes) if args.sizes else preset.sizes
        dims = _ints(args.dims) if args.dims else preset.dims
        cells = grid(kinds, dims, sizes)
    limit_threads(args.threads)
    peers = _peer_settings(args)
    meta = machine_info()
    meta.update(reps=reps, cells=[list(c) for c in cells], seed=args.seed, quick=args.quick)
    meta.update(
        threads=args.threads, cold=args.cold, tag=args.tag, noise_std=latency_spaces.NOISE_STD
    )
    meta.update(cap_s=peers.cap, setup_cap_s=peers.setup_cap, peers_unavailable=peers.unavailable)
    meta["spaces"] = {f"{k}-d{d}": latency_spaces.describe(k, d) for k, d, _ in cells}
    meta["command"] = "python -m bench.latency " + " ".join(sys.argv[1:] if argv is None else argv)
    with Progress(console=console, transient=True) as progress:
        results = run_latency(cells, reps, peers, args.seed, args.cold, progress)
    meta["load_note"] = load_note(meta["load_average"])
    meta["peer_versions"] = _peer_versions(results)
    _print_report(results, meta, args.markdown)
    name = f"latency-{args.tag}" if args.tag else "latency"
    path = write_json(name, to_json(results, meta), args.out)
    console.print(f"wrote {path}")
    return 0


def _start_peer(
    name: str, peers: PeerSettings, setup: dict[str, Any], skip: str | None
) -> tuple[PeerTimes, PeerProcess | None]:
    """The peer's record in this cell and its child process (None when it does not run)."""
    if name in peers.unavailable:
        return PeerTimes(note=f"unavailable: {peers.unavailable[name]}"), None
    if skip is not None:
        return PeerTimes(note=skip), None
    try:
        process = PeerProcess(name, peers.python[name], setup, peers.threads, peers.setup_cap)
    except PeerCapped:
        note = f"not run: telling it n-1 points took over {peers.setup_cap:.0f} s"
        return PeerTimes(note=note), None
    except PeerError as err:
        return PeerTimes(note=f"failed: {str(err).splitlines()[0][:200]}"), None
    times = PeerTimes(setup_s=float(process.info["setup_s"]), versions=process.info["versions"])
    try:
        process.warm_up(2 * peers.cap)
    except PeerCapped:
        times.capped = 2 * peers.cap
        times.note = f"capped: its untimed warm-up step at n-1 ran past {2 * peers.cap:.0f} s"
        process.close()
        return times, None
    except PeerError as err:
        times.note = f"failed: {str(err).splitlines()[0][:200]}"
        process.close()
        return times, None
    return times, process


def _step_peer(
    process: PeerProcess,
    times: PeerTimes,
    point: tuple[dict[str, Any], float, float | None],
    cap: float,
) -> bool:
    """Time one peer step into ``times`` after telling it ``point`` (configuration, value,
    constraint metric or None); False when the peer must stop in this cell."""
    config, value, constraint = point
    try:
        seconds, kind = process.step(config, value, cap, constraint)
    except PeerCapped:
        times.capped = cap
        times.note = f"capped: a step ran past {cap:.0f} s"
        return False
    except PeerError as err:
        times.note = f"failed: {str(err).splitlines()[0][:200]}"
        return False
    times.seconds.append(seconds)
    times.kinds.append(kind)
    return True


def _peer_settings(args: argparse.Namespace) -> PeerSettings:
    names = tuple(p for p in args.peers.split(",") if p) if args.peers is not None else PEERS
    python = {name: sys.executable for name in names}
    if args.ax_python is not None and "ax" in python:
        python["ax"] = str(args.ax_python)
    unavailable = {}
    for name in names:
        try:
            probe(name, python[name])
        except PeerUnavailable as err:
            unavailable[name] = str(err)
            console.print(f"[yellow]peer {name} skipped: {escape(str(err))}[/yellow]")
    return PeerSettings(python, unavailable, args.cap, args.setup_cap, args.threads)


def _peer_versions(cells: list[Cell]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cell in cells:
        for name, times in cell.peers.items():
            if times.versions:
                out[name] = times.versions
    return out


def _print_report(cells: list[Cell], meta: dict[str, Any], markdown: bool) -> None:
    title = f"Suggest latency, one sequential step, median of {meta['reps']} (s)"
    show(results_table(cells, peers_in(cells), title), markdown)
    for key, text in meta.get("spaces", {}).items():
        console.print(f"[dim]{key}: {text}[/dim]")
    console.print(f"[dim]{meta['load_note']}[/dim]")
    for line in goal_lines(cells):
        console.print(line, highlight=False, soft_wrap=True)


def _time_ours(designer: Designer, completed: list[Trial]) -> tuple[float, str]:
    start = time.perf_counter()
    suggestions = designer.suggest(1, completed, [])
    return time.perf_counter() - start, suggestions[0].step.value


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="reps 2, n 20, d 6, both kinds")
    parser.add_argument("--reps", type=int, help="steps timed per cell (default 5)")
    parser.add_argument(
        "--kinds", help="space kinds, comma-separated (default box,mixed; also box+c, mixed+c)"
    )
    parser.add_argument("--sizes", help="completed trials n, comma-separated (50,100,200,1000)")
    parser.add_argument("--dims", help="dimensions d, comma-separated (6,16,100)")
    parser.add_argument("--cells", help="only these cells, KIND:D:N comma-separated")
    parser.add_argument("--peers", help="peers, comma-separated (skopt,optuna,ax; '' for none)")
    parser.add_argument("--cap", type=float, default=CAP_S, help="seconds a peer step may take")
    parser.add_argument(
        "--setup-cap", type=float, default=SETUP_CAP_S, help="seconds to tell a peer n-1 points"
    )
    parser.add_argument("--ax-python", type=Path, help="python of an environment with Ax")
    parser.add_argument("--seed", type=int, default=0, help="seed of the history and optimizers")
    parser.add_argument("--threads", type=int, help="torch and BLAS threads (default: library)")
    parser.add_argument("--cold", action="store_true", help="also time ours with an empty cache")
    parser.add_argument("--out", type=Path, help="results folder (default bench/results)")
    parser.add_argument("--tag", help="write latency-TAG.json instead of latency.json")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--report", type=Path, help="only print the table of a results file")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
