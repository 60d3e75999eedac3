"""The ``tuner`` command line: ``main``. The parser is ``cli.parser``; each command group
has its module (``cli.sessions``: tune, daemon, ray; ``cli.serving``: serve;
``cli.trials``: create, ask, tell, heartbeat, import; ``cli.results``: studies, show, best,
front, measurements, importance, plot; ``cli.dashboard``: dashboard); ``cli.render`` draws
results, ``cli.common`` holds what they share.

::

    tuner tune CONFIG [--server HOST:PORT] [--db PATH] [--trials N] [--name NAME] [--plot PNG]
    tuner daemon CONFIG [--server HOST:PORT] [--db PATH] [--state FILE] [--max-windows N]
    tuner serve [--db PATH] [--host 127.0.0.1] [--port 50051] [--lease-ttl S]
                [--on-lease-expiry reoffer|fail] [--tls-cert PEM --tls-key PEM] [--token-file F]
                [--metrics-port PORT] [--log-format text|json] [--suggest-workers N]
                [--grpc-threads N] [--max-waiting N] [--port-file FILE]
    tuner create CONFIG [--name NAME]            (the study of a config, for ask/tell)
    tuner ask STUDY [--format json|env|args] [--client-id ID]
    tuner tell STUDY TRIAL (--metric NAME=VALUE ... | --infeasible R | --failed R | --timed-out R)
               [--client-id ID] [--override-holder]
    tuner heartbeat STUDY TRIAL [--client-id ID] (renew a trial's lease while it runs)
    tuner import STUDY (--csv FILE | --from-study OTHER)   (warm start from measured trials)
    tuner ray CONFIG [--parallel N] [--server HOST:PORT]   (trials in parallel on Ray Tune)
    tuner studies [--server HOST:PORT | --db PATH]
    tuner show STUDY [--json]
    tuner best STUDY [--json]
    tuner plot STUDY [--out PNG]
    tuner importance STUDY [--metric M] [--samples N] [--format table|json|csv]
    tuner dashboard [--db URL | --server HOST:PORT] [--host 127.0.0.1] [--port 8765]
                    [--access-token-file F --tls-cert PEM --tls-key PEM]   (live web view)

``tune`` runs the study in-process on a local SQLite file unless ``--server`` names a
running server. Read commands open the file read-only (the server stays the only writer) or
ask the server. Exit codes: 0 success, 1 the request failed (one line on stderr: a bad input,
a ``--server`` that does not answer, a missing extra with its pip command), 2 bad usage,
130 Ctrl-C, 141 the reader of stdout went away (``| head``, any format), 143 SIGTERM.

``ask`` and ``tell`` let a shell script drive a study (every command but ``serve`` takes
``--server HOST:PORT`` or ``--db PATH``)::

    tuner create study.toml --server 127.0.0.1:50051
    for i in $(seq 20); do
        eval "$(tuner ask compress --server 127.0.0.1:50051 --format env)"
        mbps=$(./bench --level "$TUNER_LEVEL")          # the knobs as TUNER_<KNOB>
        tuner tell compress "$TUNER_TRIAL_ID" --metric mb_per_s="$mbps" --server ...
    done

``ask`` prints one trial: ``json`` (default) ``{"study": ..., "trial": 12, "config": {...}}``
on one line; ``env`` ``TUNER_STUDY``, ``TUNER_TRIAL_ID`` and ``TUNER_<KNOB>`` assignments,
shell-quoted for ``eval``; ``args`` the trial id then ``--knob=value`` words, shell-quoted
(``eval "set -- $(tuner ask S --format args)"; trial=$1; shift; ./prog "$@"``). Values print
as the command target writes them (``true``/``false``, ``0.1``). With ``--client-id`` the
same caller gets the same ACTIVE trial back until it tells its outcome (a retried ``ask`` is
safe). ``tell`` prints ``trial N STATUS``.

A server gives up a handed-out trial after ``--lease-ttl`` seconds (default 900) without a
heartbeat, and hands its configuration to the next ``ask``. ``tune`` and ``daemon`` send
heartbeats by themselves; a script whose measurement can run longer calls ``tuner heartbeat
STUDY TRIAL`` meanwhile (a ``tell`` that arrives after expiry is still stored, once).
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from rich.markup import escape

from cli.common import SECURITY, buffer_stdout, err
from cli.parser import build_parser
from tuner import runtime
from tuner.errors import TunerError
from tuner.extras import install_hint


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tuner`` console script."""
    args = build_parser().parse_args(argv)
    buffer_stdout()  # so that a reader going away is seen: exit 141 below
    if getattr(args, "server", None):  # how client commands reach a secured server
        SECURITY.update(tls_ca=args.tls_ca, token_file=args.token_file)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search, under -v
    runtime.configure(args.threads, fused_kernels=args.fused_kernels)
    try:
        return int(args.func(args) or 0)
    except TunerError as exc:
        fail(f"{type(exc).__name__}: {exc}")
        return 1
    except _rpc_error() as exc:  # gRPC is imported only by the commands that talk to a server
        fail(f"server {args.server}: {exc.details()}")
        return 1
    except BrokenPipeError:
        # the reader went away (`tuner show | head`), whatever the format: stop quietly, as
        # a shell tool does, and keep Python from complaining when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE
    except KeyboardInterrupt:
        err.print(f"interrupted; the study is saved: {_again(argv)} resumes it", markup=False,
                  highlight=False)  # fmt: skip
        return 130
    except SystemExit as exc:
        if exc.code == 143 and args.command in ("tune", "daemon", "ray"):  # SIGTERM
            err.print(f"stopped (SIGTERM); the study is saved: {_again(argv)} resumes it",
                      markup=False, highlight=False)  # fmt: skip
        raise
    except ModuleNotFoundError as exc:
        hint = install_hint(exc.name or "")
        if hint is None:
            raise
        fail(f"`tuner {args.command}` needs {hint}")
        return 1


def fail(message: str) -> None:
    """``error: MESSAGE`` on stderr, the message as written (an install hint's
    ``'.[full]'`` or a value's brackets are not rich markup)."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)


def _rpc_error() -> Any:
    """``grpc.RpcError`` once a command loaded gRPC, else nothing to catch: a command that
    never imported it cannot have raised it, and ``--help`` and the commands that read a
    local file start without it (about 80 ms)."""
    grpc = sys.modules.get("grpc")
    return () if grpc is None else grpc.RpcError  # type: ignore[no-any-return]


def _again(argv: Sequence[str] | None) -> str:
    """The command line that was run, to run again."""
    return "`" + shlex.join(["tuner", *(sys.argv[1:] if argv is None else argv)]) + "`"


if __name__ == "__main__":
    sys.exit(main())
