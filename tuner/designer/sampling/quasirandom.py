"""Space-filling configurations that honour linear parameter constraints, and the
quasi-random designer (``algorithm = "sobol"`` or ``"random"``).

The initial design is a scrambled Sobol sequence (Owen scrambling, seeded by the study) read
from its start on every call and skipping configurations already taken, so the ``i``-th
Sobol trial of a study is the same after a restart. Points whose decoded configuration breaks
a linear parameter constraint are rejected; when the feasible region is too small for
rejection to fill a request, hit-and-run samples of the constraint polytope complete it
(``polytope_samples``, seeded, like BoTorch's ``get_polytope_samples`` but without torch's
global generator). Integer knobs are rounded after decoding, which can cross a
constraint boundary, so a rounded point is repaired by trying the floor/ceiling alternatives.

References:
    Owen, "Scrambling Sobol' and Niederreiter-Xing points", J. Complexity 1998.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from scipy.optimize import linprog, minimize
from torch.quasirandom import SobolEngine

from tuner.designer.base import Designer, History, Suggestion, checked, derive_seed
from tuner.designer.sampling.candidates import CandidatePool
from tuner.designer.sampling.priors import PriorRegion
from tuner.encoding import ConfigKey, UnitBoxEncoder
from tuner.space import Config, FloatKnob, IntKnob
from tuner.study import StudySpec
from tuner.trial import StepKind, Trial

log = logging.getLogger(__name__)

_CHUNK = 1024
_MAX_SOBOL = 16 * _CHUNK
_MAX_REPAIR_DIMS = 6
#: A salted Sobol call skips 1 to this many times its count of untaken points: two writers
#: that both lost a race for the same points and ask again rarely skip alike.
SALTED_SKIPS = 8
#: Scrambled-Sobol points an EXPLORE step chooses the farthest from.
EXPLORE_POOL = 1024

# BoTorch's form of a linear inequality: sum(coefficients * x[indices]) >= rhs
Inequality = tuple[torch.Tensor, torch.Tensor, float]


class QuasiRandomDesigner(Designer):
    """Default config, then Sobol (``algorithm = "sobol"``) or uniform random points.

    The BO designer builds on it: the default configuration and the space-filling steps
    (Sobol, random, fill-in and fallback configurations) are the same there.
    """

    def __init__(self, spec: StudySpec) -> None:
        super().__init__(spec)
        self.sampler = FeasibleSampler(spec, self.encoder)
        self.region = PriorRegion.of(self.encoder) if spec.designer.expert_priors else None

    def suggest(
        self, count: int, completed: Sequence[Trial], pending: Sequence[Trial], salt: int = 0
    ) -> list[Suggestion]:
        retry = self.spec.designer.retry_failed
        history = History.build(self.encoder, completed, pending, retry, salt)
        out = self.default_suggestion(history) if count > 0 else []
        kind = StepKind.SOBOL if self.spec.designer.algorithm == "sobol" else StepKind.RANDOM
        out += self.space_filling(history, out, count - len(out), kind)
        return checked(out, count, self.spec)

    def default_due(self, history: History) -> bool:
        """Whether the default configuration is wanted and not yet measured, pending or
        abandoned. Like any configuration, a default whose trial FAILED is tried again."""
        config = self.spec.space.default_config()
        if not self.spec.designer.start_with_default or config is None:
            return False
        if self.encoder.key(config) in history.taken:
            return False
        if not self.spec.satisfies_parameter_constraints(config):
            log.warning(
                "study %s: default configuration breaks a parameter constraint", self.spec.name
            )
            return False
        return True

    def default_suggestion(self, history: History) -> list[Suggestion]:
        """The default configuration, when ``default_due``."""
        config = self.spec.space.default_config()
        if config is None or not self.default_due(history):
            return []
        return [Suggestion(config, StepKind.DEFAULT)]

    def space_filling(
        self,
        history: History,
        chosen: list[Suggestion],
        count: int,
        kind: StepKind,
        warning: str = "",
    ) -> list[Suggestion]:
        """``count`` new configurations of a space-filling ``kind``: SOBOL (the study's
        sequence, inside the prior region if any), FALLBACK (a fresh scrambled sequence per
        history size), EXPLORE (of a fresh scrambled sequence, the points farthest from every
        configuration tried) or RANDOM / FILL_IN (uniform).

        With a salt (``History.salt``: another writer took the points this history gives)
        SOBOL skips a salted number of the sequence's next untaken points, which later
        calls fill in, and the other kinds draw from a salted seed."""
        if count <= 0:
            return []
        taken = history.taken | {self.encoder.key(s.config) for s in chosen}
        if kind is StepKind.SOBOL:
            seed = derive_seed(self.spec.designer.seed, "sobol")
            skip = count * (1 + history.salt % SALTED_SKIPS) if history.salt else 0
            configs = self.sampler.sobol(seed, count + skip, taken, self.region)
            configs = configs[min(skip, max(0, len(configs) - count)) :]
        elif kind is StepKind.FALLBACK:
            seed = history.seed(derive_seed(self.spec.designer.seed, "fallback"), history.size)
            configs = self.sampler.sobol(seed, count, taken)
        elif kind is StepKind.EXPLORE:
            seed = history.seed(self.spec.designer.seed, "explore", history.size, len(chosen))
            pool = self.sampler.sobol(seed, EXPLORE_POOL, taken)
            tried = [t.config for t in (*history.observed, *history.pending)]
            configs = self._farthest(pool, [*tried, *(s.config for s in chosen)], count)
        else:  # RANDOM and FILL_IN share one stream
            seed = history.seed(self.spec.designer.seed, "random", history.size, len(chosen))
            configs = self.sampler.random(seed, count, taken)
        return [Suggestion(c, kind, warning) for c in configs]

    def _farthest(self, pool: list[Config], tried: list[Config], count: int) -> list[Config]:
        """``count`` of ``pool``, each the farthest (Euclidean, on the unit box) from every
        configuration tried and every one picked before it (greedy maximin)."""
        if not pool:
            return []
        points = self.encoder.encode_many(pool)
        if tried:
            gaps = torch.cdist(points, self.encoder.encode_many(tried)).min(dim=1).values
        else:
            gaps = torch.full((len(pool),), math.inf, dtype=torch.float64)
        out: list[Config] = []
        for _ in range(min(count, len(pool))):
            index = int(gaps.argmax())
            out.append(pool[index])
            gaps = torch.minimum(gaps, torch.cdist(points, points[index : index + 1])[:, 0])
            gaps[index] = -1.0
        return out


class FeasibleSampler:
    """Draws configurations of ``spec`` that satisfy its parameter constraints."""

    def __init__(self, spec: StudySpec, encoder: UnitBoxEncoder) -> None:
        self.spec = spec
        self.encoder = encoder
        self.inequalities = unit_box_inequalities(spec, encoder)
        # a study with a candidate list draws only from it (``sampling/candidates.py``)
        self.pool = (
            CandidatePool(spec.candidates, encoder, spec.candidate_features)
            if spec.candidates
            else None
        )

    def sobol(
        self,
        seed: int,
        count: int,
        taken: frozenset[ConfigKey],
        region: PriorRegion | None = None,
    ) -> list[Config]:
        """The first ``count`` feasible, untaken points of the study's Sobol sequence.

        With ``region``, the sequence is squeezed into the recommended region first.
        """
        points = self._sobol_points(seed)
        if region is not None:
            points = (region.squeeze(p.unsqueeze(0))[0] for p in points)
        if self.pool is not None:
            return self.pool.design(points, count, taken, region)
        return self._collect(points, seed, count, taken)

    def random(self, seed: int, count: int, taken: frozenset[ConfigKey]) -> list[Config]:
        """``count`` feasible, untaken uniformly random configurations."""
        if self.pool is not None:
            return self.pool.random(seed, count, self.pool.untaken(taken))
        generator = torch.Generator().manual_seed(seed)

        def points() -> Iterator[torch.Tensor]:
            for _ in range(_MAX_SOBOL // _CHUNK):
                yield from torch.rand(
                    _CHUNK, self.encoder.d, generator=generator, dtype=torch.float64
                )

        return self._collect(points(), seed, count, taken)

    def feasible(self, config: Config) -> Config | None:
        """``config`` if it satisfies the constraints, else its nearest integer repair, or None.

        With a candidate list: ``config`` if it is a candidate, else None.
        """
        if self.pool is not None:
            return config if config in self.pool else None
        if self.spec.satisfies_parameter_constraints(config):
            return config
        return self._repair(config)

    def nearest_feasible(self, config: Config) -> Config | None:
        """``config`` if feasible, else the nearest configuration that satisfies the constraints.

        Nearest in the unit-box encoding: the knobs named by constraints move as little as
        possible (a least-squares projection onto the constraint polytope, SLSQP); every
        other knob keeps its value. None when no feasible configuration is found.
        """
        repaired = self.feasible(config)
        if repaired is None and self.pool is not None:
            here = torch.tensor(self.encoder.encode(config), dtype=torch.float64)
            return self.pool.nearest(here)
        if repaired is not None or not self.inequalities:
            return repaired
        names = sorted({n for c in self.spec.parameter_constraints for n, _ in c.terms})
        index = {dim.knob.name: i for i, dim in enumerate(self.encoder.dims)}
        moved = [index[n] for n in names]
        start = np.array(self.encoder.encode(config), dtype=np.float64)
        rows = []
        for indices, coefficients, rhs in self.inequalities:
            row = np.zeros(len(start))
            row[indices.numpy()] = coefficients.numpy()
            rows.append((row[moved], float(rhs), float(row @ start - row[moved] @ start[moved])))

        def point(u: np.ndarray) -> list[float]:
            full = start.copy()
            full[moved] = u
            return full.tolist()

        result = minimize(
            lambda u: float(np.sum((u - start[moved]) ** 2)),
            start[moved],
            jac=lambda u: 2.0 * (u - start[moved]),
            method="SLSQP",
            bounds=[(0.0, 1.0)] * len(moved),
            constraints=[
                # BoTorch form: row . u >= rhs; keep a margin so rounding stays inside
                {"type": "ineq", "fun": lambda u, r=r, b=b, c=c: r @ u + c - b - 1e-9}
                for r, b, c in rows
            ],
        )
        return self.feasible(self.encoder.decode(point(np.clip(result.x, 0.0, 1.0))))

    # -- private -----------------------------------------------------------------------
    def _sobol_points(self, seed: int) -> Iterator[torch.Tensor]:
        engine = SobolEngine(self.encoder.d, scramble=True, seed=seed)
        for _ in range(_MAX_SOBOL // _CHUNK):
            yield from engine.draw(_CHUNK, dtype=torch.float64)

    def _collect(
        self,
        points: Iterator[torch.Tensor],
        seed: int,
        count: int,
        taken: frozenset[ConfigKey],
    ) -> list[Config]:
        out: list[Config] = []
        seen = set(taken)
        for point in itertools.chain(points, self._polytope_points(seed, count)):
            config = self.feasible(self.encoder.decode(point.tolist()))
            if config is None:
                continue
            key = self.encoder.key(config)
            if key in seen:
                continue
            seen.add(key)
            out.append(config)
            if len(out) == count:
                break
        return out

    def _polytope_points(self, seed: int, count: int) -> Iterator[torch.Tensor]:
        if not self.inequalities:
            return
        d = self.encoder.d
        bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(torch.float64)
        yield from polytope_samples(bounds, self.inequalities, max(64, 8 * count), seed)

    def _repair(self, config: Config) -> Config | None:
        names = {n for c in self.spec.parameter_constraints for n, _ in c.terms}
        ints = [n for n in names if isinstance(self.spec.space[n], IntKnob)][:_MAX_REPAIR_DIMS]
        if not ints:
            return None
        best: Config | None = None
        best_dist = math.inf
        for shifts in itertools.product((-1, 0, 1), repeat=len(ints)):
            candidate = dict(config)
            for name, shift in zip(ints, shifts, strict=True):
                knob = self.spec.space[name]
                assert isinstance(knob, IntKnob)
                candidate[name] = int(min(knob.high, max(knob.low, int(config[name]) + shift)))
            if self.spec.satisfies_parameter_constraints(candidate):
                dist = sum(abs(s) for s in shifts)
                if dist < best_dist:
                    best, best_dist = candidate, dist
        return best


def unit_box_inequalities(spec: StudySpec, encoder: UnitBoxEncoder) -> list[Inequality]:
    """The spec's linear constraints rewritten over unit-box coordinates, in BoTorch's form.

    With ``x_i = low_i + (high_i - low_i) * u_i``, ``sum c_i x_i <= b`` becomes
    ``sum (-c_i (high_i - low_i)) u_i >= -(b - sum c_i low_i)``.
    """
    index = {dim.knob.name: i for i, dim in enumerate(encoder.dims)}
    out: list[Inequality] = []
    for constraint in spec.parameter_constraints:
        indices, coefficients = [], []
        rhs = constraint.bound
        for name, coef in constraint.terms:
            knob = spec.space[name]
            assert isinstance(knob, FloatKnob | IntKnob)
            indices.append(index[name])
            coefficients.append(-coef * (knob.high - knob.low))
            rhs -= coef * knob.low
        out.append(
            (
                torch.tensor(indices, dtype=torch.long),
                torch.tensor(coefficients, dtype=torch.float64),
                -rhs,
            )
        )
    return out


def polytope_samples(
    bounds: torch.Tensor,
    inequalities: list[Inequality],
    n: int,
    seed: int,
    burnin: int = 200,
    thinning: int = 4,
) -> torch.Tensor:
    """``n x d`` points of the polytope ``{x in bounds : inequalities}`` by hit-and-run
    (Smith 1984) from its Chebyshev centre, seeded (empty when the polytope is empty).

    Args:
        bounds: ``2 x d`` lower and upper bounds.
        inequalities: BoTorch's form, ``sum(coefficients * x[indices]) >= rhs``.
    """
    d = bounds.shape[1]
    rows = [-np.eye(d), np.eye(d)]
    rhs = [-bounds[0].numpy(), bounds[1].numpy()]
    for indices, coefficients, bound in inequalities:  # as A x <= b
        row = np.zeros(d)
        row[indices.numpy()] = -coefficients.numpy()
        rows.append(row[None, :])
        rhs.append(np.array([-float(bound)]))
    A, b = np.vstack(rows), np.concatenate(rhs)
    norms = np.linalg.norm(A, axis=1)
    # Chebyshev centre: maximize r subject to A x + r |A_i| <= b
    found = linprog(
        c=np.r_[np.zeros(d), -1.0],
        A_ub=np.c_[A, norms],
        b_ub=b,
        bounds=[(None, None)] * d + [(0.0, None)],
    )
    if found.status != 0 or found.x[-1] <= 1e-12:
        return torch.empty(0, d, dtype=torch.float64)
    x = found.x[:-1]
    rng = np.random.default_rng(seed)
    out = []
    for step in range(burnin + n * thinning):
        direction = rng.standard_normal(d)
        direction /= np.linalg.norm(direction)
        along, slack = A @ direction, b - A @ x
        with np.errstate(divide="ignore"):
            ratios = slack / along
        upper = ratios[along > 1e-12].min(initial=np.inf)
        lower = ratios[along < -1e-12].max(initial=-np.inf)
        x = x + rng.uniform(lower, upper) * direction
        if step >= burnin and (step - burnin) % thinning == thinning - 1:
            out.append(x.copy())
    return torch.tensor(np.array(out), dtype=torch.float64)
