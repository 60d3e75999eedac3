"""Designers: turn a study's history into new configurations (see ``base.py`` for the contract)."""

from tuner.designer.base import Designer, History, Suggestion
from tuner.designer.bo import BODesigner, QuasiRandomDesigner, make_designer
from tuner.designer.model import FitCache

__all__ = [
    "BODesigner",
    "Designer",
    "FitCache",
    "History",
    "QuasiRandomDesigner",
    "Suggestion",
    "make_designer",
]
