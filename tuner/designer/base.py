"""The designer contract: propose configurations from a study's stored history.

After OSS Vizier's ``Designer``: ``suggest(count, completed, pending)`` sees every finished
trial and every trial still in flight, and returns new configurations. A designer keeps no
state of its own between calls, so a server that crashed and restarted loses nothing and
continues from the stored history. Without a fit cache, the same history always gives the
same suggestions (every random choice derives from the study seed and the history size,
and from a ``salt`` only when the service asks again because another writer stored the
first answer's configurations meanwhile); with one, model fits start from the previous
step's hyperparameters, which can move a suggestion by a rounding-sized amount but never
changes what is stored or replayed.

``History`` sorts the trials once into what each part of a designer needs: trials the model
learns from, pending points, and the set of configurations that must not be suggested again.
A configuration whose FAILED trials outnumber ``designer.retry_failed`` (0 by default) is
never suggested again, and its failed trials join the observed ones: the feasibility model
learns that the configuration breaks (a failure of the measurement, on a cloud study a
deployment the provider cannot give, that repeats is as good as a configuration's fault).
"""

from __future__ import annotations

import hashlib
from collections import Counter
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
        transfer: What the transfer sources weighed in the model that made it: ``(source,
            weight)`` pairs, the study's own model as ``""`` (``models/transfer.py``); empty
            without sources or for a step without a model.
    """

    config: Config
    step: StepKind
    warning: str = ""
    embedded: tuple[float, ...] = ()
    transfer: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class History:
    """A study's trials, sorted for the designer.

    Attributes:
        observed: Trials the model learns from (COMPLETED, INFEASIBLE, TIMED_OUT, and FAILED
            beyond the retries the study allows).
        pending: Trials handed out or queued and not finished (ACTIVE, PENDING).
        taken: Keys of configurations never to suggest again (observed, pending, abandoned,
            failed beyond the retries).
        size: Number of trials that count (all but FAILED ones still allowed a retry):
            seeds derive from it, so a retried configuration gets the same seed.
        designed: Of those, the ones that count toward the initial design: all but the
            default configuration, which comes on top of the design, and failed ones.
        salt: 0, or a number that makes this call's draws differ from those of another
            call with the same trials (``seed``): the service asks again with one when
            another writer stored its first answer's configurations meanwhile.
    """

    observed: tuple[Trial, ...]
    pending: tuple[Trial, ...]
    taken: frozenset[ConfigKey] = field(default_factory=frozenset)
    size: int = 0
    designed: int = 0
    salt: int = 0

    @classmethod
    def build(
        cls,
        encoder: UnitBoxEncoder,
        completed: Sequence[Trial],
        pending: Sequence[Trial],
        retry_failed: int = 0,
        salt: int = 0,
    ) -> History:
        failures = Counter(encoder.key(t.config) for t in completed if _failed(t))
        broken = {key for key, n in failures.items() if n > retry_failed}
        observed = tuple(
            t for t in completed
            if t.status in OBSERVED or (_failed(t) and encoder.key(t.config) in broken)
        )  # fmt: skip
        active = tuple(t for t in pending if t.status.is_pending)
        kept = [t for t in (*completed, *active) if not _failed(t)]
        taken = frozenset(encoder.key(t.config) for t in kept) | broken
        designed = sum(t.step is not StepKind.DEFAULT for t in kept)
        size = len(kept) + sum(_failed(t) and encoder.key(t.config) in broken for t in completed)
        return cls(observed, active, taken, size, designed, salt)

    def seed(self, study_seed: int, *parts: object) -> int:
        """``derive_seed(study_seed, *parts)``, with the ``salt`` when there is one (so
        without a salt the same history always gives the same draw)."""
        if not self.salt:
            return derive_seed(study_seed, *parts)
        return derive_seed(study_seed, *parts, f"salt:{self.salt}")

    @property
    def learned(self) -> bool:
        """Some trial was measured (COMPLETED or EARLY_STOPPED): a model has something to
        learn from."""
        return any(t.status.measured for t in self.observed)


def _failed(trial: Trial) -> bool:
    return trial.status is TrialStatus.FAILED


class Designer:
    """Base class: subclasses implement ``suggest``."""

    def __init__(self, spec: StudySpec) -> None:
        self.spec = spec
        self.encoder = UnitBoxEncoder(spec.space)

    def suggest(
        self, count: int, completed: Sequence[Trial], pending: Sequence[Trial], salt: int = 0
    ) -> list[Suggestion]:
        """Propose ``count`` new configurations (fewer only when the space is exhausted).

        ``salt``: 0, or another number for draws that differ from those of a call with
        the same trials (``History.salt``)."""
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
