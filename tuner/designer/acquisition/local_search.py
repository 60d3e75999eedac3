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
   knob) and moves to the best one while the acquisition improves, for at most
   ``_MAX_ROUNDS`` rounds. A point that moved by one of several improving moves also gets
   its *compound* move scored in the next round: the point with the best improving move of
   every knob made at once (``_compound``). Where the acquisition is nearly separable in the
   knobs, the compound move gets in one round where single moves take a round per knob;
3. configurations already taken (completed, pending, chosen) and ones breaking a linear
   parameter constraint are never scored, so the result needs no de-duplication.

The search works on tensors of snapped points (valid encodings) throughout: neighbours are
the snapped point with one coordinate replaced (snapped column-wise,
``UnitBoxEncoder.snap_columns``), duplicates and taken configurations are recognized by
``UnitBoxEncoder.point_keys`` (the identity ``key(decode(row))`` without decoding), and only
studies with parameter constraints or a prior region decode points to check them. A point
whose neighbours (and compound move) were all no better is final: its neighbours, and so
their scores, stay the same in later rounds (the taken set changes only between picks), so
each round expands only the points that moved in the one before.

For ``q > 1`` picks are greedy: each pick joins ``X_pending`` before the next one.
Every step is a batched posterior evaluation, so the cost is a few hundred acquisition
batches instead of thousands of sequential L-BFGS iterations; each batch's posterior is
computed once over its unique rows (the candidates, the baseline and the pending points)
and gathered per candidate (``fast/shared_rows.py``).

References:
    Golovin et al., "Google Vizier", KDD 2017 (gradient-free acquisition search).
    Oh et al., "Combinatorial Bayesian optimization using the graph Cartesian product",
    NeurIPS 2019 (local search over neighbour graphs of discrete variables).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from botorch.acquisition import AcquisitionFunction
from torch.quasirandom import SobolEngine

from tuner.designer.fast.shared_rows import shared_rows
from tuner.designer.sampling.priors import PriorRegion
from tuner.encoding import (
    CATEGORICAL,
    CONTINUOUS,
    ConfigKey,
    PointKey,
    UnitBoxEncoder,
    code_keys,
)
from tuner.space import Config

_CONTINUOUS_STEPS = (1 / 64, 1 / 16, 1 / 4)
_BATCH = 512
# Rounds of a climb. With single moves alone every climb on the MySQL-shaped 16-knob space
# (100 trials) still moved after 30 rounds, one knob a round; with the compound move 10
# rounds reach the same acquisition value (within 1e-3 in log) in a third of the time, and a
# far higher one on the 100-knob space (bench/NOTES.md, "Policy v5")
_MAX_ROUNDS = 10
# Kinds of move (``_Moves``): a continuous step, another categorical choice, the discrete
# level below or above
_STEP, _CHOICE, _DOWN, _UP = 0, 1, 2, 3


