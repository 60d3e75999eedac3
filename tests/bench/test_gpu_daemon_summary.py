"""bench.gpu_daemon_summary: the daemon's events log read back as a timeline and a summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu_daemon_summary import load, main, summarize


def _event(second: float, event: str, **fields: object) -> dict[str, object]:
    return {"ts": f"2026-11-27T01:00:{second:06.3f}+00:00", "event": event, **fields}


EVENTS = [
    _event(0, "start", study="s", round=1, phase="tuning", note="new"),
    _event(5, "trial", round=1, trial=1, status="COMPLETED", config={}, metrics={}, reason=""),
    _event(9, "slo_breach", round=1, trial=2, window=1, constraint="p99_ms <= 10 (measured 31)"),
    _event(9.25, "rollback", round=1, to="default configuration", config=None, seconds=0.2),
    _event(12, "applied", round=1, trial=1, config={"sm_mhz": 990}),
    _event(14, "window", round=1, n=1, metrics={}),
    _event(20, "drift", round=1, windows=3, baseline={}, metrics={}, change={"rate": 0.6}),
    _event(20, "round", round=2, reason="drift", study="s.r2"),
    _event(30, "slo_breach", round=2, window=7, constraint="p99_ms <= 10 (measured 80)"),
    _event(30.5, "rollback", round=2, to="default configuration", config=None, seconds=0.4),
    _event(31, "round", round=3, reason="slo breach", study="s.r3"),
    _event(40, "stop", reason="exit 143 (signal)", round=3, phase="tuning"),
]


def test_breaches_are_timed_to_their_rollback_and_rounds_to_their_reason() -> None:
    text = "\n".join(summarize(EVENTS))
    assert "ran 40 s" in text
    assert "rounds: 3 (drift, slo breach)" in text
    assert "SLO breach (trial 2, p99_ms <= 10 (measured 31)): rolled back to the default " \
        "configuration 0.25 s later (restore and apply: 0.2 s)" in text  # fmt: skip
    assert "SLO breach (watching, p99_ms <= 10 (measured 80)): rolled back" in text
    assert "0.50 s later" in text
    assert "stop: exit 143 (signal)" in text
    timeline = text.split("ran ")[0]
    assert "trial" not in timeline.replace("trial 2", "") and "window " not in timeline
    assert "round 1: {'sm_mhz': 990}" in timeline and "{'rate': 0.6}" in timeline


def test_the_log_is_read_past_lines_that_are_not_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "events.log"
    lines = [json.dumps(e) for e in EVENTS[:4]] + ["Traceback (most recent call last):", "[]"]
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert [e["event"] for e in load(log)] == ["start", "trial", "slo_breach", "rollback"]
    assert main([str(log)]) == 0
    out = capsys.readouterr().out
    assert "no stop event (still running?)" in out
    assert summarize([]) == ["no events"]
    assert main([]) == 2
