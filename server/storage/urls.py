"""Storage URLs: which backend a ``--db`` value names, and opening it.

========================================  ===============================================
``runs/tuner.db`` (no scheme)             SQLite file at that path (the default backend)
``sqlite:///runs/tuner.db``               SQLite, relative path (SQLAlchemy's spelling, as
                                          Optuna users write it)
``sqlite:////var/lib/tuner/tuner.db``     SQLite, absolute path (four slashes)
``postgresql://user@host:5432/tuner``     PostgreSQL (libpq's URL; ``postgres://`` and
                                          ``postgresql+psycopg://`` too)
========================================  ===============================================

A PostgreSQL database may be shared by several ``tuner serve`` replicas; a SQLite file
belongs to one server.
"""

from __future__ import annotations

import os
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from server.storage.base import Storage
from tuner.errors import ValidationError

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_POSTGRES = ("postgresql", "postgres", "postgresql+psycopg")
ALLOWED = ("a file path", "sqlite:///PATH", "postgresql://[user[:password]@][host][:port]/db")


@dataclass(frozen=True)
class StorageURL:
    """A parsed ``--db`` value.

    Attributes:
        backend: ``sqlite`` or ``postgresql``.
        target: The SQLite file, or the PostgreSQL URL as libpq takes it.
    """

    backend: str
    target: str

    @property
    def path(self) -> Path | None:
        """The SQLite file (None for PostgreSQL)."""
        return Path(self.target) if self.backend == "sqlite" else None

    def __str__(self) -> str:
        if self.backend == "sqlite":
            return self.target
        return redact(self.target)


def parse(value: str | os.PathLike[str], field: str = "db") -> StorageURL:
    """The backend and target ``value`` names.

    Raises:
        ValidationError: An empty value, an unknown scheme, or ``sqlite://`` without a path;
            the error names ``field`` and lists the forms allowed.
    """
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise ValidationError(field, f"got {text!r}", ALLOWED)
    found = _SCHEME.match(text)
    if found is None:
        return StorageURL("sqlite", text)
    scheme = found.group(1).lower()
    if scheme == "sqlite":
        path = text[found.end() :]
        if not path.startswith("/") or path == "/":
            raise ValidationError(
                field,
                f"{text!r} has no file path (write sqlite:///relative.db or "
                "sqlite:////absolute.db)",
                ALLOWED,
            )
        return StorageURL("sqlite", path[1:])
    if scheme in _POSTGRES:
        return StorageURL("postgresql", "postgresql://" + text[found.end() :])
    raise ValidationError(field, f"unknown storage scheme {scheme!r} in {redact(text)!r}", ALLOWED)


def open_storage(
    value: str | os.PathLike[str],
    *,
    read_only: bool = False,
    field: str = "db",
    clock: Callable[[], float] = time.time,
    new_database: bool = False,
) -> Storage:
    """Open the storage ``value`` names (see the module's table).

    ``new_database``: open a SQLite file as it is even beside a rescued copy of a database
    lost there (``server.storage.rescued``); a PostgreSQL database takes no such flag.

    Raises:
        ValidationError: ``value`` is not a storage URL or path (naming ``field``), or
            ``new_database`` with PostgreSQL.
        StorageError: The backend cannot open it.
    """
    url = parse(value, field)
    if url.backend == "postgresql":
        if new_database:
            raise ValidationError(
                "new_database", "applies to a SQLite file, not a PostgreSQL database",
                "a SQLite --db, or no --new-database",
            )  # fmt: skip
        from server.storage.postgres import PostgresStorage  # psycopg only when asked for

        return PostgresStorage(url.target, read_only=read_only, clock=clock)
    from server.storage.sqlite import SQLiteStorage

    return SQLiteStorage(url.target, read_only=read_only, clock=clock, new_database=new_database)


def redact(url: str) -> str:
    """``url`` without its password (for logs and errors)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
