"""Durable storage of studies, trials and trial events.

``Storage`` is the contract the service programs against (``server/storage/base.py`` has the
promises every backend keeps). ``server/storage/sql.py`` implements it once in SQL for the
two backends: ``SQLiteStorage`` (one file, WAL, numbered migrations; the default) and
``PostgresStorage`` (``server/storage/postgres.py``; a database several servers may share,
imported only when asked for, with psycopg). ``open_storage`` opens whichever a storage URL
names (``server/storage/urls.py``).
"""

from __future__ import annotations

from server.storage.base import (
    CREATABLE_STATUSES,
    ROW_CHARS,
    FinishedTrial,
    LeaseLapsed,
    NewBatch,
    NewTrial,
    Request,
    Storage,
    StoredSize,
    StoredStudy,
    TrialEvent,
    check_config,
    check_holder,
    check_metrics,
    check_status,
    storable,
    storable_tree,
)
from server.storage.migrations import LATEST_VERSION
from server.storage.sqlite import SQLiteStorage
from server.storage.urls import StorageURL, open_storage, parse

__all__ = [
    "CREATABLE_STATUSES",
    "LATEST_VERSION",
    "ROW_CHARS",
    "FinishedTrial",
    "LeaseLapsed",
    "NewBatch",
    "NewTrial",
    "Request",
    "SQLiteStorage",
    "Storage",
    "StorageURL",
    "StoredSize",
    "StoredStudy",
    "TrialEvent",
    "check_config",
    "check_holder",
    "check_metrics",
    "check_status",
    "open_storage",
    "parse",
    "storable",
    "storable_tree",
]
