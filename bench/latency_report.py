"""The latency benchmark's results: cells, goals, the table and the results file.

A cell is one ``(space kind, d, n)``: our step times and each peer's, with the reason when a
peer has fewer steps than ours (capped at the per-step limit, skipped, unavailable, failed).
Medians count a step that ran past the limit as longer than any finished step, so a capped
median reads "> limit" and its ratio "> limit / ours".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.table import Table

from bench.common import median
from bench.latency_peers import PEERS


@dataclass(frozen=True)
class Goal:
    """Our median step at ``(d, n)`` must take at most ``seconds`` (on every space kind)."""

    d: int
    n: int
    seconds: float


# issue 26, item 8; d = 100 is without an embedding (the spaces' studies have none)
GOALS = (Goal(16, 100, 0.3), Goal(16, 1000, 1.5), Goal(100, 100, 2.0))
FASTER_THAN = ("optuna", "ax")


@dataclass
class PeerTimes:
    """One peer's steps in one cell.

    Attributes:
        seconds: Finished steps, in order.
        kinds: What made each step's suggestion (Ax's generation node; ``gp`` otherwise).
        capped: The limit a step (or the setup) ran past, which stopped the peer here.
        note: Why the peer has no or fewer steps (empty when it ran every step).
        setup_s: Seconds the child took to tell the first ``n - 1`` points and warm up.
        versions: The peer's package versions, as its child reported them.
    """

    seconds: list[float] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    capped: float | None = None
    note: str = ""
    setup_s: float | None = None
    versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def median(self) -> float | None:
        """Median step, a capped step counting as infinitely long; None when none ran."""
        values = self.seconds + ([math.inf] if self.capped is not None else [])
        return median(values) if values else None


@dataclass
class Cell:
    """Timings of one ``(kind, d, n)`` cell, in seconds, one entry per repetition."""

    kind: str
    d: int
    n: int
    ours: list[float] = field(default_factory=list)
    ours_sources: list[str] = field(default_factory=list)
    ours_cold: float | None = None
    peers: dict[str, PeerTimes] = field(default_factory=dict)
    ours_refit: float | None = None
    refit_every: int = 1

    @property
    def ours_median(self) -> float:
        return median(self.ours)

    @property
    def ours_mean(self) -> float | None:
        """Our step averaged over a refit cycle: ``refit_every - 1`` steps at the median and
        one step that fits the GP again (None when the refit step was not timed)."""
        if self.ours_refit is None:
            return None
        every = self.refit_every
        return ((every - 1) * self.ours_median + self.ours_refit) / every

    def ratio(self, peer: str) -> float | None:
        """peer / ours: how many times faster our step is (inf when the peer was capped)."""
        times = self.peers.get(peer)
        value = times.median if times is not None else None
        return None if value is None else value / self.ours_median


def goal_checks(cells: list[Cell]) -> list[dict[str, Any]]:
    """Every goal, per space kind, with its verdict (``passed`` None: not measured)."""
    kinds = sorted({c.kind for c in cells})
    out: list[dict[str, Any]] = []
    for goal in GOALS:
        for kind in kinds:
            cell = _find(cells, kind, goal.d, goal.n)
            value = cell.ours_median if cell is not None else None
            passed = None if value is None else value <= goal.seconds
            name = f"ours median <= {goal.seconds} s at d={goal.d}, n={goal.n}, {kind}"
            row = {"goal": name, "kind": kind, **asdict(goal), "ours_median_s": value}
            out.append({**row, "passed": passed})
    for peer in FASTER_THAN:
        slower, measured, unknown = [], 0, []
        for cell in cells:
            times = cell.peers.get(peer)
            value = times.median if times is not None else None
            if value is None:
                continue
            label = f"{cell.kind} d={cell.d} n={cell.n}"
            capped = times.capped if times is not None and math.isinf(value) else None
            if capped is not None and cell.ours_median >= capped:  # ours no faster than the cap
                unknown.append(label)
                continue
            measured += 1
            if cell.ours_median >= value:
                slower.append(label)
        passed = None if measured == 0 else not slower
        out.append(
            {
                "goal": f"ours faster than {peer} in every measured cell",
                "peer": peer,
                "cells_measured": measured,
                "ours_not_faster": slower,
                "undecided_capped": unknown,
                "passed": passed,
            }
        )
    return out


def results_table(cells: list[Cell], peers: tuple[str, ...], title: str) -> Table:
    """Medians and ratios per cell; a peer without a number says why in its cell."""
    table = Table(title=title)
    headers = ["space", "d", "n", "ours s"]
    for peer in peers:
        headers += [f"{peer} s", f"{peer}/ours"]
    refits = any(c.ours_refit is not None for c in cells)
    if refits:
        headers += ["ours refit s", "every", "ours mean s"]
    if any(c.ours_cold is not None for c in cells):
        headers.append("ours cold s")
    for name in headers:
        table.add_column(name, justify="left" if name == "space" else "right")
    for cell in cells:
        row = [cell.kind, str(cell.d), str(cell.n), f"{cell.ours_median:.2f}"]
        for peer in peers:
            row += _peer_cells(cell, peer)
        if refits:
            mean = cell.ours_mean
            row += [
                f"{cell.ours_refit:.2f}" if cell.ours_refit is not None else "-",
                str(cell.refit_every),
                f"{mean:.2f}" if mean is not None else "-",
            ]
        if len(headers) > len(row):
            row.append(f"{cell.ours_cold:.2f}" if cell.ours_cold is not None else "-")
        table.add_row(*row)
    return table


def goal_lines(cells: list[Cell]) -> list[str]:
    """One PASS/FAIL line per goal (plain text)."""
    lines = []
    for check in goal_checks(cells):
        verdict = {True: "PASS", False: "FAIL", None: "not measured"}[check["passed"]]
        if "peer" in check:
            detail = f"{check['cells_measured']} cells measured"
            if check["ours_not_faster"]:
                detail += "; ours not faster at " + ", ".join(check["ours_not_faster"])
            if check["undecided_capped"]:
                detail += "; undecided (peer capped, ours slower than the cap) at " + ", ".join(
                    check["undecided_capped"]
                )
        else:
            value = check["ours_median_s"]
            detail = f"{value:.2f} s" if value is not None else "cell not in this run"
        lines.append(f"goal: {check['goal']}: {verdict} ({detail})")
    return lines


def to_json(cells: list[Cell], meta: dict[str, Any]) -> dict[str, Any]:
    """The results file's content."""
    rows = []
    for cell in cells:
        row = asdict(cell)
        row["ours_median_s"] = cell.ours_median
        row["ours_mean_s"] = cell.ours_mean
        for peer, times in cell.peers.items():
            value = times.median
            row["peers"][peer]["median_s"] = None if value is None or math.isinf(value) else value
            ratio = cell.ratio(peer)
            row["peers"][peer]["ratio"] = None if ratio is None or math.isinf(ratio) else ratio
        rows.append(row)
    return {"benchmark": "latency", "meta": meta, "cells": rows, "goals": goal_checks(cells)}


