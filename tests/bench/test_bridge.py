"""``bench.bridge``: what a child in another environment inherits."""

from __future__ import annotations

import subprocess
import sys

import joblib
import pytest

from bench.bridge import THREAD_VARIABLES, thread_env

PROBE = "import joblib; print(joblib.cpu_count(), joblib.effective_n_jobs(-1))"


def test_a_child_limited_to_one_thread_runs_n_jobs_minus_one_on_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scikit-learn's ``n_jobs=-1`` (SMAC's random forest) is joblib's cpu count: the child
    sees the limit, and without one the machine's cores."""
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TUNER_PROBE", "kept")
    env = thread_env(1)
    assert env["TUNER_PROBE"] == "kept"  # the rest of the environment goes along
    assert {env[name] for name in THREAD_VARIABLES} == {"1"}
    limited = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    assert limited.returncode == 0, limited.stderr
    assert limited.stdout.split() == ["1", "1"]
    free = thread_env(None)
    assert not set(THREAD_VARIABLES) & set(free)
    cores = subprocess.run([sys.executable, "-c", PROBE], env=free, capture_output=True, text=True)
    assert cores.stdout.split() == [str(joblib.cpu_count())] * 2
