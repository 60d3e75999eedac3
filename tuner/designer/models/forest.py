"""A random forest of the objective and its expected improvement: the portfolio's FOREST step.

SMAC's model (Hutter, Hoos, Leyton-Brown, "Sequential model-based optimization for general
algorithm configuration", LION 2011) for surfaces a GP smooths over: the thresholds of buffer
and cache sizes, a few knobs that matter only past a point. The forest is scikit-learn's
``RandomForestRegressor`` with SMAC3's defaults (10 trees, 5/6 of the features per split,
splits of at least 3 and leaves of at least 3 trials, bootstrapped); its prediction at a
point is the trees' mean and its uncertainty their spread, as in SMAC.

The training set is the study's observed trials on the unit box (``UnitBoxEncoder``), the
objective signed so that lower is better, in log space when it is positive and spans more
than ``model.LOG_SPAN`` (the GP's rule, ``model.spans_decades``). A trial that broke the
system (INFEASIBLE, TIMED_OUT, FAILED) or a constraint counts as the worst value measured, as
SMAC imputes a crashed run's cost: the forest learns where not to go without a second model.

``propose`` maximizes the expected improvement over the best feasible value over scrambled
Sobol points and, from the best of those and the study's best trials, an iterated local
search over one-exchange neighbours (one coordinate changed: a continuous one by a Gaussian
step, a discrete or categorical one to another level), SMAC3's acquisition maximizer in
short. Every random choice takes the call's seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch.quasirandom import SobolEngine

from tuner.designer.models.model import finite, spans_decades
from tuner.encoding import UnitBoxEncoder
from tuner.study import StudySpec
from tuner.trial import Trial, is_feasible

TREES = 10
RATIO_FEATURES = 5 / 6
MIN_SPLIT = 3
MIN_LEAF = 3
SOBOL_POINTS = 1024
STARTS = 10  # local-search starts: the best Sobol points and best trials, half each
ITERATIONS = 10
STEP = 0.2  # a continuous coordinate's Gaussian step on the unit box (SMAC's 0.2)


def training_set(
    spec: StudySpec, encoder: UnitBoxEncoder, observed: Sequence[Trial]
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """``(X, y, best)``: the encoded trials, their signed (lower is better) objective with
    failures at the worst value, and the best feasible value; None when none is feasible."""
    name = spec.objective.name
    sign = -1.0 if spec.objective.goal.value == "maximize" else 1.0
    measured = [t for t in observed if finite(t.metrics.get(name))]
    if not measured:
        return None
    raw = np.array([float(t.metrics[name]) for t in measured])
    log = spans_decades(raw)
    values = {t.id: sign * (math.log(v) if log else v) for t, v in zip(measured, raw, strict=True)}
    feasible = [values[t.id] for t in measured if is_feasible(spec, t)]
    if not feasible:
        return None
    worst = max(values.values())
    rows = [encoder.encode(t.config) for t in observed]
    y = [values[t.id] if t.id in values and is_feasible(spec, t) else worst for t in observed]
    return np.array(rows, dtype=float), np.array(y, dtype=float), min(feasible)


class Forest:
    """The fitted forest: ``predict`` gives the trees' mean and spread at points."""

    def __init__(self, X: np.ndarray, y: np.ndarray, seed: int) -> None:
        from sklearn.ensemble import RandomForestRegressor

        self.model = RandomForestRegressor(
            n_estimators=TREES,
            max_features=RATIO_FEATURES,
            min_samples_split=MIN_SPLIT,
            min_samples_leaf=MIN_LEAF,
            bootstrap=True,
            random_state=seed % 2**31,
        ).fit(X, y)

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        per_tree = np.stack([tree.predict(X) for tree in self.model.estimators_])
        return per_tree.mean(axis=0), per_tree.std(axis=0)


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """EI below ``best`` (lower is better); where the trees agree, the plain improvement."""
    spread = np.maximum(std, 1e-12)
    z = (best - mean) / spread
    cdf = torch.special.ndtr(torch.from_numpy(z)).numpy()
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    ei = spread * (z * cdf + pdf)
    return np.where(std > 1e-12, ei, np.maximum(best - mean, 0.0))


def propose(
    spec: StudySpec,
    encoder: UnitBoxEncoder,
    observed: Sequence[Trial],
    q: int,
    seed: int,
) -> list[list[float]]:
    """Up to ``q`` points of the unit box, highest expected improvement first (distinct
    after snapping to the knobs' levels; the caller drops taken configurations)."""
    data = training_set(spec, encoder, observed)
    if data is None:
        return []
    X, y, best = data
    forest = Forest(X, y, seed)
    rng = np.random.default_rng(seed % 2**32)
    levels = {**encoder.discrete_dims, **encoder.cat_dims}
    sobol = SobolEngine(encoder.d, scramble=True, seed=seed % 2**31)
    points = _snap(sobol.draw(SOBOL_POINTS, dtype=torch.float64).numpy(), levels)

    def score(rows: np.ndarray) -> np.ndarray:
        mean, std = forest.predict(rows)
        return expected_improvement(mean, std, best)

    pool_scores = score(points)
    order = np.argsort(-pool_scores, kind="stable")
    leaders = X[np.argsort(y, kind="stable")[: STARTS - STARTS // 2]]
    starts = np.vstack([points[order[: STARTS // 2]], leaders])
    current, current_scores = starts, score(starts)
    found, found_scores = [points, starts], [pool_scores, current_scores]
    for _ in range(ITERATIONS):
        neighbours = np.vstack([_one_exchange(row, levels, rng, 4) for row in current])
        neighbour_scores = score(neighbours).reshape(len(current), 4)
        found.append(neighbours)
        found_scores.append(neighbour_scores.reshape(-1))
        pick = neighbour_scores.argmax(axis=1)
        better = neighbour_scores[np.arange(len(current)), pick] > current_scores
        if not better.any():
            break
        chosen = neighbours.reshape(len(current), 4, -1)[np.arange(len(current)), pick]
        current = np.where(better[:, None], chosen, current)
        current_scores = np.where(
            better, neighbour_scores[np.arange(len(current)), pick], current_scores
        )
    candidates = np.vstack(found)  # each scored once, as it was found
    ranked = candidates[np.argsort(-np.concatenate(found_scores), kind="stable")]
    out: list[list[float]] = []
    seen: set[tuple[float, ...]] = set()
    for row in ranked:
        key = tuple(np.round(row, 12))
        if key in seen:
            continue
        seen.add(key)
        out.append([float(v) for v in row])
        if len(out) >= q * 4:  # spare ones for configurations the caller finds taken
            break
    return out


def _one_exchange(
    row: np.ndarray, levels: dict[int, list[float]], rng: np.random.Generator, count: int
) -> np.ndarray:
    """``count`` neighbours of ``row``, each with one coordinate changed."""
    out = np.repeat(row[None, :], count, axis=0)
    for k in range(count):
        i = int(rng.integers(row.shape[0]))
        if i in levels and len(levels[i]) > 1:
            others = [v for v in levels[i] if abs(v - row[i]) > 1e-12]
            out[k, i] = others[int(rng.integers(len(others)))]
        else:
            out[k, i] = float(np.clip(row[i] + rng.normal(0.0, STEP), 0.0, 1.0))
    return out


def _snap(points: np.ndarray, levels: dict[int, list[float]]) -> np.ndarray:
    """Discrete and categorical coordinates moved to their nearest level."""
    out = points.copy()
    for i, values in levels.items():
        grid = np.asarray(values, dtype=float)
        out[:, i] = grid[np.abs(out[:, i][:, None] - grid[None, :]).argmin(axis=1)]
    return out
