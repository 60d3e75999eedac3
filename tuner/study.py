"""Study specifications: what to tune, toward which goal, under which constraints.

A ``StudySpec`` is a search space, one objective with a goal (or up to four, for a Pareto
front), outcome constraints on measured metrics, linear constraints on the knobs, and
designer settings (initial design size, seed).
It round-trips through a plain dictionary (``to_dict``/``from_dict``) — the same shape as the
``[study]`` part of a TOML config and the JSON stored with a study — so a spec that went in
comes back equal, and two specs are the same study exactly when their dictionaries are equal.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from tuner.constraints import METRIC_NAME, LinearConstraint, OutcomeConstraint
from tuner.errors import ValidationError, relocate
from tuner.space import Config, Knob, SearchSpace, knob_from_dict, value_key

_STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")  # always fullmatch
ALGORITHMS = ("bo", "sobol", "random")
EMBEDDINGS = ("llamatune",)
_SPEC_FIELDS = (
    "name",
    "knobs",
    "objectives",
    "outcome_constraints",
    "parameter_constraints",
    "designer",
    "allow_unsafe",
    "embedding",
    "candidates",
    "candidate_features",
    "stopping",
    "transfer_from",
)
_TRANSFER_FIELDS = ("study", "knobs")
# Sources a study may learn from: each is one more GP in every model-based step.
MAX_TRANSFER_SOURCES = 8
# A candidate list is scored whole on every model-based suggestion; beyond this many the
# space is better described by knob ranges and parameter constraints.
MAX_CANDIDATES = 100_000
# Descriptors per candidate (``StudySpec.candidate_features``): a few numbers, each finite.
MAX_CANDIDATE_FEATURES = 16
_EMBEDDING_FIELDS = ("kind", "dims", "special_bias", "buckets", "seed", "grow_after")
_STOPPING_FIELDS = (
    "early_stop", "confidence", "min_windows", "screen_windows", "screen_keep", "confirm",
)  # fmt: skip
#: How the closing confirmation's rounds stop (``StoppingSettings.confirm``).
CONFIRM_RULES = ("fixed", "sequential")
DEFAULT_GROW_AFTER = 10
DEFAULT_EMBEDDING_DIMS = 16
# More objectives than this make the hypervolume expensive and the Pareto front most of the
# space; Ax and Vizier also stop at a handful.
MAX_OBJECTIVES = 4
_OBJECTIVE_FIELDS = ("name", "goal", "reference")


class Goal(StrEnum):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


@dataclass(frozen=True)
class Objective:
    """A metric to minimize or maximize.

    Attributes:
        name: The metric, as the target reports it. Required.
        goal: ``maximize`` or ``minimize``.
        reference: With several objectives only: the worst value still worth having (see
            below); unset, it is inferred from the trials.

    ``reference`` (multi-objective studies only): the worst value of this metric still worth
    having. The hypervolume the designer improves is measured from it, so the search spends
    no trials on trade-offs beyond it. Unset, it is inferred from the trials measured so far
    (10 % beyond the worst value on the Pareto front, as BoTorch's ``infer_reference_point``).
    """

    name: str
    goal: Goal = Goal.MAXIMIZE
    reference: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not METRIC_NAME.fullmatch(self.name):
            raise ValidationError(
                "objectives.name",
                f"invalid metric name {self.name!r}",
                "a letter or '_' then up to 127 letters, digits, '_', '.', '-'",
            )
        try:
            object.__setattr__(self, "goal", Goal(self.goal))
        except ValueError:
            raise ValidationError(
                f"objectives.{self.name}.goal",
                f"unknown goal {self.goal!r}",
                [g.value for g in Goal],
            ) from None
        if self.reference is not None and (
            isinstance(self.reference, bool)
            or not isinstance(self.reference, int | float)
            or not math.isfinite(self.reference)
        ):
            raise ValidationError(
                f"objectives.{self.name}.reference",
                f"got {self.reference!r}",
                "a finite number",
            )
        if self.reference is not None:
            object.__setattr__(self, "reference", float(self.reference))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "goal": self.goal.value}
        if self.reference is not None:  # only when set: older specs keep their fingerprints
            out["reference"] = self.reference
        return out

    def better(self, a: float, b: float) -> bool:
        """True when ``a`` is strictly better than ``b``."""
        return a > b if self.goal is Goal.MAXIMIZE else a < b


@dataclass(frozen=True)
class DesignerSettings:
    """How suggestions are made.

    Attributes:
        algorithm: ``bo`` (constrained Bayesian optimization), ``sobol`` or ``random``.
        initial_trials: Size of the scrambled-Sobol initial design (not counting the
            default configuration); ``None`` picks ``min(10, max(5, d + 1))`` for ``d`` knobs.
        seed: Seeds the Sobol sequence and every other random choice of the study.
        start_with_default: Suggest the knobs' default configuration first.
        random_fraction: Share of model-based suggestions replaced by random ones.
        expert_priors: Search the knobs' recommended regions first (coarse-to-fine, see
            ``tuner/designer/sampling/priors.py``); off by default.
        retry_failed: How many FAILED trials a configuration may have and still be suggested
            again (0: a configuration that failed once is never suggested again, and its
            failure steers the search away from it, as a configuration that broke the system
            does). Raise it when failures are transient (a flaky network, a preempted VM).
        portfolio: The self-correcting portfolio (``tuner/designer/strategy.py``,
            ``PortfolioStep``): an exploring step when the search stagnates, and from
            then on a random-forest generator beside the GP, chosen from the gains each
            one's trials measured; single objective on a box only, off by default.
    """

    algorithm: str = "bo"
    initial_trials: int | None = None
    seed: int = 0
    start_with_default: bool = True
    random_fraction: float = 0.0
    expert_priors: bool = False
    retry_failed: int = 0
    portfolio: bool = False

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValidationError(
                "designer.algorithm", f"unknown algorithm {self.algorithm!r}", ALGORITHMS
            )
        if self.initial_trials is not None and (
            isinstance(self.initial_trials, bool)
            or not isinstance(self.initial_trials, int)
            or not 1 <= self.initial_trials <= 10_000
        ):
            raise ValidationError(
                "designer.initial_trials",
                f"got {self.initial_trials!r}",
                "an integer in [1, 10000]",
            )
        if (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not 0 <= self.seed < 2**31
        ):
            raise ValidationError("designer.seed", f"got {self.seed!r}", "an integer in [0, 2**31)")
        if not isinstance(self.start_with_default, bool):
            raise ValidationError("designer.start_with_default", "must be true or false")
        if not isinstance(self.expert_priors, bool):
            raise ValidationError("designer.expert_priors", "must be true or false")
        if not isinstance(self.portfolio, bool):
            raise ValidationError("designer.portfolio", "must be true or false")
        if (
            isinstance(self.random_fraction, bool)
            or not isinstance(self.random_fraction, int | float)
            or not 0.0 <= self.random_fraction <= 1.0
        ):
            raise ValidationError(
                "designer.random_fraction", f"got {self.random_fraction!r}", "a number in [0, 1]"
            )
        if (
            isinstance(self.retry_failed, bool)
            or not isinstance(self.retry_failed, int)
            or not 0 <= self.retry_failed <= 100
        ):
            raise ValidationError(
                "designer.retry_failed", f"got {self.retry_failed!r}", "an integer in [0, 100]"
            )

    def initial_size(self, num_knobs: int) -> int:
        if self.initial_trials is not None:
            return self.initial_trials
        return min(10, max(5, num_knobs + 1))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "algorithm": self.algorithm,
            "seed": self.seed,
            "start_with_default": self.start_with_default,
            "random_fraction": float(self.random_fraction),
        }
        if self.initial_trials is not None:
            out["initial_trials"] = self.initial_trials
        if self.expert_priors:  # only when set: older specs keep their fingerprints
            out["expert_priors"] = True
        if self.retry_failed:  # the same
            out["retry_failed"] = self.retry_failed
        if self.portfolio:  # the same
            out["portfolio"] = True
        return out


@dataclass(frozen=True)
class TransferSource:
    """An earlier study this one learns from (``[study] transfer_from``; ``tuner.transfer``).

    Attributes:
        study: The source study's name, in the same storage.
        knobs: Renamed knobs: this study's knob name -> the source's name for it. Knobs
            matched neither by this table nor by an equal name are ignored on either side.
    """

    study: str
    knobs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.study, str) or not _STUDY_NAME.fullmatch(self.study):
            raise ValidationError(
                "transfer_from.study",
                f"invalid study name {self.study!r}",
                "an existing study's name",
            )
        for mine, theirs in self.knobs:
            if not (isinstance(mine, str) and mine and isinstance(theirs, str) and theirs):
                raise ValidationError(
                    "transfer_from.knobs", f"got {mine!r} = {theirs!r}", 'this knob = "source knob"'
                )

    def source_name(self, knob: str) -> str:
        """The source's name for this study's ``knob``."""
        return dict(self.knobs).get(knob, knob)

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study, **({"knobs": dict(self.knobs)} if self.knobs else {})}

    @classmethod
    def from_value(cls, data: Any, i: int) -> TransferSource:
        """A source from a name (``"tpcc"``) or a table (``{study = "tpcc", knobs = {...}}``)."""
        where = f"transfer_from[{i}]"
        if isinstance(data, str):
            data = {"study": data}
        if not isinstance(data, dict):
            raise ValidationError(where, "must be a study name or a table", _TRANSFER_FIELDS)
        unknown = sorted(set(data) - set(_TRANSFER_FIELDS))
        if unknown:
            raise ValidationError(
                f"{where}.{unknown[0]}", "unknown transfer setting", _TRANSFER_FIELDS
            )
        knobs = data.get("knobs", {})
        if not isinstance(knobs, dict):
            raise ValidationError(f"{where}.knobs", 'must be a table: this knob = "source knob"')
        try:
            return cls(data.get("study", ""), tuple(sorted(knobs.items())))
        except ValidationError as error:
            raise relocate(error, "transfer_from", where, f"source {i}") from None


@dataclass(frozen=True)
class StoppingSettings:
    """When a trial's measurement may end early (``[study.stopping]``; the rule is
    ``tuner.stopping``).

    Attributes:
        early_stop: Stop a trial whose windows show it cannot win (``tuner.stopping``); off by
            default until ``bench.cost`` shows no loss of the confirmed gain.
        confidence: One-sided confidence of the bound that must rule the trial out, in
            [0.9, 0.9999]: the chance of stopping a trial that would have won is at most
            ``1 - confidence`` per judged metric when the noise model holds.
        min_windows: Windows that must have arrived before the rule judges, at least 3.
        screen_windows: Short-window screening (successive halving at one rung, after
            Hyperband/ASHA): after this many windows a trial goes on only if what they
            measured ranks among the best ``screen_keep`` of every trial's first windows
            so far (or beats the best trial's); 0 (the default): no screening.
        screen_keep: The share of trials a screen lets go on, in [0.1, 0.9].
        confirm: How the closing confirmation's rounds stop (``runner.confirm``):
            ``fixed``, the session's ``confirm`` rounds (and more only while the interval
            is wide, up to ``confirm_max``), with a t interval; ``sequential``, a round at a
            time after the first ``confirm`` until its interval, a confidence sequence
            valid whenever it stops (``tuner.measurement_stats.sequential_ratio_interval``),
            excludes 1 either way or is narrower than ``confirm_width``, or ``confirm_max``
            rounds or ``confirm_share`` of the session's time are spent. Stored with the
            study, so its verdict is read back with the same interval. A study stored
            without a rule has ``fixed``; a config that names none gets ``sequential``
            (``runner.config.DEFAULT_CONFIRM_RULE``).
    """

    early_stop: bool = False
    confidence: float = 0.99
    min_windows: int = 4
    screen_windows: int = 0
    screen_keep: float = 1 / 3
    confirm: str = "fixed"

    def __post_init__(self) -> None:
        if not isinstance(self.early_stop, bool):
            raise ValidationError("stopping.early_stop", f"got {self.early_stop!r}", "true/false")
        level = self.confidence
        if (
            isinstance(level, bool)
            or not isinstance(level, int | float)
            or not (0.9 <= level <= 0.9999)
        ):
            raise ValidationError(
                "stopping.confidence", f"got {level!r}", "a number in [0.9, 0.9999]"
            )
        windows = self.min_windows
        if isinstance(windows, bool) or not isinstance(windows, int) or not 3 <= windows <= 10_000:
            raise ValidationError(
                "stopping.min_windows", f"got {windows!r}", "an integer in [3, 10000]"
            )
        screen = self.screen_windows
        if isinstance(screen, bool) or not isinstance(screen, int) or not 0 <= screen <= 10_000:
            raise ValidationError(
                "stopping.screen_windows", f"got {screen!r}", "0 (no screening) or 1-10000"
            )
        keep = self.screen_keep
        if isinstance(keep, bool) or not isinstance(keep, int | float) or not 0.1 <= keep <= 0.9:
            raise ValidationError("stopping.screen_keep", f"got {keep!r}", "a number in [0.1, 0.9]")
        if self.confirm not in CONFIRM_RULES:
            raise ValidationError("stopping.confirm", f"got {self.confirm!r}", CONFIRM_RULES)

    @property
    def sequential(self) -> bool:
        """The confirmation stops on a confidence sequence (``confirm = "sequential"``)."""
        return self.confirm == "sequential"

    @property
    def default(self) -> bool:
        return self == StoppingSettings()

    @property
    def stops(self) -> bool:
        """Some rule may end a trial early (the rule, or a screen)."""
        return self.early_stop or self.screen_windows > 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "early_stop": self.early_stop,
            "confidence": float(self.confidence),
            "min_windows": self.min_windows,
        }
        if self.screen_windows:  # only when set: the first specs keep their fingerprints
            out["screen_windows"] = self.screen_windows
            out["screen_keep"] = float(self.screen_keep)
        if self.sequential:
            out["confirm"] = self.confirm
        return out

    @classmethod
    def from_dict(cls, data: Any) -> StoppingSettings:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValidationError("stopping", "must be a table", _STOPPING_FIELDS)
        unknown = sorted(set(data) - set(_STOPPING_FIELDS))
        if unknown:
            raise ValidationError(f"stopping.{unknown[0]}", "unknown setting", _STOPPING_FIELDS)
        return cls(**dict(data))


@dataclass(frozen=True)
class EmbeddingSettings:
    """The LlamaTune search-space reduction (Kanellis et al., PVLDB 2022), per study.

    The optimizer searches a ``dims``-dimensional box; each suggestion is projected onto the
    knobs by a HeSBO count sketch (``tuner/embedding.py``).

    Attributes:
        kind: ``llamatune`` (HeSBO projection + special-value biasing + bucketization).
        dims: Dimensions of the searched box; ``None`` picks ``min(16, knobs - 1)`` when the
            study is created. At most the number of knobs minus one.
        special_bias: Share of a numeric knob's projected axis given to each of its special
            values (LlamaTune: 0.2), so that "off" or "auto" values are actually tried.
        buckets: Distinct values per low-dimensional coordinate, hence at most that many
            distinct values per knob (LlamaTune: 10,000).
        seed: Seeds the projection; ``None`` takes the designer seed when the study is
            created. Stored with the study, so a restarted server rebuilds the same embedding.
        grow_after: After this many trials in a row without a significant improvement, the
            embedding grows: coordinates are split in two, doubling ``dims`` (up to the
            number of knobs), and every trial so far stays a point of the larger embedding
            (nested HeSBO, as in BAxUS). It undoes a projection that put two knobs that
            matter on one coordinate. 0 never grows.
    """

    kind: str = "llamatune"
    dims: int | None = None
    special_bias: float = 0.2
    buckets: int = 10_000
    seed: int | None = None
    grow_after: int = DEFAULT_GROW_AFTER

    def __post_init__(self) -> None:
        if self.kind not in EMBEDDINGS:
            raise ValidationError("embedding.kind", f"unknown embedding {self.kind!r}", EMBEDDINGS)
        if self.dims is not None and (
            isinstance(self.dims, bool) or not isinstance(self.dims, int) or self.dims < 1
        ):
            raise ValidationError(
                "embedding.dims", f"got {self.dims!r}", "an integer >= 1 and < the number of knobs"
            )
        if (
            isinstance(self.special_bias, bool)
            or not isinstance(self.special_bias, int | float)
            or not 0.0 <= self.special_bias < 0.5
        ):
            raise ValidationError(
                "embedding.special_bias", f"got {self.special_bias!r}", "a number in [0, 0.5)"
            )
        if (
            isinstance(self.buckets, bool)
            or not isinstance(self.buckets, int)
            or not 2 <= self.buckets <= 1_000_000_000
        ):
            raise ValidationError(
                "embedding.buckets", f"got {self.buckets!r}", "an integer in [2, 1000000000]"
            )
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not 0 <= self.seed < 2**31
        ):
            raise ValidationError(
                "embedding.seed", f"got {self.seed!r}", "an integer in [0, 2**31)"
            )
        if (
            isinstance(self.grow_after, bool)
            or not isinstance(self.grow_after, int)
            or not 0 <= self.grow_after <= 1_000_000
        ):
            raise ValidationError(
                "embedding.grow_after",
                f"got {self.grow_after!r}",
                "an integer in [0, 1000000] (0: never grow)",
            )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "special_bias": float(self.special_bias),
            "buckets": self.buckets,
        }
        if self.dims is not None:
            out["dims"] = self.dims
        if self.seed is not None:
            out["seed"] = self.seed
        if self.grow_after != DEFAULT_GROW_AFTER:  # specs stored before it existed stay equal
            out["grow_after"] = self.grow_after
        return out


@dataclass(frozen=True)
class StudySpec:
    """Everything that defines a study; immutable once the study exists.

    Attributes:
        name: The study's name: 1-128 letters, digits, ``_``, ``.``, ``-``, starting with a
            letter or digit. Required.
        knobs: The knobs to tune, as ``[[study.knobs]]`` tables (see the knob fields). In a
            config with a ``[target]`` that has a catalog, leave it out to tune the
            catalog's safe knobs (``target.knobs`` names some of them). Stored as ``space``.
        objectives: One to four metrics to optimize, ``{ name = "tps", goal = "maximize" }``
            (see the objective fields). Required.
        outcome_constraints: Bounds a trial's metrics must meet to count, such as
            ``"p95_ms <= 20"``, ``"a + 2*b <= 10"`` or ``"tps >= 0.95 * default"`` (a bound
            relative to the default configuration's measured value).
        parameter_constraints: Linear bounds on numeric knobs that every suggested
            configuration meets, such as ``"shared_buffers_mb + work_mem_mb <= 4096"``.
        designer: How suggestions are made (``[study.designer]``).
        allow_unsafe: Let the study use the knobs' unsafe values (durability or hardware
            risks); off, they are left out of the space.
        embedding: Search a low-dimensional embedding of many knobs (``[study.embedding]``,
            LlamaTune); none by default.
        candidates: A list of whole configurations to choose among instead of the knobs'
            product (a cloud target fills it with its deployments).
        candidate_features: Numbers describing each candidate (up to 16 per candidate, same
            order), which the model uses besides the knobs.
        stopping: When a trial's measurement may end early (``[study.stopping]``,
            ``tuner.stopping``); never by default.
        transfer_from: Earlier studies of related workloads to learn from
            (``tuner.transfer``): their names, or ``{ study = "...", knobs = { mine =
            "theirs" } }`` tables; none by default.
    """

    name: str
    space: SearchSpace
    objectives: tuple[Objective, ...]
    outcome_constraints: tuple[OutcomeConstraint, ...] = ()
    parameter_constraints: tuple[LinearConstraint, ...] = ()
    designer: DesignerSettings = field(default_factory=DesignerSettings)
    allow_unsafe: bool = False
    embedding: EmbeddingSettings | None = None
    candidates: tuple[Config, ...] = ()
    candidate_features: tuple[dict[str, float], ...] = ()
    stopping: StoppingSettings = field(default_factory=StoppingSettings)
    transfer_from: tuple[TransferSource, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _STUDY_NAME.fullmatch(self.name):
            raise ValidationError(
                "name",
                f"invalid study name {self.name!r}",
                "1-128 characters: letters, digits, '_', '.', '-', starting with a letter or digit",
            )
        objectives = tuple(self.objectives)
        if not 1 <= len(objectives) <= MAX_OBJECTIVES:
            raise ValidationError(
                "objectives",
                f"got {len(objectives)} objectives",
                f"1 to {MAX_OBJECTIVES} objectives",
            )
        names = [o.name for o in objectives]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValidationError(
                    f"objectives[{i}].name", f"metric {name!r} is already an objective"
                )
        if len(objectives) == 1 and objectives[0].reference is not None:
            raise ValidationError(
                f"objectives.{objectives[0].name}.reference",
                "a reference point only applies to a study with several objectives",
                "no reference with one objective",
            )
        object.__setattr__(self, "objectives", objectives)
        object.__setattr__(self, "outcome_constraints", tuple(self.outcome_constraints))
        object.__setattr__(self, "parameter_constraints", tuple(self.parameter_constraints))
        if not isinstance(self.allow_unsafe, bool):
            raise ValidationError("allow_unsafe", "must be true or false")
        if not self.allow_unsafe:
            object.__setattr__(
                self, "space", SearchSpace(tuple(k.safe() for k in self.space.knobs))
            )
        relative = [str(c) for c in self.outcome_constraints if c.relative]
        if relative and not self.designer.start_with_default:
            raise ValidationError(
                "designer.start_with_default",
                f"{relative[0]!r} is relative to the default configuration, which is only "
                "measured with start_with_default = true",
                "true",
            )
        if relative and self.space.default_config() is None:
            missing = [k.name for k in self.space.knobs if k.default is None]
            raise ValidationError(
                "outcome_constraints",
                f"{relative[0]!r} is relative to the default configuration, but knob "
                f"{missing[0]!r} has no default",
                "an absolute bound, or a default for every knob",
            )
        for constraint in self.parameter_constraints:
            for name, _ in constraint.terms:
                if name not in self.space:
                    raise ValidationError(
                        "parameter_constraints",
                        f"{constraint} names unknown knob {name!r}",
                        self.space.names,
                    )
        if self.embedding is not None:
            object.__setattr__(self, "embedding", self._resolved_embedding(self.embedding))
        object.__setattr__(self, "candidates", self._checked_candidates(self.candidates))
        object.__setattr__(
            self, "candidate_features", self._checked_features(self.candidate_features)
        )
        object.__setattr__(self, "transfer_from", self._checked_sources(self.transfer_from))

    def _checked_sources(self, sources: Any) -> tuple[TransferSource, ...]:
        """Distinct earlier studies, not this one, whose renames name this study's knobs."""
        sources = tuple(sources)
        if len(sources) > MAX_TRANSFER_SOURCES:
            raise ValidationError(
                "transfer_from", f"got {len(sources)}", f"at most {MAX_TRANSFER_SOURCES} studies"
            )
        if sources and self.multi_objective:
            raise ValidationError(
                "transfer_from",
                "transfer learns one objective; this study has several",
                "no transfer_from with several objectives",
            )
        seen: set[str] = set()
        for i, source in enumerate(sources):
            if not isinstance(source, TransferSource):
                raise ValidationError(f"transfer_from[{i}]", f"got {source!r}", "a study name")
            if source.study == self.name:
                raise ValidationError(
                    f"transfer_from[{i}].study", "a study cannot learn from itself", "another study"
                )
            if source.study in seen:
                raise ValidationError(
                    f"transfer_from[{i}].study",
                    f"{source.study!r} is named twice",
                    "distinct studies",
                )
            seen.add(source.study)
            for mine, _ in source.knobs:
                if mine not in self.space:
                    raise ValidationError(
                        f"transfer_from[{i}].knobs.{mine}",
                        "names no knob of this study",
                        self.space.names,
                    )
        return sources

    def _checked_candidates(self, candidates: Any) -> tuple[Config, ...]:
        """The allowed configurations, each validated; empty means "the whole space".

        A finite candidate set describes spaces that ranges and linear constraints cannot,
        such as cloud deployments where each instance size comes with its own node counts
        (Scout's 69 configurations): every suggestion is one of them.
        """
        if isinstance(candidates, str | bytes | dict) or not hasattr(candidates, "__iter__"):
            raise ValidationError("candidates", "must be a list of configurations")
        candidates = tuple(candidates)
        if not candidates:
            return ()
        if len(candidates) > MAX_CANDIDATES:
            raise ValidationError(
                "candidates", f"got {len(candidates)}", f"at most {MAX_CANDIDATES} configurations"
            )
        if self.embedding is not None:
            raise ValidationError(
                "candidates",
                "a candidate list cannot be searched through an embedding",
                "no embedding with candidates",
            )
        seen: dict[tuple[object, ...], int] = {}
        out = []
        for i, raw in enumerate(candidates):
            config = self.space.validate_config(raw, f"candidates[{i}]")
            key = tuple(value_key(config[n]) for n in self.space.names)
            if key in seen:
                raise ValidationError(
                    f"candidates[{i}]",
                    f"repeats candidates[{seen[key]}]",
                    "distinct configurations",
                )
            seen[key] = i
            if not self.satisfies_parameter_constraints(config):
                broken = next(c for c in self.parameter_constraints if not c.satisfied(config))
                raise ValidationError(
                    f"candidates[{i}]", f"breaks the parameter constraint {str(broken)!r}"
                )
            out.append(config)
        default = self.space.default_config()
        if self.designer.start_with_default and default is not None:
            key = tuple(value_key(default[n]) for n in self.space.names)
            if key not in seen:
                raise ValidationError(
                    "candidates",
                    f"the knobs' default configuration {default} is not a candidate",
                    "a list that includes it, or designer.start_with_default = false",
                )
        return tuple(out)

    def _checked_features(self, features: Any) -> tuple[dict[str, float], ...]:
        """Numeric descriptors of each candidate, which the model uses instead of the
        ordered knobs; empty means "model the knobs".

        A cloud deployment is better described by what it provides than by its knobs: 8
        nodes of ``c4.2xlarge`` and 2 of ``c4.8xlarge`` both have 64 vCPUs, which knob
        coordinates (a size level and a node count) put far apart. One mapping per
        candidate, in the candidates' order, all with the same names (at most
        ``MAX_CANDIDATE_FEATURES``) and finite values. Candidates with the same features and
        categorical knobs (4 x ``xlarge`` and 8 x ``large``) look alike to the model.
        """
        if isinstance(features, str | bytes | dict) or not hasattr(features, "__iter__"):
            raise ValidationError("candidate_features", "must be a list of tables of numbers")
        features = tuple(features)
        if not features:
            return ()
        if len(features) != len(self.candidates):
            raise ValidationError(
                "candidate_features",
                f"got {len(features)} entries for {len(self.candidates)} candidates",
                "one table of numbers per candidate, in the candidates' order",
            )
        names: list[str] = []
        out: list[dict[str, float]] = []
        for i, raw in enumerate(features):
            where = f"candidate_features[{i}]"
            if not isinstance(raw, dict) or not raw:
                raise ValidationError(where, "must be a non-empty table of numbers")
            if i == 0:
                names = sorted(raw)
                if len(names) > MAX_CANDIDATE_FEATURES:
                    raise ValidationError(
                        where, f"got {len(names)} features", f"at most {MAX_CANDIDATE_FEATURES}"
                    )
                for name in names:
                    if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
                        raise ValidationError(
                            f"{where}.{name}", "invalid feature name", METRIC_NAME.pattern
                        )
            elif sorted(raw) != names:
                raise ValidationError(
                    where, f"has features {sorted(raw)}; every candidate needs the same", names
                )
            row: dict[str, float] = {}
            for name in names:
                value = raw[name]
                number = isinstance(value, int | float) and not isinstance(value, bool)
                if not number or not math.isfinite(value):
                    raise ValidationError(f"{where}.{name}", f"got {value!r}", "a finite number")
                row[name] = float(value)
            out.append(row)
        return tuple(out)

    def _resolved_embedding(self, embedding: EmbeddingSettings) -> EmbeddingSettings:
        """Fill in ``dims`` and ``seed`` so the stored spec pins the projection down."""
        n = len(self.space)
        if n < 2:
            raise ValidationError(
                "embedding", f"needs at least 2 knobs to reduce, the study has {n}", ">= 2 knobs"
            )
        dims = embedding.dims if embedding.dims is not None else min(DEFAULT_EMBEDDING_DIMS, n - 1)
        if dims > n - 1:
            raise ValidationError(
                "embedding.dims",
                f"{dims} dimensions for {n} knobs: an embedding must reduce the space",
                f"an integer in [1, {n - 1}]",
            )
        most = max((len(k.special_values) for k in self.space.knobs), default=0)
        if most * embedding.special_bias >= 1.0:
            raise ValidationError(
                "embedding.special_bias",
                f"{embedding.special_bias} x {most} special values of one knob leaves no room "
                "for its other values",
                f"a number below {1.0 / most:.3g}",
            )
        seed = embedding.seed if embedding.seed is not None else self.designer.seed
        return replace(embedding, dims=dims, seed=seed)

    @property
    def objective(self) -> Objective:
        """The objective, or the first of several (multi-objective studies)."""
        return self.objectives[0]

    @property
    def fits_models(self) -> bool:
        """Whether the study's designer may fit a model (BO, or anything in an embedding); the
        quasi-random designer (``sobol``, ``random``) never does, and suggests in milliseconds."""
        return self.embedding is not None or self.designer.algorithm == "bo"

    @property
    def learns_from_sources(self) -> bool:
        """Whether transfer sources reach its designer: BO (in an embedding or not) with one
        objective (``tuner/designer/models/transfer.py``)."""
        return self.designer.algorithm == "bo" and not self.multi_objective

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    @property
    def metric_names(self) -> tuple[str, ...]:
        """Metrics a completed trial must report: the objective, then constrained metrics."""
        names = [o.name for o in self.objectives]
        for c in self.outcome_constraints:
            if c.metric not in names:
                names.append(c.metric)
        return tuple(names)

    def satisfies_parameter_constraints(self, config: dict[str, Any]) -> bool:
        return all(c.satisfied(config) for c in self.parameter_constraints)

    def with_name(self, name: str) -> StudySpec:
        return replace(self, name=name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "knobs": [k.to_dict() for k in self.space.knobs],
            "objectives": [o.to_dict() for o in self.objectives],
            "outcome_constraints": [str(c) for c in self.outcome_constraints],
            "parameter_constraints": [str(c) for c in self.parameter_constraints],
            "designer": self.designer.to_dict(),
            "allow_unsafe": self.allow_unsafe,
            # only when set: specs without an embedding keep their fingerprints
            **({"embedding": self.embedding.to_dict()} if self.embedding else {}),
            **({"candidates": [dict(c) for c in self.candidates]} if self.candidates else {}),
            **(
                {"candidate_features": [dict(f) for f in self.candidate_features]}
                if self.candidate_features
                else {}
            ),
            # only when set: specs that stop no trial early keep their fingerprints
            **({} if self.stopping.default else {"stopping": self.stopping.to_dict()}),
            **(
                {"transfer_from": [t.to_dict() for t in self.transfer_from]}
                if self.transfer_from
                else {}
            ),
        }

    def fingerprint(self) -> str:
        """A stable hash of the spec, used to tell "same study" from "name clash"."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: Any, knobs: tuple[Knob, ...] | None = None) -> StudySpec:
        """Build and validate a spec; ``knobs`` replaces ``data["knobs"]`` when given."""
        if not isinstance(data, dict):
            raise ValidationError("study", "must be a table/object")
        unknown = set(data) - set(_SPEC_FIELDS)
        if unknown:
            raise ValidationError(sorted(unknown)[0], "unknown study field", _SPEC_FIELDS)
        if knobs is None:
            raw = data.get("knobs")
            if not isinstance(raw, list):
                raise ValidationError("knobs", "must be a list of knob tables")
            knobs = tuple(knob_from_dict(k, f"knobs[{i}]") for i, k in enumerate(raw))
        space = SearchSpace(tuple(knobs))
        allow_unsafe = data.get("allow_unsafe", False)
        if allow_unsafe is False:
            space = SearchSpace(tuple(k.safe() for k in space.knobs))
        return cls(
            name=data.get("name", ""),
            space=space,
            objectives=tuple(_objective(o, i) for i, o in enumerate(_list(data, "objectives"))),
            outcome_constraints=tuple(
                OutcomeConstraint.parse(t, f"outcome_constraints[{i}]")
                for i, t in enumerate(_list(data, "outcome_constraints"))
            ),
            parameter_constraints=tuple(
                LinearConstraint.parse(t, space, f"parameter_constraints[{i}]")
                for i, t in enumerate(_list(data, "parameter_constraints"))
            ),
            designer=_designer(data.get("designer", {})),
            allow_unsafe=allow_unsafe,
            embedding=_embedding(data.get("embedding")),
            candidates=tuple(_list(data, "candidates")),
            candidate_features=tuple(_list(data, "candidate_features")),
            stopping=StoppingSettings.from_dict(data.get("stopping")),
            transfer_from=tuple(
                TransferSource.from_value(t, i) for i, t in enumerate(_list(data, "transfer_from"))
            ),
        )


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list | tuple):
        raise ValidationError(key, "must be a list")
    return list(value)


def _objective(data: Any, i: int) -> Objective:
    if not isinstance(data, dict) or "name" not in data:
        raise ValidationError(
            f"objectives[{i}]", "must be a table with 'name' and 'goal'", _OBJECTIVE_FIELDS
        )
    unknown = sorted(set(data) - set(_OBJECTIVE_FIELDS))
    if unknown:
        raise ValidationError(
            f"objectives[{i}].{unknown[0]}", "unknown objective setting", _OBJECTIVE_FIELDS
        )
    try:
        return Objective(data["name"], data.get("goal", Goal.MAXIMIZE.value), data.get("reference"))
    except ValidationError as error:  # named by its place, as the knobs are
        name = data["name"]
        raise relocate(
            error, f"objectives.{name}", f"objectives[{i}]", f"objective {name!r}"
        ) from None


def _embedding(data: Any) -> EmbeddingSettings | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValidationError("embedding", "must be a table/object", _EMBEDDING_FIELDS)
    unknown = set(data) - set(_EMBEDDING_FIELDS)
    if unknown:
        raise ValidationError(
            f"embedding.{sorted(unknown)[0]}", "unknown embedding setting", _EMBEDDING_FIELDS
        )
    return EmbeddingSettings(**data)


def _designer(data: Any) -> DesignerSettings:
    if not isinstance(data, dict):
        raise ValidationError("designer", "must be a table/object")
    allowed = (
        "algorithm",
        "initial_trials",
        "seed",
        "start_with_default",
        "random_fraction",
        "expert_priors",
        "retry_failed",
        "portfolio",
    )
    unknown = set(data) - set(allowed)
    if unknown:
        raise ValidationError(f"designer.{sorted(unknown)[0]}", "unknown designer setting", allowed)
    return DesignerSettings(**data)
