"""The Ray Tune trainable of ``tuner ray``: one trial of a target inside a Ray worker.

Kept apart from ``runner.raytune`` so that a Ray worker imports only the target layer
(milliseconds), not the service and the optimizer with torch (seconds per worker).
"""

from __future__ import annotations

import os
from typing import Any

from targets.base import Target

STATUS_KEY = "tuner_status"
REASON_KEY = "tuner_reason"


def measure(config: dict[str, Any], target: Target, cwd: str) -> None:
    """Run one trial on (a copy of) ``target`` and report its metrics and verdict to Ray.

    Runs in the directory ``tuner ray`` was started from (Ray moves trials into their own
    folders), so a config's relative paths mean what they mean for ``tuner tune``.
    """
    from ray import tune

    os.chdir(cwd)
    with target:
        outcome = target.run_trial(config)
    tune.report({**outcome.metrics, STATUS_KEY: outcome.status.value, REASON_KEY: outcome.reason})
