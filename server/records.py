"""The plain records the service, its gRPC servicer and the client exchange.

Kept apart from ``server.service`` so that the client, the converters and the CLI's
light commands import them without the service's dependencies (the designer, torch):
``import server.client`` stays fast (``tests/test_layers.py`` checks that it loads no
torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tuner.errors import ValidationError
from tuner.space import Scalar
from tuner.study import StudySpec
from tuner.trial import TrialStatus


@dataclass(frozen=True)
class ImportedTrial:
    """A configuration measured elsewhere, for ``TuningService.import_trials``."""

    config: Mapping[str, Scalar]
    status: TrialStatus = TrialStatus.COMPLETED
    metrics: Mapping[str, float] = field(default_factory=dict)
    reason: str = ""
    source: str = "import"


#: What becomes of a trial whose lease expired.
ON_EXPIRY = ("reoffer", "fail")


@dataclass(frozen=True)
class LeasePolicy:
    """How long a handed-out trial may go without a heartbeat, and what happens then.

    Attributes:
        ttl_s: Seconds from a hand-out or heartbeat to the lease's end (> 0).
        on_expiry: ``reoffer``: the trial becomes ABANDONED and its configuration is queued
            for the next worker; ``fail``: the trial becomes FAILED (an infrastructure
            failure, as a worker reports one), nothing is queued, and the designer treats
            it like any FAILED trial: the configuration is suggested again only while the
            study's ``designer.retry_failed`` allows.
    """

    ttl_s: float = 600.0
    on_expiry: str = "reoffer"

    def __post_init__(self) -> None:
        ttl = self.ttl_s
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < 1e9:
            raise ValidationError("lease_ttl", f"got {ttl!r}", "seconds, > 0")
        if self.on_expiry not in ON_EXPIRY:
            raise ValidationError("on_expiry", f"got {self.on_expiry!r}", ON_EXPIRY)


@dataclass(frozen=True)
class StudyInfo:
    """A study with a summary of its trials."""

    spec: StudySpec
    created_at: float
    trial_counts: dict[str, int]
    best_trial_id: int | None
