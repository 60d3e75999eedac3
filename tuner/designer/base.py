"""The designer contract: propose configurations from a study's stored history.

After OSS Vizier's ``Designer``: ``suggest(count, completed, pending)`` sees every finished
trial and every trial still in flight, and returns new configurations. A designer keeps no
state of its own between calls, so a server that crashed and restarted loses nothing and
continues from the stored history. Without a fit cache, the same history always gives the
same suggestions (every random choice derives from the study seed and the history size);
with one, model fits start from the previous step's hyperparameters, which can move a
suggestion by a rounding-sized amount but never changes what is stored or replayed.

``History`` sorts the trials once into what each part of a designer needs: trials the model
learns from, pending points, and the set of configurations that must not be suggested again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuner.encoding import ConfigKey, UnitBoxEncoder
from tuner.errors import StateError
from tuner.space import Config
from tuner.study import StudySpec
from tuner.trial import OBSERVED, StepKind, Trial, TrialStatus


@dataclass(frozen=True)
class Suggestion:
    """A proposed configuration and what produced it.

    Attributes:
        config: Knob name -> value, valid for the study's space and parameter constraints.
        step: The step of the generation strategy that made it (``strategy.py``).
        warning: Numerical trouble met while producing it (recorded on the trial).
        embedded: The low-dimensional point it was projected from, for studies searched in
            an embedding (stored with the trial so the history replays exactly); else empty.
    """

    config: Config
    step: StepKind
    warning: str = ""
    embedded: tuple[float, ...] = ()


@dataclass(frozen=True)
class History:
    """A study's trials, sorted for the designer.

    Attributes:
        observed: Trials the model learns from (COMPLETED, INFEASIBLE, TIMED_OUT).
        pending: Trials handed out or queued and not finished (ACTIVE, PENDING).
        taken: Keys of configurations never to suggest again (observed, pending, abandoned).
            FAILED trials are not included: an infrastructure failure says nothing about the
            configuration, so it may be tried again.
        size: Number of trials that are not FAILED (seeds derive from it).
        designed: Of those, the ones that count toward the initial design: all but the
            default configuration, which comes on top of the design.
    """

    observed: tuple[Trial, ...]
    pending: tuple[Trial, ...]
    taken: frozenset[ConfigKey] = field(default_factory=frozenset)
    size: int = 0
    designed: int = 0

    @classmethod
    def build(
        cls, encoder: UnitBoxEncoder, completed: Sequence[Trial], pending: Sequence[Trial]
    ) -> History:
        observed = tuple(t for t in completed if t.status in OBSERVED)
        active = tuple(t for t in pending if t.status.is_pending)
        kept = [t for t in (*completed, *active) if t.status is not TrialStatus.FAILED]
        taken = frozenset(encoder.key(t.config) for t in kept)
        designed = sum(t.step is not StepKind.DEFAULT for t in kept)
        return cls(observed, active, taken, len(kept), designed)

    @property
    def learned(self) -> bool:
        """Some trial COMPLETED: a model has something to learn from."""
        return any(t.status is TrialStatus.COMPLETED for t in self.observed)


class Designer:
    """Base class: subclasses implement ``suggest``."""

    def __init__(self, spec: StudySpec) -> None:
        self.spec = spec
        self.encoder = UnitBoxEncoder(spec.space)

    def suggest(
        self, count: int, completed: Sequence[Trial], pending: Sequence[Trial]
    ) -> list[Suggestion]:
        """Propose ``count`` new configurations (fewer only when the space is exhausted)."""
        raise NotImplementedError


def derive_seed(seed: int, *parts: object) -> int:
    """A 31-bit seed derived from the study seed and the call's context (stable across runs)."""
    text = ":".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


def checked(out: list[Suggestion], count: int, spec: StudySpec) -> list[Suggestion]:
    """The first ``count`` of ``out``; an empty answer to a request means the space is used up.

    Raises:
        StateError: Nothing could be suggested.
    """
    if not out and count > 0:
        raise StateError(
            f"study {spec.name}: the search space is exhausted; every valid configuration "
            "has been tried or is pending"
        )
    return out[:count]
