"""The ``tuner`` argument parser: every command, its options and its help."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path

from runner.defaults import DEFAULT_DB
from server.defaults import DEFAULT_LEASES, DEFAULT_THREADS, default_suggest_workers
from server.records import ON_EXPIRY
from tuner import runtime
from tuner.trial import (
    MeasurementKind,
)

#: Output formats of the listing commands.
FORMATS = ("table", "json", "csv")
NEW_DATABASE_HELP = (
    "start on the SQLite --db as it is (a new, empty one if missing) even where a database "
    "was lost while in use: by default a start beside its rescued copy (DB.rescued-TIME) "
    "refuses, naming the copy"
)


def handler(path: str) -> Callable[[argparse.Namespace], int | None]:
    """The command function at ``module:name``, imported when the command runs: each
    command pays only for what it uses (``tuner studies`` never imports torch; ``tuner
    tune`` does)."""
    module, name = path.split(":")

    def run(args: argparse.Namespace) -> int | None:
        func: Callable[[argparse.Namespace], int | None] = getattr(
            importlib.import_module(module), name
        )
        return func(args)

    run.__qualname__ = run.__name__ = name
    return run


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: an integer >= 1")
    return value


def holder_arguments(parser: argparse.ArgumentParser, action: str) -> None:
    parser.add_argument(
        "--client-id", default="",
        help=f"the --client-id the trial was asked with: only that client may {action} it",
    )  # fmt: skip
    parser.add_argument(
        "--override-holder", action="store_true",
        help=f"{action} a trial handed to another client (an operator's explicit choice)",
    )  # fmt: skip


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: an integer >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuner",
        description="Bayesian-optimization tuning of systems knobs: run sessions, serve studies "
        "over gRPC, and inspect results.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=runtime.DEFAULT_THREADS,
        help="torch threads for model fits (default %(default)s; more help past ~1000 trials)",
    )
    parser.add_argument(
        "--fused-kernels",
        action="store_true",
        help="build (the first time: about a minute, needs a C++ compiler) and use BoTorch's "
        "C++ kernel for studies with several objectives; faster suggestions there",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, func: str, help_: str, db: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(func=handler(func))
        if db:
            p.add_argument(
                "--server",
                metavar="HOST:PORT",
                help="use a running tuner server (or replicas: HOST:PORT,HOST:PORT)",
            )
            p.add_argument(
                "--tls-ca", type=Path, metavar="PEM",
                help="trust this certificate for a server with TLS (its own, if self-signed)",
            )  # fmt: skip
            p.add_argument(
                "--token-file", type=Path, metavar="FILE",
                help="bearer token for a server started with --token-file",
            )  # fmt: skip
            p.add_argument(
                "--db",
                default=str(DEFAULT_DB),
                metavar="URL",
                help=f"local study database: a SQLite file or postgresql://... "
                f"(default {DEFAULT_DB})",
            )
        return p

    tune = command("tune", "cli.sessions:cmd_tune", "run a tuning session from a TOML config")
    tune.set_defaults(db=None)
    tune.add_argument("config", type=Path, help="the TOML config file (docs/reference/config.md)")
    tune.add_argument("--trials", type=int, help="trial budget (overrides [session] trials)")
    tune.add_argument("--name", help="study name (overrides [study] name)")
    tune.add_argument("--plot", type=Path, help="convergence plot PNG path")
    tune.add_argument("--new-database", action="store_true", help=NEW_DATABASE_HELP)
    for flag, help_ in (
        ("--repeats", "measurements of every trial"),
        ("--max-repeats", "measurements of a promising trial and of the default (0: --repeats)"),
        ("--control-every", "re-measure the default after every N trials (0: never)"),
        ("--confirm", "interleaved confirmation rounds at the end (0: none)"),
        ("--confirm-select", "rounds that choose the confirmed candidate first (0: none)"),
        ("--confirm-max", "rounds the confirmation may grow to while its interval is wide"),
    ):
        tune.add_argument(flag, type=int, help=f"{help_} (overrides [session])")

    again = command(
        "confirm", "cli.sessions:cmd_confirm",
        "confirm a finished study again on its target, with more rounds",
    )  # fmt: skip
    again.set_defaults(db=None)
    again.add_argument("config", type=Path, help="the study's TOML config (its target and db)")
    again.add_argument("--name", help="study name (overrides [study] name)")
    again.add_argument(
        "--rounds", type=int, default=0,
        help="rounds to add (default: [session] confirm, else 5)",
    )  # fmt: skip

    daemon = command(
        "daemon", "cli.sessions:cmd_daemon", "tune, apply the best, watch, re-tune (unattended)"
    )
    daemon.set_defaults(db=None)
    daemon.add_argument("config", type=Path, help="the TOML config file (docs/reference/config.md)")
    daemon.add_argument("--name", help="study name (overrides [study] name)")
    daemon.add_argument("--state", type=Path, help="state file (overrides [daemon] state)")
    daemon.add_argument(
        "--max-windows", type=int, help="stop after N watch windows (overrides [daemon])"
    )

    serve = command("serve", "cli.serving:cmd_serve", "serve studies over gRPC", db=False)
    serve.add_argument(
        "--db", default=str(DEFAULT_DB), metavar="URL",
        help=f"where studies are kept: a SQLite file (a path or sqlite:///PATH; default "
        f"{DEFAULT_DB}) or a PostgreSQL database (postgresql://user@host/db), which several "
        "servers may share",
    )  # fmt: skip
    serve.add_argument(
        "--host", default="127.0.0.1",
        help="interface (default loopback; any other needs --tls-cert, --tls-key, --token-file)",
    )  # fmt: skip
    serve.add_argument(
        "--metrics-port", type=int, metavar="PORT",
        help="serve Prometheus metrics on 127.0.0.1:PORT/metrics (default: none)",
    )  # fmt: skip
    serve.add_argument(
        "--log-format", choices=("text", "json"), default="text",
        help="json: one JSON object per log line (default text)",
    )  # fmt: skip
    serve.add_argument("--new-database", action="store_true", help=NEW_DATABASE_HELP)
    serve.add_argument("--tls-cert", type=Path, metavar="PEM", help="server certificate chain")
    serve.add_argument("--tls-key", type=Path, metavar="PEM", help="private key of --tls-cert")
    serve.add_argument(
        "--token-file", type=Path, metavar="FILE", help="require this bearer token on every call"
    )
    serve.add_argument(
        "--port", type=int, default=50051,
        help="TCP port (0: any free one); once serving, the address is printed alone on stdout",
    )  # fmt: skip
    serve.add_argument(
        "--port-file", type=Path, metavar="FILE",
        help="once serving, write the bound port to FILE (for scripts using --port 0)",
    )  # fmt: skip
    serve.add_argument(
        "--suggest-workers", type=non_negative_int, metavar="N",
        help="processes running the designer, apart from the gRPC threads (0: in the gRPC "
        f"threads; default one per CPU, at most 4: {default_suggest_workers()} here)",
    )  # fmt: skip
    serve.add_argument(
        "--max-waiting", type=positive_int, metavar="N",
        help="SuggestTrials calls that may wait for the designer at once; one more is "
        "answered RESOURCE_EXHAUSTED with a retry delay (default and most: three quarters "
        "of --grpc-threads)",
    )  # fmt: skip
    serve.add_argument(
        "--grpc-threads", type=positive_int, default=DEFAULT_THREADS, metavar="N",
        help="threads answering calls; SuggestTrials may hold three quarters of them, one "
        f"more is answered RESOURCE_EXHAUSTED with a retry delay (default {DEFAULT_THREADS})",
    )  # fmt: skip
    serve.add_argument(
        "--lease-ttl",
        type=float,
        default=DEFAULT_LEASES.ttl_s,
        metavar="SECONDS",
        help="a handed-out trial without a heartbeat for this long is given up (0: never; "
        f"default {DEFAULT_LEASES.ttl_s:.0f})",
    )
    serve.add_argument(
        "--on-lease-expiry",
        choices=ON_EXPIRY,
        default=DEFAULT_LEASES.on_expiry,
        help="reoffer: ABANDONED and its configuration handed to the next worker; "
        "fail: FAILED (default reoffer)",
    )

    create = command(
        "create", "cli.trials:cmd_create", "create the study of a config (for ask/tell)"
    )
    create.add_argument("config", type=Path, help="the TOML config file (docs/reference/config.md)")
    create.add_argument("--name", help="study name (overrides [study] name)")
    ask = command(
        "ask", "cli.trials:cmd_ask", "print the next configuration to try, with its trial id"
    )
    ask.add_argument("study", help="the study's name")
    ask.add_argument(
        "--format", choices=("json", "env", "args"), default="json",
        help="json: one object; env: TUNER_TRIAL_ID=... and TUNER_<KNOB>=... lines for a "
        "shell's eval; args: the trial id, then --knob=value words",
    )  # fmt: skip
    ask.add_argument(
        "--client-id", default="", help="caller id: a repeated ask returns its ACTIVE trial"
    )
    tell = command("tell", "cli.trials:cmd_tell", "report a trial's metrics or why it has none")
    tell.add_argument("study", help="the study's name")
    tell.add_argument("trial", type=int, help="the trial id that ask printed")
    tell.add_argument(
        "--metric", action="append", metavar="NAME=VALUE", help="a measured metric (repeat)"
    )
    tell.add_argument("--infeasible", metavar="REASON", help="the configuration is at fault")
    tell.add_argument("--failed", metavar="REASON", help="the run failed for another reason")
    tell.add_argument("--timed-out", metavar="REASON", help="the run exceeded its time limit")
    tell.add_argument(
        "--early-stopped", metavar="REASON",
        help="the run was stopped early (the reason `tuner report` gave); --metric gives "
        "what the part that ran measured",
    )  # fmt: skip
    holder_arguments(tell, "report")
    report = command(
        "report", "cli.trials:cmd_report",
        "report one window of a running trial's measurement; prints whether to stop now",
    )  # fmt: skip
    report.add_argument("study", help="the study's name")
    report.add_argument("trial", type=int, help="the id of the running trial")
    report.add_argument(
        "--metric", action="append", required=True, metavar="NAME=VALUE",
        help="the window's metric: the workload over this interval only (repeat)",
    )  # fmt: skip
    report.add_argument("--json", action="store_true", help="one JSON object instead of a line")
    report.add_argument(
        "--client-id", default="", help="the client the trial was handed to (as for ask)"
    )

    ray = command("ray", "cli.sessions:cmd_ray", "run a study's trials in parallel on Ray Tune")
    ray.set_defaults(db=None)
    ray.add_argument("config", type=Path, help="the TOML config file (docs/reference/config.md)")
    ray.add_argument("--parallel", type=int, default=2, help="trials at once (default 2)")
    ray.add_argument("--trials", type=int, help="trial budget (overrides [session] trials)")
    ray.add_argument("--name", help="study name (overrides [study] name)")

    imp = command("import", "cli.trials:cmd_import", "add trials measured elsewhere (warm start)")
    imp.add_argument("study", help="the study's name")
    source = imp.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--csv", type=Path, help="one row per trial: knob columns, metric columns, [status, reason]"
    )
    source.add_argument("--from-study", metavar="STUDY", help="another study with the same knobs")
    source.add_argument(
        "--export", type=Path, metavar="FILE",
        help="a study exported as JSON (tuner export --format json); creates the study from it "
        "when it does not exist (without its embedding), e.g. to name it in transfer_from",
    )  # fmt: skip
    beat = command(
        "heartbeat", "cli.trials:cmd_heartbeat", "renew the lease of a trial that is running"
    )
    beat.add_argument("study", help="the study's name")
    beat.add_argument("trial", type=int, help="the id of the running trial")
    holder_arguments(beat, "renew")

    def output(p: argparse.ArgumentParser, formats: tuple[str, ...] = FORMATS) -> None:
        p.add_argument(
            "--format", choices=formats, default="table",
            help="table (for people), json or csv (for programs; csv: one row per item)",
        )  # fmt: skip
        p.add_argument("--json", action="store_true", help="the same as --format json")

    output(command("studies", "cli.results:cmd_studies", "list studies"))
    for name, func, help_ in (
        ("show", "cli.results:cmd_show", "show a study's trials"),
        ("best", "cli.results:cmd_best", "show a study's best feasible trial"),
        ("front", "cli.results:cmd_front", "show a study's Pareto front (several objectives)"),
    ):
        p = command(name, func, help_)
        p.add_argument("study", help="the study's name")
        output(p)
        if name == "show":
            p.add_argument(
                "--all", action="store_true",
                help="every knob in its own column (default: the knobs a trial changes from "
                "the default, in one column)",
            )  # fmt: skip
    export = command(
        "export", "cli.results:cmd_export",
        "write every trial of a study with every knob and metric (csv, or json with the "
        "study and its measurements), for pandas and spreadsheets",
    )  # fmt: skip
    export.add_argument("study", help="the study's name")
    export.add_argument(
        "--format", choices=("csv", "json"), default="csv",
        help="csv: a row per trial; json: the study, its trials and its measurements",
    )  # fmt: skip
    export.add_argument("--out", type=Path, help="file to write (default: stdout)")
    meas = command(
        "measurements", "cli.results:cmd_measurements",
        "list a study's measurements: repeats, controls, confirmation rounds, progress windows",
    )  # fmt: skip
    meas.add_argument("study", help="the study's name")
    meas.add_argument("--trial", type=int, help="only this trial's")
    meas.add_argument(
        "--kind", action="append", choices=[k.value for k in MeasurementKind],
        help="only these kinds (repeatable)",
    )  # fmt: skip
    output(meas)
    imp = command(
        "importance", "cli.results:cmd_importance",
        "which knobs matter: each knob's share of the variance of the study's GP (Sobol "
        "indices of its mean; needs the full install)",
    )  # fmt: skip
    imp.add_argument("study", help="the study's name")
    imp.add_argument("--metric", help="the metric to explain (default: the first objective)")
    imp.add_argument(
        "--samples", type=positive_int, default=1024, metavar="N",
        help="Monte Carlo base points (default 1024; the cost is N x (knobs + 2) model means)",
    )  # fmt: skip
    output(imp)
    dash = command(
        "dashboard", "cli.dashboard:cmd_dashboard",
        "a live, read-only web view of the studies: trials, convergence, importance, "
        "slices, parallel coordinates, Pareto front, confirmation",
    )  # fmt: skip
    dash.add_argument(
        "--host", default="127.0.0.1",
        help="interface (default loopback; any other needs --tls-cert, --tls-key and "
        "--access-token-file)",
    )  # fmt: skip
    dash.add_argument(
        "--port", type=non_negative_int, default=8765, help="TCP port (0: any free one; default "
        "%(default)s)",
    )  # fmt: skip
    dash.add_argument("--port-file", type=Path, metavar="FILE",
                      help="once serving, write the bound port to FILE")  # fmt: skip
    dash.add_argument(
        "--access-token-file", type=Path, metavar="FILE",
        help="require this token from browsers (/?token=... once) and programs "
        "(Authorization: Bearer ...)",
    )  # fmt: skip
    dash.add_argument("--tls-cert", type=Path, metavar="PEM", help="certificate chain (HTTPS)")
    dash.add_argument("--tls-key", type=Path, metavar="PEM", help="private key of --tls-cert")
    plot = command("plot", "cli.results:cmd_plot", "write a study's convergence plot")
    plot.add_argument("study", help="the study's name")
    plot.add_argument("--out", type=Path, help="PNG path (default STUDY.png)")
    return parser
