"""A daemon's events log (``tuner daemon``'s JSON lines) as a timeline and a summary.

    python -m bench.gpu_daemon_summary EVENTS_LOG

Prints every transition (seconds since the start, the event, its round and what matters of
it), then: how long the daemon ran, the rounds and why each began, the configurations it
applied, each SLO breach with the seconds until the configuration before it was back (the
breach's window is the one that saw it: issue 30 asks for a rollback within it), the drifts,
and how it stopped. ``bench/gpu_daemon.sh`` writes it to ``summary.txt``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

QUIET = ("window", "trial")  # counted, not listed one by one


def load(path: Path) -> list[dict[str, Any]]:
    """The events of ``path``, in order (lines that are not JSON objects are skipped)."""
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and "event" in event and "ts" in event:
            events.append(event)
    return events


def summarize(events: list[dict[str, Any]]) -> list[str]:
    """The timeline and the summary as lines of text."""
    if not events:
        return ["no events"]
    start = _time(events[0])
    lines = ["timeline (s since start):"]
    for event in events:
        if event["event"] in QUIET:
            continue
        lines.append(f"  {_time(event) - start:8.1f}  {event['event']:<10} {_detail(event)}")
    counts = Counter(e["event"] for e in events)
    lines.append(f"ran {_time(events[-1]) - start:.0f} s; events: {dict(sorted(counts.items()))}")
    rounds = [e for e in events if e["event"] == "round"]
    lines.append(f"rounds: {1 + len(rounds)} ({', '.join(e['reason'] for e in rounds) or 'one'})")
    for index, event in enumerate(events):
        if event["event"] != "slo_breach":
            continue
        back = next((e for e in events[index + 1 :] if e["event"] == "rollback"), None)
        after = "no rollback logged" if back is None else (
            f"rolled back to the {back['to']} {_time(back) - _time(event):.2f} s later "
            f"(restore and apply: {back['seconds']} s)"
        )  # fmt: skip
        where = f"trial {event['trial']}" if "trial" in event else "watching"
        lines.append(f"SLO breach ({where}, {event['constraint']}): {after}")
    stops = [e for e in events if e["event"] == "stop"]
    lines.append(f"stop: {stops[-1]['reason']}" if stops else "no stop event (still running?)")
    return lines


def _time(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["ts"]).timestamp()


def _detail(event: dict[str, Any]) -> str:
    kind = event["event"]
    if kind == "applied":
        return f"round {event['round']}: {event.get('config')} {event.get('note', '')}".rstrip()
    if kind == "round":
        return f"round {event['round']} ({event['reason']})"
    if kind == "drift":
        return f"round {event['round']}: {event['change']}"
    if kind == "slo_breach":
        return f"round {event['round']}: {event['constraint']}"
    if kind == "rollback":
        return f"to the {event['to']} in {event['seconds']} s"
    if kind == "baseline":
        return f"round {event['round']}: {event['baseline']}"
    if kind == "stop":
        return event["reason"]
    return ""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.gpu_daemon_summary EVENTS_LOG", file=sys.stderr)
        return 2
    print("\n".join(summarize(load(Path(args[0])))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
