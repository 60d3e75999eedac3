"""Start-up time of the command line: ours against Optuna's CLI on the same machine.

``python -m bench.startup [--rounds 15] [--interval 1] [--db FILE --study NAME] [--markdown]``

A shell ask/tell loop, or a script that lists studies, pays a command's start-up every
time. Each round runs every command once, ours and Optuna's interleaved (in alternating
order from round to round, so that a drift of the machine touches both alike), each a
fresh process timed from ``subprocess`` start to exit, with ``--interval`` seconds
between rounds so that one burst of load on a shared machine does not fall on every
sample of a command. They run as from a user's shell, which caches compiled modules
(``ENV``), after one untimed round that writes the cache. The table gives per command the
median over rounds, its 95 % interval (the distribution-free one from order statistics:
``median_interval``) and the range, and the goal where there is one (``GOALS``: ``tuner
--help`` 0.3 s, ``tuner studies`` 0.5 s, on a quiet machine), and the median CPU seconds
(user and system) each process used: on a machine whose CPUs others keep busy the wall
time grows with the load, the CPU time far less, and it is about what the wall time is on
a quiet machine. The title gives the load average at the start and the end. Ours:
``tuner`` against a SQLite file (``--db``) and against a running ``tuner serve``
(``--server``, the way a worker on another machine asks); Optuna: the ``optuna`` CLI
against a SQLite ``RDBStorage``. Commands:

* ``help``: ``tuner --help`` / ``optuna --help``;
* ``studies``: the study list (``tuner studies`` names each study's best);
* ``show``: a study's trials (``tuner show`` / ``optuna trials``);
* ``best``: the best trial (``tuner best`` / ``optuna best-trial``);
* ``ask`` and ``tell``: a new trial and its result (Optuna's ``ask`` samples in the
  process, with a search space given on the command line; ours suggests in the server
  with ``--server``, and in the process, importing the designer and torch, with ``--db``).

Both studies start with ``SEEDED`` measured trials (ours imported from a CSV, Optuna's told
in one process), so that ``studies``, ``show`` and ``best`` have results to read. With
``--db FILE --study NAME`` the reading commands (``help``, ``studies``, ``show``, ``best``)
read that database instead, for example the main job's ``runs/tuner.db``, and Optuna's
study gets as many trials.

Results: ``bench/results/startup/startup.json`` and ``startup.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import console, load_note, machine_info, show, write_json

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "startup"
BIN = Path(sys.executable).parent
SPACE = json.dumps({"x": {"name": "FloatDistribution", "attributes": {"low": 0.0, "high": 1.0}}})
STUDY = """
[study]
name = "s"
[[study.knobs]]
name = "x"
kind = "float"
low = 0.0
high = 1.0
[[study.objectives]]
name = "y"
[study.designer]
algorithm = "sobol"
"""
#: Measured trials both studies start with (ours imported from a CSV, Optuna's told).
SEEDED = 8
#: Start-up goals in seconds, on a quiet machine (issue 56).
GOALS = {"help": 0.3, "studies": 0.5}
#: The commands' environment: this one, less ``PYTHONDONTWRITEBYTECODE``. A user's shell
#: caches compiled modules (a checkout's on its first run, an installed package's at
#: install); a process with it set compiles every module of ours from source at every
#: start (0.16 s of a 0.5 s ``tuner studies`` on this VM), while Optuna's, installed
#: by pip, were compiled at install. An untimed first round writes the cache.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(argv: list[str]) -> tuple[float, str]:
    """Seconds from start to exit, and stdout; a failure is an error."""
    took, _, out = measured(argv)
    return took, out


def measured(argv: list[str]) -> tuple[float, float, str]:
    """Seconds from start to exit, the CPU seconds the process used (user and system:
    about what it takes from start to exit on a quiet machine, where nothing else waits
    for the CPUs), and stdout; a failure is an error."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    begun = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT, env=ENV)
    took = time.perf_counter() - begun
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-500:]}")
    return took, cpu, done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.commands is None:
        args.commands = list(READING if args.db is not None else COMMANDS)
    writing = [name for name in args.commands if name not in READING]
    if args.db is not None and writing:
        parser.error(f"--db reads a database: --commands may only name {', '.join(READING)}, "
                     f"got {', '.join(writing)}")  # fmt: skip
    meta = machine_info()
    tuner, optuna = str(BIN / "tuner"), str(BIN / "optuna")
    samples: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tuner-startup-") as tmp:
        work = Path(tmp)
        db, study, storage = _prepare(work, tuner, args.db, args.study)
        served, port_file = str(work / "served.db"), work / "port"
        remote = any("--server" in name for name in args.commands)
        argv_serve = [tuner, "serve", "--db", served, "--port", "0", "--port-file", str(port_file)]
        server = subprocess.Popen(
            argv_serve if remote else ["true"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=ENV,
        )  # fmt: skip
        try:
            target = ""
            if remote:
                deadline = time.monotonic() + 120
                while not port_file.exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
                target = f"127.0.0.1:{port_file.read_text().strip()}"
                timed([tuner, "create", str(work / "study.toml"), "--server", target])
            chosen = [
                c for c in _commands(tuner, optuna, db, study, target, storage)
                if c[0] in args.commands
            ]  # fmt: skip
            for _, *commands in chosen:  # untimed: writes the bytecode caches (``ENV``)
                for command in commands:
                    if command is not None:
                        measured(command() if callable(command) else command)
            for round_ in range(1, args.rounds + 1):
                for name, ours, theirs in chosen:
                    sides = (("ours", ours), ("optuna", theirs))
                    for side, command in sides if round_ % 2 else sides[::-1]:
                        if command is None:
                            continue
                        argv_ = command() if callable(command) else command
                        took, cpu, _ = measured(argv_)
                        samples.setdefault((name, side), []).append(took)
                        cpus.setdefault((name, side), []).append(cpu)
                console.print(f"round {round_} of {args.rounds} done")
                if round_ < args.rounds:
                    time.sleep(args.interval)
        finally:
            server.terminate()
            server.wait(timeout=30)
    rows = [
        {"command": name, "side": side, "seconds": values, "cpu_seconds": cpus[(name, side)]}
        for (name, side), values in samples.items()
    ]
    meta["load_note"] = load_note(meta["load_average"])
    meta["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    meta["settings"] = vars(args) | {"out": str(args.out), "db": str(args.db or "")}
    show(table(rows, meta), args.markdown)
    console.print(f"wrote {write_json('startup', {'meta': meta, 'rows': rows}, args.out)}")
    console.print(f"wrote {plot(rows, args.out / 'startup.png')}")
    return 0


def _prepare(work: Path, tuner: str, db: Path | None, study: str) -> tuple[str, str, str]:
    """Ours and Optuna's studies to read: ``db``'s ``study`` (Optuna's study gets as many
    trials), or a new one of ``SEEDED`` imported trials. Returns (our database, our study,
    Optuna's storage URL)."""
    config = work / "study.toml"
    config.write_text(STUDY, encoding="utf-8")
    storage = f"sqlite:///{work / 'optuna.db'}"
    timed([str(BIN / "optuna"), "create-study", "--storage", storage, "--study-name", "s"])
    if db is not None:
        _, shown = timed([tuner, "show", study, "--db", str(db), "--json"])
        _seed_optuna(storage, len(json.loads(shown)["trials"]))
        return str(db), study, storage
    local = str(work / "local.db")
    timed([tuner, "create", str(config), "--db", local])
    csv = work / "seed.csv"
    csv.write_text("x,y\n" + "".join(f"{(i + 0.5) / SEEDED},{i % 3 + 1.0}\n"
                                     for i in range(SEEDED)), encoding="utf-8")  # fmt: skip
    timed([tuner, "import", "s", "--csv", str(csv), "--db", local])
    _seed_optuna(storage, SEEDED)
    return local, "s", storage


def _seed_optuna(storage: str, count: int) -> None:
    """``count`` completed trials in Optuna's study ``s``, told in one process."""
    code = (
        "import optuna, sys\noptuna.logging.set_verbosity(optuna.logging.WARNING)\n"
        f"s = optuna.load_study(study_name='s', storage={storage!r})\n"
        f"for i in range({count}):\n"
        "    t = s.ask({'x': optuna.distributions.FloatDistribution(0.0, 1.0)})\n"
        "    s.tell(t, i % 3 + 1.0)\n"
    )
    timed([sys.executable, "-c", code])


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: the order statistics ``(k, n + 1 - k)``
    with the largest ``k`` for which ``P(Binomial(n, 1/2) < k) <= (1 - level) / 2``; the
    range when there are too few values for one (fewer than 6 at 95 %)."""
    ordered, n = sorted(values), len(values)
    tail, k, below = (1 - level) / 2, 0, 0.0
    while k < n // 2 and below + math.comb(n, k) / 2**n <= tail:
        below += math.comb(n, k) / 2**n
        k += 1
    return (ordered[k - 1], ordered[n - k]) if k else (ordered[0], ordered[-1])


def _commands(
    tuner: str, optuna: str, db: str, study: str, target: str, storage: str
) -> list[tuple[str, Any, Any]]:
    """(name, ours, optuna's) argv per command; a callable builds argv when it runs (a tell
    needs the trial its ask just made). ``ask`` and ``tell`` write to a study of their own
    (``s``), never to ``study`` of a database given with ``--db``."""

    def our_tell(where: list[str]) -> Any:
        def build() -> list[str]:
            trial = _last_trial(tuner, where)
            if trial is None:  # its ask was not among the commands: one, untimed
                timed([tuner, "ask", "s", *where])
                trial = _last_trial(tuner, where)
            return [tuner, "tell", "s", str(trial), *where, "--metric", "y=1.0"]

        return build

    def optuna_tell() -> list[str]:
        number = _last_optuna_trial(optuna, storage)
        if number is None:  # as for ours
            timed(optuna_ask)
            number = _last_optuna_trial(optuna, storage)
        return [optuna, "tell", "--storage", storage, "--study-name", "s",
                "--trial-number", str(number), "--values", "1.0"]  # fmt: skip

    local, remote = ["--db", db], ["--server", target]
    optuna_ask = [optuna, "ask", "--storage", storage, "--study-name", "s",
                  "--search-space", SPACE]  # fmt: skip
    theirs = ["--storage", storage, "--study-name", "s"]
    return [
        ("help", [tuner, "--help"], [optuna, "--help"]),
        ("studies", [tuner, "studies", *local], [optuna, "studies", "--storage", storage]),
        ("show", [tuner, "show", study, *local], [optuna, "trials", *theirs]),
        ("best", [tuner, "best", study, *local], [optuna, "best-trial", *theirs]),
        ("ask --server", [tuner, "ask", "s", *remote], optuna_ask),
        ("tell --server", our_tell(remote), optuna_tell),
        ("ask --db", [tuner, "ask", "s", *local], None),
        ("tell --db", our_tell(local), None),
    ]


def _last_trial(tuner: str, where: list[str]) -> int | None:
    """The newest ACTIVE trial's id, if any (untimed: read with ``tuner show --json``)."""
    _, out = timed([tuner, "show", "s", *where, "--json"])
    trials = json.loads(out)["trials"]
    return max((t["id"] for t in trials if t["status"] == "ACTIVE"), default=None)


def _last_optuna_trial(optuna: str, storage: str) -> int | None:
    _, out = timed(
        [optuna, "trials", "--storage", storage, "--study-name", "s", "--format", "json"]
    )
    return max((t["number"] for t in json.loads(out) if t["state"] == "RUNNING"), default=None)


def table(rows: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> Table:
    load = ""
    if meta is not None:
        start, end = meta["load_average"][0], meta.get("load_average_end", ["?"])[0]
        load = f"; {meta['cpu_count']} CPUs, 1-min load average {start} at start, {end} at end"
    out = Table(title="Command start-up to exit, seconds: median over rounds [95 % interval of "
                f"the median] (min-max), and the median CPU seconds it used{load}")  # fmt: skip
    columns = ("command", "ours", "ours, CPU", "optuna", "optuna, CPU", "ours / optuna", "goal")
    for column in columns:
        out.add_column(column, justify="left" if column == "command" else "right")
    by = {(r["command"], r["side"]): r["seconds"] for r in rows}
    cpu = {(r["command"], r["side"]): r.get("cpu_seconds") for r in rows}
    for name in dict.fromkeys(r["command"] for r in rows):
        ours, theirs = by.get((name, "ours")), by.get((name, "optuna"))
        ratio = (
            f"{statistics.median(ours) / statistics.median(theirs):.2f}" if ours and theirs else ""
        )
        goal = GOALS.get(name)
        met = "" if goal is None or not ours else (
            f"{goal} s: {'met' if statistics.median(ours) <= goal else 'not met'}"
        )  # fmt: skip
        out.add_row(name, _spread(ours), _median(cpu.get((name, "ours"))), _spread(theirs),
                    _median(cpu.get((name, "optuna"))), ratio, met)  # fmt: skip
    return out


def _median(values: list[float] | None) -> str:
    return f"{statistics.median(values):.2f}" if values else "n/a"


def _spread(values: list[float] | None) -> str:
    if not values:
        return "n/a"
    low, high = median_interval(values)
    return (
        f"{statistics.median(values):.2f} [{low:.2f}-{high:.2f}] "
        f"({min(values):.2f}-{max(values):.2f})"
    )


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["command"] for r in rows))
    by = {(r["command"], r["side"]): statistics.median(r["seconds"]) for r in rows}
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.38
    for offset, side, color in (
        (-width / 2, "ours", "tab:blue"),
        (width / 2, "optuna", "tab:gray"),
    ):
        xs = [i + offset for i, n in enumerate(names) if (n, side) in by]
        ax.bar(xs, [by[(n, side)] for n in names if (n, side) in by], width, label=side,
               color=color)  # fmt: skip
    ax.axhline(0.5, color="tab:red", linestyle="--", label="goal: 0.5 s")
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_ylabel("seconds, start to exit (median)")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    ax.set_title("bench.startup: `tuner` and `optuna` commands (2-CPU VM)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


COMMANDS = (
    "help", "studies", "show", "best", "ask --server", "tell --server", "ask --db", "tell --db"
)  # fmt: skip
#: What may read a database given with ``--db`` (the others write).
READING = ("help", "studies", "show", "best")


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in COMMANDS for n in names):
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: a list of {COMMANDS}")
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between rounds (default 1)"
    )
    parser.add_argument(
        "--db", type=Path, default=None,
        help="read this database (the reading commands only: " + ", ".join(READING) + ")",
    )  # fmt: skip
    parser.add_argument("--study", default="sqlite-oltp", help="the study of --db to read")
    parser.add_argument(
        "--commands", type=_names, default=None,
        help=f"a comma-separated list of {', '.join(COMMANDS)} (default all; with --db: "
        f"{', '.join(READING)})",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--markdown", action="store_true")
    return parser


if __name__ == "__main__":
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    sys.exit(main())
