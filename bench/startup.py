"""Start-up time of the command line: ours against Optuna's CLI on the same machine.

``python -m bench.startup [--rounds 7] [--markdown]``

A shell ask/tell loop, or a script that lists studies, pays a command's start-up every
time. Each round runs every command once, ours and Optuna's interleaved, each a fresh
process timed from ``subprocess`` start to exit; the table gives the median over rounds
and the range. Ours: ``tuner`` against a SQLite file (``--db``) and against a running
``tuner serve`` (``--server``, the way a worker on another machine asks); Optuna: the
``optuna`` CLI against a SQLite ``RDBStorage``. Commands:

* ``help``: ``tuner --help`` / ``optuna --help``;
* ``studies``: the study list;
* ``show``: a study's trials (``tuner show`` / ``optuna trials``);
* ``ask`` and ``tell``: a new trial and its result (Optuna's ``ask`` samples in the
  process, with a search space given on the command line; ours suggests in the server
  with ``--server``, and in the process, importing the designer and torch, with ``--db``).

Results: ``bench/results/startup/startup.json`` and ``startup.png``.
"""

from __future__ import annotations

import argparse
import json
import os
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


def timed(argv: list[str]) -> tuple[float, str]:
    """Seconds from start to exit, and stdout; a failure is an error."""
    begun = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    took = time.perf_counter() - begun
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-500:]}")
    return took, done.stdout


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    meta = machine_info()
    tuner, optuna = str(BIN / "tuner"), str(BIN / "optuna")
    samples: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tuner-startup-") as tmp:
        work = Path(tmp)
        config = work / "study.toml"
        config.write_text(STUDY, encoding="utf-8")
        db, served = str(work / "local.db"), str(work / "served.db")
        storage = f"sqlite:///{work / 'optuna.db'}"
        timed([tuner, "create", str(config), "--db", db])
        timed([optuna, "create-study", "--storage", storage, "--study-name", "s"])
        port_file = work / "port"
        remote = any("--server" in name for name in args.commands)
        argv_serve = [tuner, "serve", "--db", served, "--port", "0", "--port-file", str(port_file)]
        server = subprocess.Popen(
            argv_serve if remote else ["true"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
        )  # fmt: skip
        try:
            target = ""
            if remote:
                deadline = time.monotonic() + 120
                while not port_file.exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
                target = f"127.0.0.1:{port_file.read_text().strip()}"
                timed([tuner, "create", str(config), "--server", target])
            chosen = [
                c for c in _commands(tuner, optuna, db, target, storage) if c[0] in args.commands
            ]
            for round_ in range(1, args.rounds + 1):
                for name, ours, theirs in chosen:
                    for side, command in (("ours", ours), ("optuna", theirs)):
                        if command is None:
                            continue
                        argv_ = command() if callable(command) else command
                        took, _ = timed(argv_)
                        samples.setdefault((name, side), []).append(took)
                console.print(f"round {round_} of {args.rounds} done")
        finally:
            server.terminate()
            server.wait(timeout=30)
    rows = [
        {"command": name, "side": side, "seconds": values}
        for (name, side), values in samples.items()
    ]
    show(table(rows), args.markdown)
    meta["load_note"] = load_note(meta["load_average"])
    meta["settings"] = vars(args) | {"out": str(args.out)}
    console.print(f"wrote {write_json('startup', {'meta': meta, 'rows': rows}, args.out)}")
    console.print(f"wrote {plot(rows, args.out / 'startup.png')}")
    return 0


def _commands(
    tuner: str, optuna: str, db: str, target: str, storage: str
) -> list[tuple[str, Any, Any]]:
    """(name, ours, optuna's) argv per command; a callable builds argv when it runs (a tell
    needs the trial its ask just made)."""

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
    return [
        ("help", [tuner, "--help"], [optuna, "--help"]),
        ("studies", [tuner, "studies", *local], [optuna, "studies", "--storage", storage]),
        (
            "show",
            [tuner, "show", "s", *local],
            [optuna, "trials", "--storage", storage, "--study-name", "s"],
        ),
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


def table(rows: list[dict[str, Any]]) -> Table:
    out = Table(title="Command start-up to exit, seconds: median over rounds (min-max)")
    for column in ("command", "ours", "optuna", "ours / optuna"):
        out.add_column(column, justify="left" if column == "command" else "right")
    by = {(r["command"], r["side"]): r["seconds"] for r in rows}
    for name in dict.fromkeys(r["command"] for r in rows):
        ours, theirs = by.get((name, "ours")), by.get((name, "optuna"))
        ratio = (
            f"{statistics.median(ours) / statistics.median(theirs):.2f}" if ours and theirs else ""
        )
        out.add_row(name, _spread(ours), _spread(theirs), ratio)
    return out


def _spread(values: list[float] | None) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


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


COMMANDS = ("help", "studies", "show", "ask --server", "tell --server", "ask --db", "tell --db")


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in COMMANDS for n in names):
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: a list of {COMMANDS}")
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--commands", type=_names, default=list(COMMANDS),
        help=f"a comma-separated list of {', '.join(COMMANDS)} (default all)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--markdown", action="store_true")
    return parser


if __name__ == "__main__":
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    sys.exit(main())
