"""Designers: turn a study's history into new configurations (see ``base.py`` for the contract,
``strategy.py`` for the policy).

Importing the package makes the torch settings the process asked for (``tuner.runtime``)
before any of its modules computes.
"""

from tuner import runtime

runtime.apply_pending()

from tuner.designer.base import Designer, History, Suggestion  # noqa: E402 (after the settings)
from tuner.designer.factory import make_designer  # noqa: E402 (after the settings)
from tuner.designer.models.model import FitCache  # noqa: E402 (after the settings)
from tuner.designer.sampling.quasirandom import QuasiRandomDesigner  # noqa: E402 (after the settings)
from tuner.designer.steps.bo import BODesigner  # noqa: E402 (after the settings)
from tuner.trial import StepKind  # noqa: E402

__all__ = [
    "BODesigner",
    "Designer",
    "FitCache",
    "History",
    "QuasiRandomDesigner",
    "StepKind",
    "Suggestion",
    "make_designer",
]
