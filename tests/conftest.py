"""Test-wide settings, made as the ``tuner`` command makes them at start-up
(``tuner.runtime.configure``: one torch thread), and the designer runs in strict mode.

In strict mode a numerical error inside a model-based step (``NotPSDError``, ``NanError``,
...) propagates instead of falling back to quasi-random points, so numerical trouble in a
test is a failure, not a silent fallback. The tests of the fallback itself turn it off
(``monkeypatch.setattr(runtime, "STRICT", False)``). It is not set through the environment,
which the target tests' child processes inspect.
"""

from __future__ import annotations

from tuner import runtime

runtime.configure(warnings_to_log=False, strict=True)  # pytest keeps its own warning filters
