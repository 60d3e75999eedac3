"""The best measured configuration without the lucky samples: the model's outlier test, and
its posterior mean.

On a noisy system the trial with the best measured value is often just the luckiest
measurement: with ``n`` configurations of about equal merit, the largest of ``n`` noisy
samples beats the truth by about ``sigma * sqrt(2 ln n)``. Ax picks the best point by its
model's predictions for the same reason (``BestPointMixin`` with
``use_model_predictions``): a GP fitted to all trials shrinks a lone lucky sample toward
what its neighbours measured, and a configuration measured several times (whose mean has
less noise: ``model.replicates``) counts for more.

``rank_by_posterior`` fits the objective's GP (the designer's model, ``models/model.py``) on every
observed trial and ranks the given trials by its posterior mean at their configurations.
Only the ranking uses the model: feasibility stays the trials' measured means against the
outcome constraints (``tuner.trial.is_feasible``), and the values reported are the
measurements. Numerical trouble in the fit (``model.NUMERICAL_ERRORS``) falls back to the
measured means, with a warning.

``rank_screened`` is the study's best as reported (``tuner.confirmation.best_of`` without a
confirmation): the measured values, best first, with the trials the same GP calls outliers
(``outliers``) set last. A measurement far better than the GP of all the others predicts at
its configuration, beyond what the GP's fitted noise explains, is a lucky sample (a
one-off stall of a neighbour, a cache that happened to be warm); the rest keep their
measured order, so on a system without noise the best measurement is the answer. Why not
the posterior mean there (``bench/NOTES.md``, "Which trial to report"): on the suite's
deterministic DB surrogates, where the best measurement is the truth, it reported
configurations up to 22 % worse (the GP smooths over the step-like surfaces); on their noisy
twins with rare outliers the screen won as often as the posterior mean did. ``ranked``
(which configurations a confirmation measures again) keeps the posterior mean: there the
repeats decide.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from statistics import NormalDist

import torch
from botorch.models import SingleTaskGP

from tuner.designer.fast.shared_rows import training_precision
from tuner.designer.models.model import (
    NUMERICAL_ERRORS,
    finite,
    fit_models,
    outcome_data,
    replicates,
)
from tuner.encoding import UnitBoxEncoder
from tuner.study import Goal, StudySpec
from tuner.trial import OBSERVED, Trial

log = logging.getLogger(__name__)

#: Fewer observed trials than this: the measured means rank (a GP on two or three points
#: predicts little more than them).
MIN_TRIALS = 4

#: At most this many trials are fitted (``fitted``): the fit's cost grows with the cube of
#: its trials (on a 2-CPU VM, 8 knobs: 1.4 s at 300, 5.1 s at 750, 21 s at 1,500, which a
#: server's GetStudy spent before answering), and a ranking of the best needs the model
#: near the best. The posterior is still evaluated at every measured trial.
MAX_FITTED = 400

#: The outlier test's level (``outliers``): the chance that the fitted noise alone puts the
#: study's most extreme measurement beyond the threshold, Bonferroni over the measured
#: trials (the usual 5 %, not chosen on any benchmark).
OUTLIER_LEVEL = 0.05


def posterior_means(spec: StudySpec, trials: Sequence[Trial]) -> dict[int, float] | None:
    """The objective GP's posterior mean, in metric units, at each of ``trials`` that
    reported the objective; None with too few trials or after numerical trouble."""
    name = spec.objective.name
    observed = tuple(t for t in trials if t.status in OBSERVED)
    measured = [t for t in observed if name in t.metrics]
    if len(measured) < MIN_TRIALS:
        return None
    encoder = UnitBoxEncoder(spec.space)
    data = [d for d in outcome_data(spec, encoder, fitted(spec, observed)) if d.name == name]
    try:
        model = fit_models(data, encoder)
        with torch.no_grad():
            X = encoder.encode_many([t.config for t in measured])
            mean = model.posterior(X).mean.reshape(-1)  # type: ignore[attr-defined]
    except NUMERICAL_ERRORS as err:
        log.warning("ranking by the measured means: the objective's GP failed (%s)", err)
        return None
    values = mean.exp() if data[0].log else mean
    return {t.id: float(v) for t, v in zip(measured, values.tolist(), strict=True)}


def fitted(spec: StudySpec, observed: Sequence[Trial]) -> tuple[Trial, ...]:
    """The trials the ranking's GP is fitted on: all of ``observed`` up to
    ``MAX_FITTED``; beyond, the best half of that many by measured objective and, for the
    rest, trials spread evenly over the others in id order (the model's view of the whole
    space), in id order. Deterministic: a reader and a writer rank alike."""
    if len(observed) <= MAX_FITTED:
        return tuple(observed)
    sign = 1.0 if spec.objective.goal is Goal.MAXIMIZE else -1.0
    name = spec.objective.name
    measured = sorted(
        (t for t in observed if name in t.metrics), key=lambda t: (-sign * t.metrics[name], t.id)
    )
    best = {t.id for t in measured[: MAX_FITTED // 2]}
    others = [t for t in observed if t.id not in best]
    room = MAX_FITTED - len(best)
    spread = {others[i * len(others) // room].id for i in range(room)}
    return tuple(t for t in observed if t.id in best or t.id in spread)


def rank_by_posterior(
    spec: StudySpec, trials: Sequence[Trial], among: Sequence[Trial]
) -> list[Trial]:
    """``among`` best first by the posterior mean of a GP fitted to all ``trials`` (by
    their measured means when there is no model: module doc); ties keep the earlier."""
    sign = 1.0 if spec.objective.goal is Goal.MAXIMIZE else -1.0
    name = spec.objective.name
    means = posterior_means(spec, trials) or {}
    return sorted(among, key=lambda t: (-sign * means.get(t.id, t.metrics[name]), t.id))


def outliers(spec: StudySpec, trials: Sequence[Trial]) -> set[int]:
    """Ids of the single-measurement trials whose objective is better than the objective GP
    predicts there from all the other trials, beyond its fitted noise: the GP fitted to every
    observed trial (``fitted``), its leave-one-out residual (Rasmussen & Williams 2006,
    eq. 5.12, the fitted hyperparameters) divided by its leave-one-out standard deviation,
    above the normal quantile at ``OUTLIER_LEVEL / (2 n)`` for ``n`` training rows, on the
    better side. A trial measured several times has a mean, not a sample, and is never set
    aside. Empty with fewer than ``MIN_TRIALS`` rows or after numerical trouble."""
    name = spec.objective.name
    observed = fitted(spec, tuple(t for t in trials if t.status in OBSERVED))
    encoder = UnitBoxEncoder(spec.space)
    data = [d for d in outcome_data(spec, encoder, observed) if d.name == name]
    if not data or data[0].X.shape[0] < MIN_TRIALS:
        return set()
    # outcome_data's rows: each trial with a finite objective, once per replicate, in order
    rows = [t for t in observed if finite(t.metrics.get(name)) for _ in replicates(t, name)]
    try:
        model = fit_models(data, encoder)
        assert isinstance(model, SingleTaskGP) and model.num_outputs == 1  # one outcome
        # the noise is per row where the trials' fidelities differ
        precision, weighted = training_precision(model)  # fit_models builds Gaussian ones
        z = weighted / torch.sqrt(torch.diagonal(precision))
    except NUMERICAL_ERRORS as err:
        log.warning("no outlier test: the objective's GP failed (%s)", err)
        return set()
    sign = 1.0 if spec.objective.goal is Goal.MAXIMIZE else -1.0  # the GP's y is the metric
    threshold = NormalDist().inv_cdf(1.0 - OUTLIER_LEVEL / (2 * len(rows)))
    scores = zip(rows, z.tolist(), strict=True)
    return {t.id for t, v in scores if t.repeats == 1 and sign * v > threshold}


def rank_screened(spec: StudySpec, trials: Sequence[Trial], among: Sequence[Trial]) -> list[Trial]:
    """``among`` best first by their measured objective, the ``outliers`` of ``trials`` last
    (module doc); ties keep the earlier."""
    sign = 1.0 if spec.objective.goal is Goal.MAXIMIZE else -1.0
    name = spec.objective.name
    flagged = outliers(spec, trials)
    return sorted(among, key=lambda t: (t.id in flagged, -sign * t.metrics[name], t.id))
