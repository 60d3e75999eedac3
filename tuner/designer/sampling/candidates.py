"""Searching a finite list of allowed configurations (``StudySpec.candidates``).

Some spaces are a list rather than a box: a cloud job runs on one of Scout's 69 deployments,
where each instance size comes with its own node counts. The designer then never proposes
anything off the list:

* the initial design takes the study's scrambled Sobol sequence and moves each point to the
  nearest candidate that no earlier point of the sequence got: a choice knob's coordinate
  is read as one of its levels (equal shares), candidates that match the point on every
  choice knob come first, then the nearest in the unit-box encoding (a categorical
  coordinate that differs counts as distance 1). So the design spreads over families and
  sizes as Sobol spreads its points, whatever the number of candidates each has. The
  design is a fixed order of the candidates for a seed, and a call returns the first ones
  of it not yet measured: asking for one point three times gives the same three points as
  asking for three at once (moving each call's *first* point to the nearest untaken
  candidate instead would walk the neighbours of one point, e.g. one instance type at
  12, 10 and 8 nodes);
* model-based steps score every candidate not yet taken with the acquisition function and
  pick the best, several at once by sequential greedy selection with the earlier picks as
  pending points (BoTorch ``optimize_acqf_discrete``), the exact optimum over the list;
* random fill-ins draw uniformly among the untaken candidates.

With ``StudySpec.candidate_features`` the model does not see the ordered knobs at all: its
inputs are the categorical knobs' coordinates followed by the features, each mapped onto
``[0, 1]`` over the candidates (in log space when positive and spanning more than a factor
of 10), see ``FeatureEncoder``. The design and the random fill-ins still work on the knobs.
On the cloud benchmark, totals of vCPUs and memory (nodes x instance) in place of the size
and node-count knobs let the GP see that 8 small nodes and 2 large ones are alike.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

import torch
from botorch.acquisition import AcquisitionFunction
from botorch.optim import optimize_acqf_discrete

from tuner.designer.sampling.priors import PriorRegion
from tuner.encoding import CATEGORICAL, ConfigKey, UnitBoxEncoder
from tuner.space import Config, _ChoiceKnob

# Candidates scored per batch of the acquisition function (memory, not results).
_BATCH = 2048
# A positive feature spanning more than this factor is mapped in log space.
_LOG_SPAN = 10.0


class FeatureEncoder:
    """The model's inputs for a study with candidate features: every categorical knob's
    unit-box coordinate, then each feature (sorted by name) mapped onto ``[0, 1]`` over the
    candidates. Only candidates can be encoded; it has the parts of ``UnitBoxEncoder`` that
    the model uses (``d``, ``cat_dims``, ``encode_many``)."""

    def __init__(
        self,
        encoder: UnitBoxEncoder,
        candidates: tuple[Config, ...],
        features: tuple[dict[str, float], ...],
        index: dict[ConfigKey, int],
    ) -> None:
        self.base = encoder
        self.categorical = sorted(encoder.cat_dims)
        self.names = sorted(features[0])
        X = encoder.encode_many(list(candidates))[:, self.categorical]
        columns = [_unit([row[name] for row in features]) for name in self.names]
        self.X = torch.cat([X, torch.tensor(columns, dtype=torch.float64).T], dim=-1)
        self.rows = index  # candidate key -> row of X

    @property
    def d(self) -> int:
        return len(self.categorical) + len(self.names)

    @property
    def cat_dims(self) -> dict[int, list[float]]:
        levels = self.base.cat_dims
        return {j: levels[i] for j, i in enumerate(self.categorical)}

    def encode_many(self, configs: list[Config]) -> torch.Tensor:
        """``n x d`` model inputs of ``configs``, each of which must be a candidate."""
        rows = []
        for config in configs:
            row = self.rows.get(self.base.key(config))
            if row is None:
                raise ValueError(f"{config} is not one of the study's candidates")
            rows.append(row)
        return self.X[rows] if rows else self.X[:0]


def _unit(values: list[float]) -> list[float]:
    """``values`` mapped onto ``[0, 1]`` (log first when positive and spanning > 10x)."""
    if min(values) > 0 and max(values) / min(values) > _LOG_SPAN:
        values = [math.log(v) for v in values]
    low, high = min(values), max(values)
    if high - low <= 0:
        return [0.5] * len(values)
    return [(v - low) / (high - low) for v in values]


class CandidatePool:
    """The study's candidate configurations with their encodings and keys."""

    def __init__(
        self,
        candidates: tuple[Config, ...],
        encoder: UnitBoxEncoder,
        features: tuple[dict[str, float], ...] = (),
    ) -> None:
        self.encoder = encoder
        self.configs = candidates
        self.keys = [encoder.key(c) for c in candidates]
        self.index = {key: i for i, key in enumerate(self.keys)}
        self.X = encoder.encode_many(list(candidates))
        # what the model sees: the knobs' encoding, or the categorical knobs and features
        self.model_encoder: UnitBoxEncoder | FeatureEncoder = encoder
        self.model_X = self.X
        if features:
            self.model_encoder = FeatureEncoder(encoder, candidates, features, self.index)
            self.model_X = self.model_encoder.X
        self._categorical = torch.tensor(
            [dim.layout == CATEGORICAL for dim in encoder.dims], dtype=torch.bool
        )
        # choice knobs (categorical, ordinal, bool): coordinate -> level, each level an
        # equal share of [0, 1], so a uniform point picks every choice equally often
        self._choices = [
            (i, dim.levels)
            for i, dim in enumerate(encoder.dims)
            if isinstance(dim.knob, _ChoiceKnob)
        ]
        self._choice = torch.zeros(encoder.d, dtype=torch.bool)
        for i, _ in self._choices:
            self._choice[i] = True

    def __contains__(self, config: Config) -> bool:
        return self.encoder.key(config) in self.index

    def untaken(self, taken: Iterable[ConfigKey], region: PriorRegion | None = None) -> list[int]:
        """Indices of the candidates not in ``taken`` (inside ``region`` when any is)."""
        skip = set(taken)
        return [i for i in self.allowed(region) if self.keys[i] not in skip]

    def allowed(self, region: PriorRegion | None = None) -> list[int]:
        """Indices of the candidates inside ``region`` (all of them without one)."""
        every = list(range(len(self.configs)))
        if region is None:
            return every
        inside = [i for i in every if region.contains(self.encoder, self.configs[i])]
        return inside or every  # a region that holds no candidate restricts nothing

    def design(
        self,
        points: Iterable[torch.Tensor],
        count: int,
        taken: Iterable[ConfigKey],
        region: PriorRegion | None = None,
    ) -> list[Config]:
        """The first ``count`` untaken candidates of the design that ``points`` induce.

        Each point in turn gets the nearest candidate (of those ``allowed`` in ``region``)
        that no earlier point got; taken candidates keep their place in that order but are
        not returned.
        """
        skip = set(taken)
        left = self.allowed(region)
        out: list[Config] = []
        for point in points:
            if len(out) == count or not left:
                break
            config = self.configs[left.pop(self._nearest(point, left))]
            if self.encoder.key(config) not in skip:
                out.append(config)
        return out

    def nearest(self, point: torch.Tensor) -> Config:
        """The candidate nearest to ``point`` (a point of the unit box)."""
        every = list(range(len(self.configs)))
        return self.configs[self._nearest(point, every)]

    def _nearest(self, point: torch.Tensor, left: list[int]) -> int:
        """Position in ``left`` of the candidate nearest to ``point``."""
        point = point.to(torch.float64).clone()
        for i, levels in self._choices:
            point[i] = levels[min(len(levels) - 1, int(float(point[i]) * len(levels)))]
        diff = (self.X[left] - point).abs()
        diff = torch.where(self._categorical & (diff > 1e-9), torch.ones_like(diff), diff)
        # a candidate that matches the point on every choice knob comes first (a mismatch
        # outweighs any numeric distance); then the nearest numerically
        mismatches = ((diff > 1e-9) & self._choice).sum(dim=-1)
        distance = (diff**2).sum(dim=-1) + 4.0 * self.encoder.d * mismatches
        return int(torch.argmin(distance))

    def random(self, seed: int, count: int, free: list[int]) -> list[Config]:
        """``count`` distinct candidates of ``free`` drawn uniformly."""
        chosen = random.Random(seed).sample(free, min(count, len(free)))
        return [self.configs[i] for i in chosen]

    def best(self, acquisition: AcquisitionFunction, count: int, free: list[int]) -> list[Config]:
        """The ``count`` candidates of ``free`` that maximize ``acquisition`` jointly."""
        if not free or count <= 0:
            return []
        count = min(count, len(free))
        choices = self.model_X[free]
        picked, _ = optimize_acqf_discrete(
            acquisition, q=count, choices=choices, max_batch_size=_BATCH, unique=True
        )
        # candidates whose inputs are equal (features that cannot tell them apart) look the
        # same to the model: the last of them in list order stands for all
        rows = {tuple(row.tolist()): i for i, row in zip(free, choices, strict=True)}
        return [self.configs[rows[tuple(row.tolist())]] for row in picked]
