"""The target adapter contract: apply a configuration, measure it, always restore.

A target is one system the tuner can change and measure (an embedded database, a database
server, GPU clocks, ...). Its life cycle is a context manager::

    with build_target("sqlite", {"db_mb": 32}) as target:   # __enter__ -> setup()
        knobs = target.describe_knobs()                     # host-resolved ranges
        outcome = target.run_trial(config)                  # apply, measure, restore
    # __exit__ -> close(): everything setup() made is removed, on every exit path

``run_trial`` turns the target errors into trial outcomes: ``ConfigRejected`` (the
configuration broke the system) becomes INFEASIBLE, ``TrialTimedOut`` becomes TIMED_OUT and
any other ``TargetError`` (infrastructure) becomes FAILED, each with the error text as the
reason. ``restore()`` runs
whatever happens; pair the session with ``targets.host.signals.terminate_on_sigterm`` so that a
SIGTERM unwinds through it too.

The option helpers at the bottom let adapters validate their keyword-only constructor
arguments with errors that name ``target.<option>`` and what is allowed. The shape follows
MLOS's ``mlos_bench`` environments (setup / run / teardown) and Vizier's trial outcomes.
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

from tuner.errors import ConfigRejected, TargetError, TrialTimedOut, ValidationError
from tuner.space import Config, Knob, SearchSpace
from tuner.trial import TrialStatus

OUTCOME_STATUSES = (
    TrialStatus.COMPLETED,
    TrialStatus.INFEASIBLE,
    TrialStatus.FAILED,
    TrialStatus.TIMED_OUT,
    TrialStatus.EARLY_STOPPED,
)
#: What a trial's listener answers to each window of its measurement: why to stop now, or
#: "" to go on (``Target.run_trial``'s ``progress``).
Progress = Callable[[dict[str, float]], str]


@dataclass(frozen=True)
class TrialOutcome:
    """What happened when a target ran one configuration.

    Attributes:
        status: COMPLETED, INFEASIBLE, FAILED, TIMED_OUT, or EARLY_STOPPED (the listener
            of its windows stopped it; ``metrics`` are what the part it ran measured).
        metrics: Metric name -> value (empty unless something was measured).
        reason: Why the trial did not complete; empty for COMPLETED trials.
    """

    status: TrialStatus
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    def __post_init__(self) -> None:
        try:
            status = TrialStatus(self.status)
        except ValueError:
            status = None
        if status not in OUTCOME_STATUSES:
            raise ValidationError(
                "outcome.status", f"{self.status!r} is not a trial outcome", OUTCOME_STATUSES
            )
        object.__setattr__(self, "status", status)
        metrics: dict[str, float] = {}
        for name, value in dict(self.metrics).items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationError(f"outcome.metrics.{name}", f"got {value!r}", "a number")
            metrics[str(name)] = float(value)
        object.__setattr__(self, "metrics", metrics)


class Target(ABC):
    """A system the tuner can configure and measure.

    Use it as a context manager: ``__enter__`` calls ``setup()`` and returns the target,
    ``__exit__`` calls ``close()``. Subclasses take their options as keyword-only
    constructor arguments, validated there with the helpers of this module.
    """

    kind: ClassVar[str] = ""

    # -- life cycle ---------------------------------------------------------------------
    def setup(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Build what the trials need (temporary directories, data). Default: nothing."""

    def close(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Remove everything ``setup()`` made. Idempotent; runs on every exit path."""

    def __enter__(self) -> Self:
        try:
            self.setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- what an adapter provides ------------------------------------------------------
    @abstractmethod
    def describe_knobs(self) -> tuple[Knob, ...]:
        """The knobs this target tunes, with ranges and defaults resolved for this host."""

    @abstractmethod
    def describe_metrics(self) -> dict[str, str]:
        """Metric name -> unit and meaning, for every metric ``measure()`` returns."""

    @abstractmethod
    def apply(self, config: Config) -> None:
        """Put ``config`` into effect.

        Raises:
            ConfigRejected: The configuration itself is at fault (it did not take effect,
                the system would not start, it ran out of memory).
            TargetError: Anything else went wrong (disk, permissions, a missing tool).
        """

    @abstractmethod
    def measure(self) -> dict[str, float]:
        """Run the workload on the applied configuration and return its metrics."""

    @abstractmethod
    def restore(self) -> None:
        """Undo ``apply()``. Safe after a partial ``apply()`` and when nothing was applied."""

    # -- provided ----------------------------------------------------------------------
    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Self:
        """Build the target from a table of options (the ``[target]`` part of a config).

        Raises:
            ValidationError: An option is unknown (the message lists the known ones) or
                its value is not allowed.
        """
        if not isinstance(options, Mapping):
            raise ValidationError("target", "options must be a table", option_names(cls))
        allowed = option_names(cls)
        for key in options:
            if key not in allowed:
                raise ValidationError(
                    f"target.{key}", f"unknown option for a {cls.kind} target", allowed
                )
        return cls(**options)

    def check_space(self, space: SearchSpace) -> None:  # noqa: B027 - optional hook
        """Check the study's knobs against this target's options before any trial runs.

        Raises:
            ValidationError: The options refer to a knob the study does not have (say).
        """

    def describe_candidates(self) -> tuple[Config, ...]:
        """The only configurations this target can run, each setting every knob.

        Empty (the default) when any value of the knobs' ranges can run. A study built from
        the target takes them as its candidate list (``StudySpec.candidates``).
        """
        return ()

    def describe_candidate_features(self) -> tuple[dict[str, float], ...]:
        """Numbers describing each of ``describe_candidates()``, in that order, or empty.

        A study built from the target takes them as ``StudySpec.candidate_features``: the
        model then sees them instead of the ordered knobs (a cloud deployment's total vCPUs
        and memory rather than its instance size and node count).
        """
        return ()

    @property
    def noiseless(self) -> bool:
        """Whether running a configuration again always measures the same numbers (a
        replayed table with one run per configuration, a deterministic simulator); False
        (the default) for a real system. A session on such a target ranks the
        confirmation's candidates by their measured values: there a measurement is the
        truth, and a model's smoothing of it can leave the best measured configuration
        out of the confirmation (``tuner.confirmation.ranked``)."""
        return False

    # -- the length of a measurement (a confirmation round may lengthen it) ------------
    def measurement_window(self) -> tuple[float, float] | None:
        """``(warmup_s, measure_s)`` of one measurement, for a target whose measurement can
        be lengthened (``set_measurement_window``); None (the default) for one whose
        cannot. ``runner.confirm.round_window`` chooses a confirmation round's from the
        session's measured noise."""
        return None

    def set_measurement_window(self, warmup_s: float, measure_s: float) -> None:
        """Measure ``measure_s`` seconds after ``warmup_s`` from the next measurement on
        (only a target whose ``measurement_window`` is not None)."""
        raise TargetError(f"a {self.kind} target's measurement window is fixed")

    def default_config(self) -> Config | None:
        """The knobs' host defaults, or None when some knob has no default."""
        return SearchSpace(self.describe_knobs()).default_config()

    def run_trial(self, config: Config, progress: Progress | None = None) -> TrialOutcome:
        """Apply ``config``, measure it and restore the system, whatever happens.

        Args:
            progress: Hears each window of the measurement as it runs (an adapter that
                reports windows: ``window``) and answers why to stop now, or "" to go on.

        Returns:
            COMPLETED with the metrics; EARLY_STOPPED with what was measured when
            ``progress`` stopped it; INFEASIBLE with the reason on ``ConfigRejected``;
            TIMED_OUT on ``TrialTimedOut``; FAILED with the reason on any other
            ``TargetError``. Other exceptions
            (including ``SystemExit`` from a SIGTERM) propagate once ``restore()`` ran, and
            so does an error raised by ``restore()`` itself: the system may be left
            changed, so the session must stop.
        """
        self._progress, self._stopped = progress, ""
        try:
            self.apply(config)
            metrics = self.measure()
        except TargetError as exc:
            return outcome_of(exc)
        finally:
            self._progress = None
            self.restore()
        if self._stopped:
            return TrialOutcome(TrialStatus.EARLY_STOPPED, metrics, self._stopped)
        return TrialOutcome(TrialStatus.COMPLETED, metrics)

    # -- a measurement in progress (for adapters that report windows) -----------------
    _progress: Progress | None = None
    _stopped: str = ""

    @property
    def watched(self) -> bool:
        """Someone hears this measurement's windows (``run_trial``'s ``progress``): an
        adapter may measure in one piece otherwise."""
        return self._progress is not None

    def window(self, metrics: Mapping[str, float]) -> bool:
        """Report one window of the measurement in progress: the workload's metrics over
        that interval only. An adapter calls this from ``measure()`` after each interval;
        True means stop now: end the workload and return the metrics of what ran."""
        if self._progress is None or self._stopped:
            return bool(self._stopped)
        self._stopped = self._progress(dict(metrics))
        return bool(self._stopped)


def outcome_of(exc: TargetError) -> TrialOutcome:
    """The trial outcome a target error stands for (the one table of it): ``ConfigRejected``
    is INFEASIBLE (the configuration's doing), ``TrialTimedOut`` TIMED_OUT, any other
    ``TargetError`` FAILED (the infrastructure's); the error text is the reason."""
    if isinstance(exc, ConfigRejected):
        status = TrialStatus.INFEASIBLE
    elif isinstance(exc, TrialTimedOut):
        status = TrialStatus.TIMED_OUT
    else:
        status = TrialStatus.FAILED
    return TrialOutcome(status, {}, _reason(exc))


# -- option helpers for adapters --------------------------------------------------------
def full_config(kind: str, knobs: Sequence[Knob], config: Any) -> Config:
    """``config`` validated against ``knobs``, with every knob it leaves out at its default.

    Raises:
        ValidationError: ``config`` is not a mapping, names a knob the target does not tune
            (the message lists those it does), or holds a value the knob does not allow.
    """
    by_name = {k.name: k for k in knobs}
    if not isinstance(config, Mapping):
        raise ValidationError("config", "must be a mapping of knob name to value", tuple(by_name))
    for name in config:
        if name not in by_name:
            raise ValidationError(
                f"config.{name}", f"unknown knob for the {kind} target", tuple(by_name)
            )
    return {
        name: knob.validate(config.get(name, knob.default), f"config.{name}")
        for name, knob in by_name.items()
    }


def option_names(cls: type[Target]) -> tuple[str, ...]:
    """The keyword-only parameters of ``cls.__init__``: the options the target accepts."""
    params = inspect.signature(cls.__init__).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def option_number(
    name: str, value: Any, low: float, high: float, *, open_low: bool = False
) -> float:
    """``value`` as a float in ``[low, high]`` (``(low, high]`` with ``open_low``)."""
    allowed = f"a number in {'(' if open_low else '['}{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(f"target.{name}", f"got {value!r}", allowed)
    if value > high or value < low or (open_low and value == low):
        raise ValidationError(f"target.{name}", f"got {value!r}", allowed)
    return float(value)


def option_int(name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"target.{name}", f"got {value!r}", f"an integer in [{low}, {high}]")
    return value


def option_names_list(name: str, value: Any) -> list[str] | None:
    """``None`` or a list of strings (e.g. knob names)."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValidationError(f"target.{name}", f"got {value!r}", "a list of names, or omit it")
    for item in value:
        if not isinstance(item, str):
            raise ValidationError(f"target.{name}", f"{item!r} is not a name", "strings")
    return list(value)


def option_directory(name: str, value: Any) -> Path | None:
    """``None`` or the path of an existing directory."""
    if value is None:
        return None
    if not isinstance(value, str | Path) or not Path(value).is_dir():
        raise ValidationError(
            f"target.{name}", f"{value!r} is not a directory", "an existing directory"
        )
    return Path(value)


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
