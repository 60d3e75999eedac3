"""The designer a study's settings ask for."""

from __future__ import annotations

from tuner.designer.base import Designer
from tuner.designer.models.model import FitCache
from tuner.designer.sampling.quasirandom import QuasiRandomDesigner
from tuner.designer.steps.bo import BODesigner
from tuner.designer.steps.embedded import EmbeddedDesigner
from tuner.study import StudySpec


def make_designer(spec: StudySpec, cache: FitCache | None = None) -> Designer:
    """LlamaTune around the designer when the study has an embedding; else constrained BO
    (``algorithm = "bo"``) or the quasi-random designer (``sobol``, ``random``)."""
    if spec.embedding is not None:
        return EmbeddedDesigner(spec, cache)
    if spec.designer.algorithm == "bo":
        return BODesigner(spec, cache)
    return QuasiRandomDesigner(spec)


def fits_models(spec: StudySpec) -> bool:
    """Whether the study's designer may fit a model (BO, or anything in an embedding); the
    quasi-random designer (``sobol``, ``random``) never does, and suggests in milliseconds."""
    return spec.embedding is not None or spec.designer.algorithm == "bo"
