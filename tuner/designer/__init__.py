"""Designers: turn a study's history into new configurations (see ``base.py`` for the contract,
``strategy.py`` for the policy)."""

from tuner.designer.base import Designer, History, Suggestion
from tuner.designer.bo import BODesigner
from tuner.designer.factory import make_designer
from tuner.designer.model import FitCache
from tuner.designer.quasirandom import QuasiRandomDesigner
from tuner.trial import StepKind

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
