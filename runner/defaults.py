"""Defaults of sessions that the CLI's parser shows in its help: here, apart from
``runner.config``, so that ``tuner --help`` imports none of the session's machinery."""

from __future__ import annotations

from pathlib import Path

#: Where ``tuner tune`` keeps its studies, and where the CLI's other commands look.
DEFAULT_DB = Path("runs/tuner.db")
