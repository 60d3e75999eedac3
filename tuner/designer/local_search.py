"""Acquisition optimization over mixed spaces by batched local search.

Systems knobs are mostly discrete: modes (categorical), levels (ordinal), small integer
ranges, with a few continuous or large-integer knobs. Gradient-based optimizers then spend
most of their time on relaxations that must be rounded away. This optimizer instead moves
between *valid configurations* only:

1. candidate starts: scrambled-Sobol points of the box and the best trials so far (snapped to
   valid configurations), scored by the acquisition in large no-gradient batches;
2. from the best ``num_restarts`` starts, hill-climb: each round scores every neighbour of
   every current point at once (the adjacent levels of an ordinal or integer knob, every other
   choice of a categorical knob, steps of 1/64, 1/16 and 1/4 of the range of a continuous
   knob) and moves to the best one while the acquisition improves;
3. configurations already taken (completed, pending, chosen) and ones breaking a linear
   parameter constraint are never scored, so the result needs no de-duplication.

For ``q > 1`` picks are greedy: each pick joins ``X_pending`` before the next one.
Every step is a batched posterior evaluation, so the cost is a few hundred acquisition
batches instead of thousands of sequential L-BFGS iterations.

References:
    Golovin et al., "Google Vizier", KDD 2017 (gradient-free acquisition search).
    Oh et al., "Combinatorial Bayesian optimization using the graph Cartesian product",
    NeurIPS 2019 (local search over neighbour graphs of discrete variables).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from botorch.acquisition import AcquisitionFunction
from torch.quasirandom import SobolEngine

from tuner.designer.priors import PriorRegion
from tuner.encoding import CATEGORICAL, CONTINUOUS, ConfigKey, UnitBoxEncoder
from tuner.space import Config

_CONTINUOUS_STEPS = (1 / 64, 1 / 16, 1 / 4)
_BATCH = 512
_MAX_ROUNDS = 30


class LocalSearch:
    """Maximizes an acquisition function over the valid configurations of a space.

    Args:
        encoder: The space's unit-box encoder.
        is_valid: Whether a configuration satisfies the parameter constraints.
        taken: Keys (``encoder.key``) of configurations never to return.
        region: Search only inside this recommended region (expert priors).
    """

    def __init__(
        self,
        encoder: UnitBoxEncoder,
        is_valid: Callable[[Config], bool],
        taken: set[ConfigKey],
        region: PriorRegion | None = None,
    ) -> None:
        self.encoder = encoder
        self.region = region
        self.is_valid = is_valid
        if region is not None:  # search only inside the recommended region

            def is_valid_here(config: Config) -> bool:
                return region.contains(encoder, config) and is_valid(config)

            self.is_valid = is_valid_here
        self.taken = set(taken)

    def optimize(
        self,
        acquisition: AcquisitionFunction,
        q: int,
        anchors: torch.Tensor,
        raw_samples: int,
        num_restarts: int,
        seed: int,
    ) -> torch.Tensor:
        """Up to ``q`` points (``k x d``, ``k <= q``) chosen greedily.

        Args:
            anchors: ``m x d`` points whose neighbours are worth trying (the best trials).
        """
        picks: list[torch.Tensor] = []
        base_pending = getattr(acquisition, "X_pending", None)
        try:
            for i in range(q):
                starts = self._starts(anchors, raw_samples, seed + i)
                if starts.shape[0] == 0:
                    break  # every configuration is taken
                best = self._climb(acquisition, starts, num_restarts)
                picks.append(best)
                self.taken.add(self._key(best))
                chosen = torch.stack(picks)
                acquisition.set_X_pending(
                    chosen if base_pending is None else torch.cat([base_pending, chosen])
                )
        finally:
            acquisition.set_X_pending(base_pending)
        if not picks:
            return torch.empty(0, self.encoder.d, dtype=torch.float64)
        return torch.stack(picks)

    # -- private -----------------------------------------------------------------------
    def _starts(self, anchors: torch.Tensor, raw_samples: int, seed: int) -> torch.Tensor:
        sobol = SobolEngine(self.encoder.d, scramble=True, seed=seed).draw(
            raw_samples, dtype=torch.float64
        )
        if self.region is not None:
            sobol = self.region.squeeze(sobol)
        around = [self._neighbours(a) for a in self.encoder.snap(anchors)] if len(anchors) else []
        return self._admissible(torch.cat([*around, self.encoder.snap(sobol)]))

    def _climb(
        self, acquisition: AcquisitionFunction, starts: torch.Tensor, num_restarts: int
    ) -> torch.Tensor:
        values = _evaluate(acquisition, starts)
        top = values.topk(min(num_restarts, len(values))).indices
        current, current_values = starts[top], values[top]
        for _ in range(_MAX_ROUNDS):
            groups = [self._admissible(self._neighbours(point)) for point in current]
            sizes = [g.shape[0] for g in groups]
            if sum(sizes) == 0:
                break
            scores = _evaluate(acquisition, torch.cat(groups)).split(sizes)
            moved = False
            for j, (group, score) in enumerate(zip(groups, scores, strict=True)):
                if group.shape[0] and score.max() > current_values[j]:
                    best = int(score.argmax())
                    current[j], current_values[j] = group[best], score[best]
                    moved = True
            if not moved:
                break
        return current[int(current_values.argmax())].clone()

    def _neighbours(self, point: torch.Tensor) -> torch.Tensor:
        rows = []
        for i, dim in enumerate(self.encoder.dims):
            values: list[float]
            if dim.layout == CONTINUOUS:
                here = float(point[i])
                moves = [here + s for step in _CONTINUOUS_STEPS for s in (-step, step)]
                values = [v for v in moves if 0.0 <= v <= 1.0]
            elif dim.layout == CATEGORICAL:
                values = [v for v in dim.levels if abs(v - float(point[i])) > 1e-9]
            else:
                levels = list(dim.levels)
                at = min(range(len(levels)), key=lambda k: abs(levels[k] - float(point[i])))
                values = [levels[k] for k in (at - 1, at + 1) if 0 <= k < len(levels)]
            for value in values:
                row = point.clone()
                row[i] = float(value)
                rows.append(row)
        if not rows:
            return point.new_empty(0, self.encoder.d)
        return self.encoder.snap(torch.stack(rows))

    def _admissible(self, points: torch.Tensor) -> torch.Tensor:
        keep, seen = [], set()
        for k, row in enumerate(points):
            config = self.encoder.decode(row.tolist())
            key = self.encoder.key(config)
            if key in self.taken or key in seen or not self.is_valid(config):
                continue
            seen.add(key)
            keep.append(k)
        return points[keep]

    def _key(self, point: torch.Tensor) -> ConfigKey:
        return self.encoder.key(self.encoder.decode(point.tolist()))


def _evaluate(acquisition: AcquisitionFunction, points: torch.Tensor) -> torch.Tensor:
    """Acquisition values of ``n x d`` points as ``n`` q=1 batches, without gradients."""
    with torch.no_grad():
        chunks = [acquisition(chunk.unsqueeze(-2)) for chunk in points.split(_BATCH)]
    return torch.cat(chunks)
