"""What every command shares: the consoles, and the API a command talks to (a server, or a
local database file).
"""

from __future__ import annotations

import errno
import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tuner.errors import NotFoundError, TunerError

if TYPE_CHECKING:
    from rich.progress import Progress

    from tuner.study import StudySpec

#: The width of tables written to a file or a pipe (unless COLUMNS says otherwise): as wide
#: as their cells, not folded to rich's 80 columns (``show --all`` of 40 knobs would get
#: columns 2 characters wide), so ``grep``, ``less -S`` and ``cut`` see one row per line.
PIPE_WIDTH = 10_000


class _Console(Console):
    """A rich console whose reader going away (``tuner show | head``) raises
    ``BrokenPipeError``, which ``cli.main`` ends with status 141 like every other output,
    not rich's own silent ``exit(1)``."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more goes to the closed pipe
        raise BrokenPipeError(errno.EPIPE, "stdout's reader went away")


def _stdout_console() -> Console:
    """On a terminal, text wraps at its width; into a file or a pipe (a log, CI) neither
    text nor tables fold, so a path or a command printed for copying stays on one line."""
    terminal = sys.stdout.isatty()
    piped = not terminal and not os.environ.get("COLUMNS")
    return _Console(soft_wrap=not terminal, width=PIPE_WIDTH if piped else None)


out = _stdout_console()


err = Console(stderr=True, soft_wrap=True)  # one line per message, for scripts


# --tls-ca / --token-file of the running command, for ``connect``
SECURITY: dict[str, Path | None] = {}

#: Seconds a command waits for ``--server`` to answer before it says it cannot reach it:
#: enough for a server that is just starting (gRPC tries a refused connection again after
#: about 1 s and 2.6 s), little enough that a wrong address is not a long wait.
READY_WAIT_S = 3.0


# -- helpers --------------------------------------------------------------------------------
def buffer_stdout() -> None:
    """Give an unbuffered stdout (``PYTHONUNBUFFERED``, ``python -u``) a line buffer.

    Unbuffered, Python drops the rest of a write that a closing reader cut short and
    reports nothing, so ``tuner show | head`` would end 0 with its output cut; a buffered
    stdout writes it all or raises ``BrokenPipeError``. Line by line, a log stays live.
    """
    stream = sys.stdout
    if isinstance(stream, io.TextIOWrapper) and isinstance(stream.buffer, io.RawIOBase):
        sys.stdout = open(  # noqa: SIM115 (stdout for the rest of the process)
            stream.fileno(), "w", buffering=1, encoding=stream.encoding,
            errors=stream.errors, closefd=False,
        )  # fmt: skip


@contextmanager
def connect(
    server: str | None, db: str | Path, writable: bool = False, new_database: bool = False
) -> Iterator[Any]:
    """A ``TunerClient`` for ``server``, else a ``TuningService`` over the storage ``db``
    names (a SQLite file, or a ``postgresql://`` URL; ``new_database``: as in
    ``server.storage.open_storage``)."""
    if server:
        from server.client import TunerClient
        from server.security import read_file, read_token  # gRPC: only to reach a server

        ca, token_file = SECURITY.get("tls_ca"), SECURITY.get("token_file")
        token = read_token(token_file, "--token-file") if token_file else None
        tls_ca = read_file(ca, "--tls-ca") if ca else None
        with TunerClient(server, tls_ca=tls_ca, token=token) as client:
            try:
                client.wait_ready(READY_WAIT_S)
            except TimeoutError as exc:
                raise TunerError(f"{exc}; {_reach_hint(server)}") from None
            yield client
        return
    from server.service import TuningService
    from server.storage import open_storage, parse

    path = parse(db, "--db").path
    if path is not None and writable:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif path is not None and not path.exists():
        raise TunerError(f"no database at {path}; run `tuner tune` first or pass --db/--server")
    storage = open_storage(db, read_only=not writable, field="--db", new_database=new_database)
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


def _reach_hint(server: str) -> str:
    """What to do about a ``--server`` that does not answer."""
    host, _, port = server.rpartition(":")
    one = "," not in server and port.isdigit()
    start = f"`tuner serve --port {port}` on {host or 'that host'}" if one else "`tuner serve`"
    return (
        f"start the server ({start}) or correct --server HOST:PORT (--tls-ca PEM for a "
        "server with TLS); without --server, commands use the local --db"
    )


def stored_rule(api: Any, spec: StudySpec, rule_given: bool) -> StudySpec:
    """``spec`` with its study's stored confirmation rule where the config names none
    (``rule_given`` false) and the stored study differs from it in that rule alone: a study
    started before the default rule changed keeps the rule its stored verdicts were judged
    by, rather than failing to resume as a different spec."""
    if rule_given:
        return spec
    try:
        stored = api.get_study(spec.name).spec
    except NotFoundError:
        return spec
    rule = stored.stopping.confirm
    kept = replace(spec, stopping=replace(spec.stopping, confirm=rule))
    if rule == spec.stopping.confirm or kept.fingerprint() != stored.fingerprint():
        return spec  # the same rule, or a spec that differs elsewhere (create_study says where)
    out.print(
        f"study [bold]{spec.name}[/] keeps the {rule} confirmation rule it was created with "
        f'(new studies get "{spec.stopping.confirm}"; [study.stopping] confirm names one)',
        highlight=False,
    )
    return kept