class LocalSearch:
    """Maximizes an acquisition function over the valid configurations of a space.

    Args:
        encoder: The space's unit-box encoder.
        is_valid: Whether a configuration satisfies the parameter constraints; None when the
            study has none (points are then never decoded to be checked).
        taken: Keys (``encoder.key``) of configurations never to return.
        region: Search only inside this recommended region (expert priors).
    """

    def __init__(
        self,
        encoder: UnitBoxEncoder,
        is_valid: Callable[[Config], bool] | None,
        taken: Iterable[ConfigKey],
        region: PriorRegion | None = None,
    ) -> None:
        self.encoder = encoder
        self.region = region
        self.is_valid = is_valid
        if region is not None:  # search only inside the recommended region

            def is_valid_here(config: Config) -> bool:
                inside = region.contains(encoder, config)
                return inside and (is_valid is None or is_valid(config))

            self.is_valid = is_valid_here
        self.taken = {key for key in map(encoder.point_key, taken) if key is not None}
        self.moves = _Moves(encoder)

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
        changed = False  # whether X_pending holds picks of this call
        try:
            for i in range(q):
                starts = self._starts(anchors, raw_samples, seed + i)
                if starts.shape[0] == 0:
                    break  # every configuration is taken
                best = self._climb(acquisition, starts, num_restarts)
                picks.append(best)
                self.taken.update(self.encoder.point_keys(best.unsqueeze(0)))
                if i + 1 < q:  # the next pick integrates over this one's outcome
                    chosen = torch.stack(picks)
                    acquisition.set_X_pending(
                        chosen if base_pending is None else torch.cat([base_pending, chosen])
                    )
                    changed = True
        finally:
            # qLogNEI samples its baseline again on every call (tens of ms): only if needed
            if changed:
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
        anchors = self.encoder.snap(anchors.reshape(-1, self.encoder.d))
        around, _, around_keys = self.moves.neighbours(anchors)
        sobol = self.encoder.snap(sobol)
        points = torch.cat([around, sobol])
        keys = around_keys + self.encoder.point_keys(sobol)
        return points[self._admissible(points, [0] * len(points), keys)]

    def _climb(
        self, acquisition: AcquisitionFunction, starts: torch.Tensor, num_restarts: int
    ) -> torch.Tensor:
        values = _evaluate(acquisition, starts)
        top = values.topk(min(num_restarts, len(values))).indices
        current, current_values = starts[top], values[top]
        active = list(range(len(current)))  # the points that moved in the last round
        compound: dict[int, torch.Tensor] = {}  # a point's improving moves made at once
        for _ in range(_MAX_ROUNDS):
            rows, owners, keys = self._round_rows(current, active, compound)
            keep = self._admissible(rows, owners.tolist(), keys)
            if not keep:
                break
            rows, owners = rows[keep], owners[keep]
            sizes = torch.bincount(owners, minlength=len(active)).tolist()
            scores = _evaluate(acquisition, rows).split(sizes)
            groups = rows.split(sizes)
            moved, compound = [], {}
            for j, group, score in zip(active, groups, scores, strict=True):
                if group.shape[0] and score.max() > current_values[j]:
                    joined = _compound(current[j], group, score, current_values[j])
                    if joined is not None:
                        compound[j] = joined
                    best = int(score.argmax())
                    current[j], current_values[j] = group[best], score[best]
                    moved.append(j)
            if not moved:
                break
            active = moved
        return current[int(current_values.argmax())].clone()

    def _round_rows(
        self, current: torch.Tensor, active: list[int], compound: dict[int, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, list[PointKey]]:
        """The rows a round scores, grouped by point (``owners``: the index into ``active``):
        each active point's neighbours, then its compound move (if it has one)."""
        rows, owners, keys = self.moves.neighbours(current[active])
        extra = [(i, compound[j]) for i, j in enumerate(active) if j in compound]
        if not extra:
            return rows, owners, keys
        joined = torch.stack([row for _, row in extra])
        rows = torch.cat([rows, joined])
        owners = torch.cat([owners, torch.tensor([i for i, _ in extra], dtype=torch.long)])
        keys = keys + self.encoder.point_keys(joined)
        order = torch.argsort(owners, stable=True)
        return rows[order], owners[order], [keys[k] for k in order.tolist()]

    def _admissible(
        self, points: torch.Tensor, owners: list[int], keys: list[PointKey]
    ) -> list[int]:
        """Rows of ``points`` worth scoring: not taken, valid, and the first of their
        configuration (``keys``: their ``PointKey``) among the rows of the same owner."""
        keep: list[int] = []
        seen: set[tuple[int, PointKey]] = set()
        for k, (key, owner) in enumerate(zip(keys, owners, strict=True)):
            if key in self.taken or (owner, key) in seen:
                continue
            if self.is_valid is not None and not self.is_valid(
                self.encoder.decode(points[k].tolist())
            ):
                continue
            seen.add((owner, key))
            keep.append(k)
        return keep


class _Moves:
    """Every neighbour move of a space as a table of *slots*, one per possible move.

    A slot is a knob (``column``), a kind of move and its value: the step of a continuous
    knob (1/64, 1/16 and 1/4 of its range, each down and up), one choice of a categorical
    knob, or the level below or above for a discrete knob (``value``: its row of
    ``levels``, the knobs' levels padded with infinity). Slots come in the order in which
    the neighbours are listed: by knob, then by move.
    """

    def __init__(self, encoder: UnitBoxEncoder) -> None:
        self.encoder = encoder
        column, kind, value = [], [], []
        levels: list[tuple[float, ...]] = []
        self.discrete_columns: list[int] = []
        for i, dim in enumerate(encoder.dims):
            if dim.layout == CONTINUOUS:
                moves = [(_STEP, s) for step in _CONTINUOUS_STEPS for s in (-step, step)]
            elif dim.layout == CATEGORICAL:
                moves = [(_CHOICE, level) for level in dim.levels]
            else:
                row = float(len(levels))
                moves = [(_DOWN, row), (_UP, row)]
                levels.append(dim.levels)
                self.discrete_columns.append(i)
            column += [i] * len(moves)
            kind += [k for k, _ in moves]
            value += [v for _, v in moves]
        self.column = torch.tensor(column, dtype=torch.long)
        self.kind = torch.tensor(kind, dtype=torch.long)
        self.value = torch.tensor(value, dtype=torch.float64)
        width = max((len(lv) for lv in levels), default=0)
        self.levels = torch.tensor(
            [[*lv, *[float("inf")] * (width - len(lv))] for lv in levels], dtype=torch.float64
        ).reshape(len(levels), width)
        self.counts = torch.tensor([len(lv) for lv in levels], dtype=torch.long)

    def neighbours(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[PointKey]]:
        """The neighbours of ``p x d`` points: ``k x d`` snapped rows, listed point by point,
        for each the index of its point (``k``), and their ``PointKey``s.

        A neighbour is ``snap`` of the point with one coordinate moved; ``snap`` works
        coordinate by coordinate, so that is the snapped point with the moved coordinate
        snapped in its place (and likewise for the key codes).
        """
        here = points[:, self.column]  # p x slots: the coordinate each slot moves
        value, allowed = self._moved(points, here)
        snapped = self.encoder.snap_columns(value, self.column)
        owner, slot = allowed.nonzero(as_tuple=True)
        every = torch.arange(self.encoder.d)
        base = self.encoder.snap(points)
        rows = base[owner]
        moved = (torch.arange(len(owner)), self.column[slot])
        rows[moved] = snapped[owner, slot]
        codes = self.encoder.key_codes(base, every)[owner]
        codes[moved] = self.encoder.key_codes(snapped, self.column)[owner, slot]
        return rows, owner, code_keys(codes)

    def _moved(self, points: torch.Tensor, here: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each slot's new coordinate (``p x slots``, before snapping) and whether the move
        exists: a step stays in ``[0, 1]``, a choice differs from the current one, a level
        below/above exists."""
        value = here.clone()
        allowed = torch.zeros_like(here, dtype=torch.bool)
        step = self.kind == _STEP
        value[:, step] = here[:, step] + self.value[step]
        allowed[:, step] = (value[:, step] >= 0.0) & (value[:, step] <= 1.0)
        choice = self.kind == _CHOICE
        value[:, choice] = self.value[choice].expand(len(points), -1)
        allowed[:, choice] = (self.value[choice] - here[:, choice]).abs() > 1e-9
        if self.discrete_columns:  # the level nearest to the coordinate, first on ties
            distance = (self.levels - points[:, self.discrete_columns].unsqueeze(-1)).abs()
            at = distance.argmin(-1)  # p x discrete knobs
            for kind, delta in ((_DOWN, -1), (_UP, 1)):
                slots = self.kind == kind
                row = self.value[slots].long()
                index = at[:, row] + delta
                allowed[:, slots] = (index >= 0) & (index < self.counts[row])
                index = torch.minimum(index.clamp(min=0), self.counts[row] - 1)
                value[:, slots] = self.levels[row.expand_as(index), index]
        return value, allowed


def _evaluate(acquisition: AcquisitionFunction, points: torch.Tensor) -> torch.Tensor:
    """Acquisition values of ``n x d`` points as ``n`` q=1 batches, without gradients.

    Every batch shares the acquisition's baseline and pending rows: the model's posterior
    is computed once over the unique rows of a chunk and gathered per batch
    (``fast/shared_rows.py``), the same values as the batched posterior up to rounding.
    """
    with torch.no_grad(), shared_rows(acquisition):
        chunks = [acquisition(chunk.unsqueeze(-2)) for chunk in points.split(_BATCH)]
    return torch.cat(chunks)


def _compound(
    point: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor, value: torch.Tensor
) -> torch.Tensor | None:
    """``point`` with the best improving move of every knob made at once, or None when the
    moves that improve on ``value`` change fewer than two knobs.

    ``rows`` are the scored rows of ``point``'s round (``scores``); the ones that change one
    coordinate and score above ``value`` are its improving moves. Each coordinate is snapped
    on its own (``snap`` works column-wise), so the result is a valid encoding.
    """
    changed = rows != point
    single = (changed.sum(-1) == 1) & (scores > value)
    if int(single.sum()) < 2:
        return None
    columns = changed[single].to(torch.int8).argmax(-1).tolist()
    moves = rows[single]
    joined, seen = point.clone(), set()
    for k in torch.argsort(scores[single], descending=True, stable=True).tolist():
        if columns[k] not in seen:
            seen.add(columns[k])
            joined[columns[k]] = moves[k, columns[k]]
    return joined if len(seen) >= 2 else None
