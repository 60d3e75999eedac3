"""Process-wide settings made at start-up (``tuner.runtime``): BoTorch's fused kernel."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from botorch.acquisition.multi_objective import logei

from tuner import runtime

ROOT = Path(__file__).resolve().parents[2]

# A two-objective study past its initial design: its suggestion builds qLogNEHVI.
TWO_OBJECTIVES = """
import json, sys
from botorch.acquisition.multi_objective import logei
from tuner import runtime
from tuner.designer import make_designer
from tuner.study import StudySpec
from tuner.trial import Trial, TrialStatus

runtime.configure()
spec = StudySpec.from_dict({
    "name": "two",
    "knobs": [{"name": "x", "kind": "float"}, {"name": "y", "kind": "float"}],
    "objectives": [{"name": "a", "goal": "minimize", "reference": 2.0},
                   {"name": "b", "goal": "minimize", "reference": 2.0}],
    "designer": {"seed": 0, "initial_trials": 3},
})
points = [(0.1, 0.9), (0.5, 0.5), (0.9, 0.2), (0.3, 0.6)]
trials = [Trial(i + 1, {"x": x, "y": y}, TrialStatus.COMPLETED, {"a": x + 0.1 * y, "b": 1 - x})
          for i, (x, y) in enumerate(points)]
(suggestion,) = make_designer(spec).suggest(1, trials, [])
print(json.dumps({"step": suggestion.step.value, "fused": logei._C is not None}))
"""


@pytest.mark.slow
def test_a_two_objective_suggestion_compiles_nothing_by_default(tmp_path: Path) -> None:
    extensions = tmp_path / "torch_extensions"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "TUNER_STRICT": "1"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", TWO_OBJECTIVES],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"step": "global", "fused": False}  # a model step, on the torch path
    assert not extensions.exists() or not any(extensions.rglob("*"))  # no C++ build


def test_fused_kernels_are_loaded_at_start_up_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads: list[bool] = []
    kernel = object()

    def load() -> None:  # BoTorch's loader, without the minute of C++ build
        loads.append(logei._load_attempted)
        logei._load_attempted = True
        logei._C = kernel

    monkeypatch.setattr(logei, "_try_load_fused_kernel", load)
    monkeypatch.setattr(logei, "_C", None)
    monkeypatch.setattr(logei, "_load_attempted", True)  # as the default leaves it
    runtime.configure(warnings_to_log=False, fused_kernels=True)
    assert loads == [False] and logei._C is kernel  # BoTorch's once-only sentinel reset
    runtime.configure(warnings_to_log=False, fused_kernels=True)
    assert loads == [False]  # already loaded: not again
    runtime.configure(warnings_to_log=False)
    assert logei._C is None and logei._load_attempted  # off: BoTorch never tries


WARM_UP = """
import sys, torch
from tuner import runtime
before = set(sys.modules)
runtime.warm_up()
warmed = set(sys.modules) - before
torch.broadcast_shapes((3, 1), (1, 4))  # what GPyTorch's means call in a first suggestion
print(len(warmed), "sympy" in warmed, len(set(sys.modules) - before - warmed))
"""


def test_warm_up_imports_what_a_first_suggestion_would() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WARM_UP],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    warmed, sympy, later = done.stdout.split()
    assert int(warmed) > 100 and sympy == "True" and later == "0"


def test_serve_and_a_local_daemon_warm_up_and_short_commands_do_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import cli.main
    import runner.daemon
    import server.app

    monkeypatch.chdir(tmp_path)  # the example's relative paths (its events log) land here
    calls: list[str] = []
    monkeypatch.setattr(runtime, "warm_up", lambda: calls.append("warm_up"))
    monkeypatch.setattr(server.app, "serve", lambda *a, **k: calls.append("serve"))
    assert cli.main.main(["serve", "--db", str(tmp_path / "s.db"), "--port", "0"]) == 0
    assert calls == ["warm_up", "serve"]
    calls.clear()
    monkeypatch.setattr(runner.daemon.Daemon, "run", lambda self: calls.append("run") or 0)
    config = ROOT / "examples" / "daemon.toml"
    state = tmp_path / "state.json"
    args = ["daemon", str(config), "--db", str(tmp_path / "d.db"), "--state", str(state)]
    assert cli.main.main(args) == 0
    assert calls == ["warm_up", "run"]
    calls.clear()
    assert cli.main.main(["studies", "--db", str(tmp_path / "d.db")]) == 0
    assert calls == []


def test_the_numerical_libraries_expected_notes_show_only_with_debug_logging() -> None:
    note = logging.LogRecord(
        "py.warnings", logging.WARNING, __file__, 1,
        "cholesky.py:41: NumericalWarning: A not p.d., added jitter of 1.0e-08", None, None,
    )  # fmt: skip
    other = logging.LogRecord("py.warnings", logging.WARNING, __file__, 1, "UserWarning: x",
                              None, None)  # fmt: skip
    root = logging.getLogger()
    level = root.level
    try:
        root.setLevel(logging.WARNING)
        assert not runtime._ExpectedNotes().filter(note)
        assert runtime._ExpectedNotes().filter(other)
        root.setLevel(logging.DEBUG)
        assert runtime._ExpectedNotes().filter(note)
    finally:
        root.setLevel(level)
