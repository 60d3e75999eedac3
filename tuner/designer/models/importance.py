"""Which knobs matter: variance-based importance from the study's own GP.

``importance`` fits the same GP the designer fits (``model.fit_models`` on the finished
trials of one metric, in the designer's units: the log of a metric spanning decades) and
decomposes the variance of its posterior mean over the search space (Sobol indices, as
fANOVA does over a random forest; Hutter et al. 2014):

* ``first``: the share of the variance explained by the knob alone (its main effect);
* ``total``: the share it takes part in, alone or with other knobs (main effect plus
  interactions); a knob with ``total`` near 0 can be left at its default.

Both are estimated by Monte Carlo over the unit box the designer searches (Saltelli et al.
2010 for ``first``, Jansen 1999 for ``total``), with every point snapped to a valid
configuration (integers, levels of a choice), ``samples`` base points. The surface is the
model's mean, not the measurements: with few trials it is smooth where nothing was
measured, so the ranking is what the model has learned so far, not a property of the
system. Each index comes with a bootstrap standard error over the base points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.quasirandom import SobolEngine

from tuner.designer.models.model import fit_models, outcome_data
from tuner.encoding import UnitBoxEncoder
from tuner.errors import StateError, ValidationError
from tuner.study import StudySpec
from tuner.trial import Trial

#: Finished trials of the metric a model needs before its importance means anything.
MIN_TRIALS = 5


@dataclass(frozen=True)
class KnobImportance:
    """One knob's share of the variance of the model's mean (fractions of 1)."""

    knob: str
    first: float
    total: float
    first_se: float
    total_se: float


def importance(
    spec: StudySpec,
    trials: Sequence[Trial],
    metric: str | None = None,
    samples: int = 1024,
    seed: int = 0,
) -> list[KnobImportance]:
    """Every knob's first-order and total Sobol index of ``metric`` (default: the first
    objective), most important first (by ``total``).

    Raises:
        ValidationError: ``metric`` is not a metric of the study.
        StateError: Fewer than ``MIN_TRIALS`` completed trials report it, or they all
            report the same value (nothing to explain).
    """
    name = spec.objective.name if metric is None else metric
    if name not in spec.metric_names:
        raise ValidationError("metric", f"no metric {name!r} in the study", spec.metric_names)
    done = tuple(t for t in trials if t.status.measured and t.metrics.get(name) is not None)
    if len(done) < MIN_TRIALS:
        raise StateError(
            f"importance of {name!r} needs at least {MIN_TRIALS} completed trials that report "
            f"it; the study has {len(done)}"
        )
    encoder = UnitBoxEncoder(spec.space)
    [data] = [o for o in outcome_data(spec, encoder, done) if o.name == name]
    if float(data.Y.max() - data.Y.min()) == 0.0:
        raise StateError(f"every completed trial reports the same {name!r}: nothing to explain")
    model = fit_models([data], encoder)
    d = encoder.d
    base = SobolEngine(2 * d, scramble=True, seed=seed).draw(samples).to(torch.float64)
    a, b = encoder.snap(base[:, :d]), encoder.snap(base[:, d:])
    mixed = a.unsqueeze(0).repeat(d, 1, 1)  # mixed[i]: A with column i taken from B
    for i in range(d):
        mixed[i, :, i] = b[:, i]
    with torch.no_grad():
        points = torch.cat([a, b, mixed.reshape(-1, d)])
        mean = torch.cat(
            [
                model.posterior(chunk).mean.reshape(-1)  # type: ignore[attr-defined]
                for chunk in points.split(4096)
            ]
        )
    fa, fb = mean[:samples], mean[samples : 2 * samples]
    fab = mean[2 * samples :].reshape(d, samples)
    first, total = _indices(fa, fb, fab)
    generator = torch.Generator().manual_seed(seed)
    draws = [
        _indices(fa[pick], fb[pick], fab[:, pick])
        for pick in (torch.randint(samples, (samples,), generator=generator) for _ in range(100))
    ]
    first_se = torch.stack([f for f, _ in draws]).std(dim=0)
    total_se = torch.stack([t for _, t in draws]).std(dim=0)
    out = [
        KnobImportance(
            dim.knob.name, float(first[i]), float(total[i]), float(first_se[i]),
            float(total_se[i]),
        )
        for i, dim in enumerate(encoder.dims)
    ]  # fmt: skip
    return sorted(out, key=lambda k: (-k.total, -k.first, k.knob))


def _indices(
    fa: torch.Tensor, fb: torch.Tensor, fab: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """First-order (Saltelli 2010) and total (Jansen 1999) indices, clipped into [0, 1]; the
    means are centred first (the first-order estimator's variance grows with the mean)."""
    centre = torch.cat([fa, fb]).mean()
    fa, fb, fab = fa - centre, fb - centre, fab - centre
    variance = torch.cat([fa, fb]).var()
    if float(variance) <= 0.0:
        zeros = torch.zeros(fab.shape[0], dtype=fa.dtype)
        return zeros, zeros
    first = (fb * (fab - fa)).mean(dim=1) / variance
    total = 0.5 * ((fa - fab) ** 2).mean(dim=1) / variance
    return first.clamp(0.0, 1.0), total.clamp(0.0, 1.0)