def cells_from_json(data: dict[str, Any]) -> list[Cell]:
    """The cells of a results file written by ``to_json``."""
    cells = []
    for row in data["cells"]:
        if "skopt" in row:  # a file of the skopt-only benchmark (box spaces, before 2026-11-25)
            row = {**row, "kind": "box", "peers": {"skopt": {"seconds": row["skopt"]}}}
        peers = {
            name: PeerTimes(
                seconds=list(p["seconds"]),
                kinds=list(p.get("kinds", [])),
                capped=p.get("capped"),
                note=p.get("note", ""),
                setup_s=p.get("setup_s"),
                versions=dict(p.get("versions", {})),
            )
            for name, p in row["peers"].items()
        }
        cells.append(
            Cell(
                kind=row["kind"],
                d=row["d"],
                n=row["n"],
                ours=list(row["ours"]),
                ours_sources=list(row["ours_sources"]),
                ours_cold=row["ours_cold"],
                peers=peers,
                ours_refit=row.get("ours_refit"),
                refit_every=row.get("refit_every", 1),
            )
        )
    return cells


def peers_in(cells: list[Cell]) -> tuple[str, ...]:
    """The peers that appear in any cell, in ``PEERS`` order."""
    seen = {p for c in cells for p in c.peers}
    return tuple(p for p in PEERS if p in seen)


def _peer_cells(cell: Cell, peer: str) -> list[str]:
    times = cell.peers.get(peer)
    if times is None:
        return ["-", "-"]
    value = times.median
    if value is None:
        return [times.note or "-", "-"]
    if math.isinf(value):
        assert times.capped is not None
        bound = times.capped / cell.ours_median
        return [f"> {times.capped:.0f} (capped)", f"> {bound:.1f}"]
    text = f"{value:.2f}"
    if times.note:
        text += f" ({times.note})"
    return [text, f"{value / cell.ours_median:.2f}"]


def _find(cells: list[Cell], kind: str, d: int, n: int) -> Cell | None:
    for cell in cells:
        if (cell.kind, cell.d, cell.n) == (kind, d, n):
            return cell
    return None
