"""Test-wide settings, made as the ``tuner`` command makes them at start-up
(``tuner.runtime.configure``: one torch thread), and the designer runs in strict mode.

With ``TUNER_STRICT=1`` a numerical error inside a model-based step (``NotPSDError``,
``NanError``, ...) propagates instead of falling back to quasi-random points, so numerical
trouble in a test is a failure, not a silent fallback. The tests of the fallback itself
unset it (``monkeypatch.delenv``).
"""

from __future__ import annotations

import os

from tuner import runtime

os.environ["TUNER_STRICT"] = "1"
runtime.configure(warnings_to_log=False)  # pytest keeps its own warning filters
