"""Durable storage of studies, trials and trial events.

``Storage`` is the contract the service programs against; ``SQLiteStorage`` is the backend
(one SQLite file, WAL, numbered migrations). See ``server/storage/base.py`` for the promises
every backend keeps.
"""

from __future__ import annotations

from server.storage.base import (
    CREATABLE_STATUSES,
    FinishedTrial,
    NewTrial,
    Request,
    Storage,
    StoredStudy,
    TrialEvent,
    check_config,
    check_metrics,
    check_status,
)
from server.storage.migrations import LATEST_VERSION
from server.storage.sqlite import SQLiteStorage

__all__ = [
    "CREATABLE_STATUSES",
    "LATEST_VERSION",
    "FinishedTrial",
    "NewTrial",
    "Request",
    "SQLiteStorage",
    "Storage",
    "StoredStudy",
    "TrialEvent",
    "check_config",
    "check_metrics",
    "check_status",
]
