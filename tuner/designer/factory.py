"""The designer a study's settings ask for."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.designer.base import Designer
from tuner.designer.models.model import FitCache
from tuner.designer.models.transfer import make_transfer
from tuner.designer.sampling.quasirandom import QuasiRandomDesigner
from tuner.designer.steps.bo import BODesigner
from tuner.designer.steps.embedded import EmbeddedDesigner
from tuner.study import StudySpec
from tuner.transfer import SourceStudy


def make_designer(
    spec: StudySpec, cache: FitCache | None = None, sources: Sequence[SourceStudy] = ()
) -> Designer:
    """LlamaTune around the designer when the study has an embedding; else constrained BO
    (``algorithm = "bo"``) or the quasi-random designer (``sobol``, ``random``).

    ``sources``: the study's transfer sources, read (``tuner.transfer``); the model-based
    designers learn from them (``models/transfer.py``), the quasi-random one ignores them.
    """
    transfer = None
    if sources and spec.learns_from_sources:
        transfer = make_transfer(spec, sources)
    if spec.embedding is not None:
        return EmbeddedDesigner(spec, cache, transfer=transfer)
    if spec.designer.algorithm == "bo":
        return BODesigner(spec, cache, transfer=transfer)
    return QuasiRandomDesigner(spec)
