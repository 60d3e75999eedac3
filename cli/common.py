"""What every command shares: the consoles, and the API a command talks to (a server, or a
local database file).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tuner.errors import TunerError

if TYPE_CHECKING:
    from rich.progress import Progress

# On a terminal, text wraps at its width; into a file or a pipe (a log, CI) it does not, so
# that a path or a command printed for copying stays on one line (rich would fold it at 80).
out = Console(soft_wrap=not sys.stdout.isatty())


err = Console(stderr=True, soft_wrap=True)  # one line per message, for scripts


# --tls-ca / --token-file of the running command, for ``connect``
SECURITY: dict[str, Path | None] = {}


# -- helpers --------------------------------------------------------------------------------
@contextmanager
def connect(server: str | None, db: str | Path, writable: bool = False) -> Iterator[Any]:
    """A ``TunerClient`` for ``server``, else a ``TuningService`` over the storage ``db``
    names (a SQLite file, or a ``postgresql://`` URL)."""
    if server:
        from server.client import TunerClient
        from server.security import read_file, read_token  # gRPC: only to reach a server

        ca, token_file = SECURITY.get("tls_ca"), SECURITY.get("token_file")
        token = read_token(token_file, "--token-file") if token_file else None
        tls_ca = read_file(ca, "--tls-ca") if ca else None
        with TunerClient(server, tls_ca=tls_ca, token=token) as client:
            client.wait_ready(10)
            yield client
        return
    from server.service import TuningService
    from server.storage import open_storage, parse

    path = parse(db, "--db").path
    if path is not None and writable:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif path is not None and not path.exists():
        raise TunerError(f"no database at {path}; run `tuner tune` first or pass --db/--server")
    storage = open_storage(db, read_only=not writable, field="--db")
    service = TuningService(storage)
    try:
        yield service
    finally:
        service.close()


@contextmanager
def progress_bar() -> Iterator[Progress]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best: {task.fields[best]}"),
        TimeElapsedColumn(),
        console=out,
    ) as progress:
        yield progress
