"""Helpers shared by the benchmarks: thread limits, machine notes, results files, trials.

Every benchmark records where and how it ran (CPU count, load average, torch and BLAS thread
counts, library versions) next to its numbers, because timings from a busy machine are not
comparable with timings from a quiet one.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from bench import bridge
from tuner.designer.acquisition.criteria import OptimizerSettings
from tuner.space import Config
from tuner.trial import Trial, TrialStatus

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: Published data sets some benchmarks replay: beside the checkout, never in the repository
#: (``bench/README.md``, "Benchmark data": each set's source, license and folder).
BENCHDATA = Path(__file__).resolve().parents[2] / "shared" / "benchdata"
PEER_PACKAGES = ("torch", "botorch", "gpytorch", "scikit-optimize", "scikit-learn", "numpy")

console = Console()
_thread_limiter: Any = None  # keeps a threadpoolctl limit alive for the whole process


def data_absent(path: Path) -> str:
    """Why a benchmark (or its test) that reads ``path`` cannot run here, and how to get it."""
    return (
        f"{path} is absent (benchmark data beside the checkout, not in the repository; "
        "where to get it: bench/README.md, 'Benchmark data')"
    )


def limit_threads(threads: int | None) -> None:
    """Use ``threads`` threads in torch and in numpy's BLAS (both sides of a comparison), and
    in the child processes started from here on (a peer in its own environment: their
    libraries read ``bridge.THREAD_VARIABLES``, joblib's ``n_jobs=-1`` included).

    None leaves the libraries' defaults alone.
    """
    global _thread_limiter
    if threads is None:
        return
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    _thread_limiter = threadpool_limits(limits=threads)
    os.environ.update(dict.fromkeys(bridge.THREAD_VARIABLES, str(threads)))


def machine_info() -> dict[str, Any]:
    """Where and how a benchmark runs, for the results file."""
    versions: dict[str, str | None] = {}
    for name in PEER_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "torch_threads": torch.get_num_threads(),
        "versions": versions,
        "git": git_state(),
        "designer_settings": asdict(OptimizerSettings()),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def git_state() -> dict[str, Any]:
    """The checkout's commit and its uncommitted changes under ``tuner/`` (the code measured)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip()

    changed = git("status", "--porcelain", "--", "tuner")
    return {
        "commit": git("rev-parse", "HEAD") or None,
        "tuner_changes": [line.split(maxsplit=1)[-1] for line in changed.splitlines()],
    }


def write_json(name: str, data: Mapping[str, Any], results_dir: Path | None = None) -> Path:
    """Write ``data`` to ``bench/results/<name>.json`` (or under ``results_dir``)."""
    directory = results_dir or RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path


@dataclass(frozen=True)
class Measured:
    """One measurement, as ``runner.loop.run_trials`` takes it (a ``runner.loop.Outcome``)."""

    metrics: dict[str, float]
    status: TrialStatus = TrialStatus.COMPLETED
    reason: str = ""


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a log written by ``append_record``, one a line ([] without it)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_record(path: Path, record: Mapping[str, Any]) -> None:
    """Append ``record`` to a log as one JSON line, at once (a run that ends is kept)."""
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


def completed_trial(trial_id: int, config: Config, metrics: dict[str, float], source: str) -> Trial:
    """A COMPLETED trial as the server would store it after the client reports."""
    return Trial(
        id=trial_id,
        config=config,
        status=TrialStatus.COMPLETED,
        metrics=metrics,
        source=source,
    )


def median(values: list[float]) -> float:
    """The median of a non-empty list."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return 0.5 * (ordered[mid - 1] + ordered[mid])


def load_note(start: list[float]) -> str:
    """A one-line description of the machine load during a run."""
    end = [round(x, 2) for x in os.getloadavg()]
    return (
        f"{os.cpu_count()} CPUs; 1-min load average {start[0]} at start, {end[0]} at end; "
        f"torch threads {torch.get_num_threads()}"
    )


def markdown_table(table: Table) -> str:
    """A rich table (plain-text cells) as a Markdown table with its title above it."""
    headers = [str(column.header) for column in table.columns]
    columns = [[str(cell) for cell in column.cells] for column in table.columns]
    align = ["---:" if column.justify == "right" else "---" for column in table.columns]
    lines = [f"**{table.title}**", ""] if table.title else []
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "|".join(align) + "|")
    lines.extend("| " + " | ".join(row) + " |" for row in zip(*columns, strict=True))
    return "\n".join(lines) + "\n"


def show(table: Table, markdown: bool = False) -> None:
    """Print ``table`` with rich, or as plain Markdown (for ``bench/README.md``)."""
    if markdown:
        print(markdown_table(table))
    else:
        console.print(table)
