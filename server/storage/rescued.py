"""A SQLite database lost while in use, and the next start on its path.

When the file under a running backend is deleted or replaced, the backend saves what its
open connection still reads to ``<name>.rescued-<UTC time>`` beside it
(``SQLiteStorage._rescue``) and refuses every later call. Such a copy is how the next
start knows that the path held a database before: ``RestartGuard`` refuses to open the path
while a rescued copy beside it holds another database than the file there, whether that
file is missing (a start would create an empty database and serve it as if nothing had
happened) or another file (the one that replaced the lost database).

Which database a file holds is told by its identity (``database_identity.uuid``, made
once by migration 9 and kept by every copy): a copy moved back, or copied back, into the
path is the same database, and the start goes on. ``new_database`` (the CLI's
``--new-database``) starts on the path as it is (empty when missing) and records the
copies it leaves aside in that database (``set_aside``), so later starts do not ask again.
A copy made by a tuner older than migration 9 has no identity: it counts as another
database until it is set aside.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import StorageError

log = logging.getLogger(__name__)

#: What the name of a rescued copy adds to the lost file's name (then a UTC time).
RESCUED = ".rescued-"
#: The flag that starts anyway, as the CLI spells it.
FLAG = "--new-database"
_SIDECARS = ("-wal", "-shm", "-journal")


def rescued_name(path: Path, stamp: str) -> Path:
    """Where the copy of the lost database at ``path`` goes (``stamp``: a UTC time)."""
    return path.with_name(f"{path.name}{RESCUED}{stamp}")


def rescued_copies(path: Path) -> list[Path]:
    """The rescued copies of databases lost at ``path``, oldest first (their names end in
    the time they were made)."""
    found = [
        p
        for p in path.parent.glob(f"{path.name}{RESCUED}*")
        if p.is_file() and not p.name.endswith(_SIDECARS) and ".stale-" not in p.name
    ]
    return sorted(found, key=lambda p: p.name)


def identity(conn: sqlite3.Connection) -> str | None:
    """The identity of the database ``conn`` is open on (None: none recorded)."""
    try:
        row = conn.execute("SELECT uuid FROM database_identity WHERE id = 1").fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else str(row[0])


def identity_of(path: Path) -> str | None:
    """The identity of the database in the file ``path``, read without writing to it or
    beside it (None: none, or not a database)."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error:
        return None
    try:
        return identity(conn)
    finally:
        conn.close()


@dataclass(frozen=True)
class RestartGuard:
    """The rescued copies beside ``path``, checked at a read-write start.

    Args:
        path: The database file about to be opened.
        new_database: Start on ``path`` as it is anyway, setting the copies aside.
    """

    path: Path
    new_database: bool = False

    def before_open(self) -> list[Path]:
        """The copies to compare once the file is open; refuses first when the file is
        missing or empty (opening would create a new database).

        Raises:
            StorageError: ``path`` holds no database, a rescued copy beside it does, and
                ``new_database`` is not set; nothing was created.
        """
        copies = rescued_copies(self.path)
        if copies and not self.new_database and _absent(self.path):
            raise StorageError(_refusal(self.path, copies, missing=True))
        return copies

    def after_open(self, conn: sqlite3.Connection, copies: list[Path]) -> None:
        """Refuse the open database unless every copy is it or was set aside; with
        ``new_database``, set the others aside (recorded in the database, logged).

        Raises:
            StorageError: A copy holds another database and ``new_database`` is not set.
        """
        if not copies:
            return
        mine = identity(conn)
        aside = {row[0] for row in conn.execute("SELECT name FROM set_aside")}
        others = [c for c in copies if c.name not in aside and identity_of(c) != mine]
        if not others:
            return
        if not self.new_database:
            raise StorageError(_refusal(self.path, others, missing=False))
        rows = [(c.name, identity_of(c), time.time()) for c in others]
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "INSERT OR IGNORE INTO set_aside (name, uuid, at) VALUES (?, ?, ?)", rows
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        log.warning("starting on %s as it is (%s): %s left aside", self.path, FLAG,
                    ", ".join(str(c) for c in others))  # fmt: skip


def _absent(path: Path) -> bool:
    """No database at ``path``: no file, or an empty one (which SQLite takes as new)."""
    with contextlib.suppress(FileNotFoundError):
        return path.stat().st_size == 0
    return True


def _when(stamp: str) -> str:
    """A rescued copy's time (``20250102T030405Z``) as people read it."""
    try:
        at = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ")
    except ValueError:
        return stamp
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def _refusal(path: Path, copies: list[Path], missing: bool) -> str:
    newest = copies[-1]
    more = f" (and {len(copies) - 1} older copies)" if len(copies) > 1 else ""
    saved = _when(newest.name[len(path.name) + len(RESCUED) :])
    lost = (
        f"{path} does not exist, but {newest}{more} beside it holds the database a server "
        f"had open there"
        if missing
        else f"{path} is not the database a server had open there: {newest}{more} holds that one"
    )
    keep = "start a new, empty database there" if missing else f"start on {path} as it is"
    return (
        f"{lost}; it was saved at {saved} when the file was deleted or replaced while in use. "
        f"Start on the copy (--db {newest}) or move it back to {path}; to {keep} and leave "
        f"the copy aside, start with {FLAG} (tuner serve, tuner tune)"
    )
