"""The ``tuner`` command line.

::

    tuner tune CONFIG [--server HOST:PORT] [--db PATH] [--trials N] [--name NAME] [--plot PNG]
    tuner daemon CONFIG [--server HOST:PORT] [--db PATH] [--state FILE] [--max-windows N]
    tuner serve [--db PATH] [--host 127.0.0.1] [--port 50051] [--lease-ttl S]
                [--on-lease-expiry reoffer|fail] [--tls-cert PEM --tls-key PEM] [--token-file F]
                [--metrics-port PORT] [--log-format text|json]
    tuner create CONFIG [--name NAME]            (the study of a config, for ask/tell)
    tuner ask STUDY [--format json|env|args] [--client-id ID]
    tuner tell STUDY TRIAL (--metric NAME=VALUE ... | --infeasible R | --failed R | --timed-out R)
    tuner heartbeat STUDY TRIAL                  (renew a trial's lease while it runs)
    tuner import STUDY (--csv FILE | --from-study OTHER)   (warm start from measured trials)
    tuner ray CONFIG [--parallel N] [--server HOST:PORT]   (trials in parallel on Ray Tune)
    tuner studies [--server HOST:PORT | --db PATH]
    tuner show STUDY [--json]
    tuner best STUDY [--json]
    tuner plot STUDY [--out PNG]

``tune`` runs the study in-process on a local SQLite file unless ``--server`` names a
running server. Read commands open the file read-only (the server stays the only writer) or
ask the server. Exit codes: 0 success, 1 the request failed (message on stderr), 2 bad usage.

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

import argparse
import csv
import json
import logging
import math
import shlex
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from runner.measurement import (
    Confirmation,
    Remeasured,
    confirm,
    machine_noise,
    stored_confirmation,
)
from runner.session import SessionResult, run_phases, run_session, summarize
from server.app import DEFAULT_LEASES, DEFAULT_THREADS, default_suggest_workers
from server.config import DEFAULT_DB, SessionConfig, load_config, load_study
from server.plot import plot_convergence
from server.security import read_file, read_token
from server.service import ON_EXPIRY
from server.storage import SQLiteStorage
from targets.command.target import env_name, format_value
from targets.host.signals import terminate_on_sigterm
from tuner import runtime
from tuner.errors import TunerError, ValidationError
from tuner.measurement_stats import RatioInterval
from tuner.space import IntKnob, Knob, Scalar, _ChoiceKnob, value_key
from tuner.study import Goal, StudySpec
from tuner.trial import (
    OBSERVED,
    Measurement,
    MeasurementKind,
    StepKind,
    Trial,
    TrialStatus,
    best_trial,
    dominates,
    is_feasible,
    pareto_front,
)

out = Console()
err = Console(stderr=True, soft_wrap=True)  # one line per message, for scripts


# --tls-ca / --token-file of the running command, for ``_api``
_SECURITY: dict[str, Path | None] = {}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tuner`` console script."""
    args = _parser().parse_args(argv)
    if getattr(args, "server", None):  # how client commands reach a secured server
        _SECURITY.update(tls_ca=args.tls_ca, token_file=args.token_file)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    runtime.configure(args.threads, fused_kernels=args.fused_kernels)
    try:
        return int(args.func(args) or 0)
    except TunerError as exc:
        err.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}", highlight=False)
        return 1
    except grpc.RpcError as exc:
        err.print(f"[bold red]error:[/] server {args.server}: {exc.details()}", highlight=False)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted; the study is saved and resumes where it stopped")
        return 130


def cmd_tune(args: argparse.Namespace) -> int:
    overrides = {
        "trials": args.trials, "db": args.db, "plot": args.plot, "name": args.name,
        "repeats": args.repeats, "max_repeats": args.max_repeats,
        "control_every": args.control_every, "confirm": args.confirm,
        "confirm_select": args.confirm_select, "confirm_max": args.confirm_max,
    }  # fmt: skip
    config = load_config(args.config, overrides)
    if config.phases:
        return _tune_phases(args, config)
    spec = config.spec
    with terminate_on_sigterm(), _api(args.server, config.db, writable=True) as api:
        where = args.server or str(config.db)
        out.print(
            f"study [bold]{spec.name}[/]: {len(spec.space)} knobs, {config.trials} trials, "
            f"target {config.target.kind}, results in {where}",
            highlight=False,
        )
        out.print(f"preparing the {config.target.kind} target...")
        with config.target as target, _progress() as progress:
            task = progress.add_task("tuning", total=config.trials, best="-")

            def on_trial(trial: Trial, finished: int) -> None:
                value = _standing(spec, api.list_trials(spec.name))
                progress.update(task, completed=finished, best=value)

            protocol = config.protocol
            result = run_session(api, target, spec, config.trials, on_trial, protocol)
            confirmation = None
            if protocol.confirm:
                check = progress.add_task("confirming", total=None, best="")

                def on_measure(done: int, total: int) -> None:
                    progress.update(check, completed=done, total=total)

                def store(trial_id: int, measurement: Measurement) -> None:
                    api.add_measurements(spec.name, trial_id, [measurement])

                confirmation = confirm(
                    target, result.spec, result.trials, result.ranking, protocol.confirm,
                    protocol.confirm_top,
                    on_measure, store, machine_noise(
                        result.spec, result.measurements,
                        None if result.default is None else result.default.id,
                    ), protocol.confirm_select, protocol.confirm_max, protocol.confirm_width,
                )  # fmt: skip
    _print_result(result, confirming=confirmation is not None)
    if confirmation is not None:
        _print_confirmation(result.spec, confirmation)
        best = confirmation.best
        if best is not None and (result.best is None or best.trial.id != result.best.id):
            _print_trial("confirmed best configuration", best.trial)
    path = plot_convergence(
        spec, result.trials, config.plot, result.measurements, _confirmed(spec, confirmation)
    )
    out.print(f"convergence plot: {path}")
    if confirmation is not None:
        saved = config.plot.with_name(config.plot.stem + "-confirm.json")
        saved.write_text(json.dumps(_confirmation_dict(confirmation), indent=2) + "\n")
        out.print(f"confirmation rounds: {saved}")
    return 0


def _tune_phases(args: argparse.Namespace, config: SessionConfig) -> int:
    """``tune`` with ``[session] phases``: one study per phase, the other knobs held."""
    spec, phases = config.spec, config.phases
    with terminate_on_sigterm(), _api(args.server, config.db, writable=True) as api:
        out.print(
            f"study [bold]{spec.name}[/]: {len(spec.space)} knobs in {len(phases)} phases, "
            f"{config.trials} trials, target {config.target.kind}, results in "
            f"{args.server or config.db}",
            highlight=False,
        )
        out.print(f"preparing the {config.target.kind} target...")
        with config.target as target, _progress() as progress:
            task = progress.add_task("phase 1", total=config.trials, best="-")
            state: dict[str, Any] = {"spec": spec, "offset": 0}

            def on_phase(index: int, sub: StudySpec, held: dict[str, Any]) -> None:
                state.update(spec=sub, offset=sum(p.trials for p in phases[:index]))
                progress.update(task, description=f"phase {index + 1}")
                holding = ", ".join(f"{k}={_fmt(v)}" for k, v in held.items()) or "nothing"
                out.print(
                    f"phase {index + 1} ({sub.name}): tuning {', '.join(sub.space.names)}; "
                    f"holding {holding}",
                    highlight=False,
                )

            def on_trial(trial: Trial, finished: int) -> None:
                value = _standing(state["spec"], api.list_trials(state["spec"].name))
                progress.update(task, completed=state["offset"] + finished, best=value)

            results = run_phases(api, target, spec, phases, on_trial, on_phase, config.protocol)
    for index, phase in enumerate(results):
        out.print(f"[bold]phase {index + 1}[/]", highlight=False)
        _print_result(phase.result)
        stem = config.plot.with_name(f"{config.plot.stem}-phase{index + 1}{config.plot.suffix}")
        out.print(
            f"convergence plot: {plot_convergence(phase.result.spec, phase.result.trials, stem)}"
        )
    final = results[-1].best_config
    if final is not None:
        out.print("[bold]best configuration over all phases[/]")
        table = Table(show_header=False)
        for key, value in final.items():
            table.add_row(key, _fmt(value))
        out.print(table)
    return 0


def cmd_daemon(args: argparse.Namespace) -> int:
    from server.daemon import Daemon, EventLog, parse_daemon

    overrides = {"db": args.db, "name": args.name}
    config = load_config(args.config, overrides)
    settings = config.daemon or parse_daemon({}, config.spec, config.db)
    if args.state:
        settings = replace(settings, state=args.state)
    if args.max_windows is not None:
        settings = replace(settings, max_windows=args.max_windows)
    if not args.server:
        runtime.warm_up()  # this process suggests; its first suggestion would pay it
    events = EventLog(settings.log)
    try:
        with (
            terminate_on_sigterm(),
            _api(args.server, config.db, writable=True) as api,
            config.target as target,
        ):
            Daemon(api, target, config.spec, config.trials, settings, events).run()
    finally:
        events.close()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from server.app import serve
    from server.security import ServerSecurity
    from server.service import LeasePolicy

    logging.getLogger().setLevel(logging.DEBUG if args.verbose else logging.INFO)
    runtime.warm_up()  # the first suggestion would pay it (tuner/runtime.py)
    leases = None if args.lease_ttl == 0 else LeasePolicy(args.lease_ttl, args.on_lease_expiry)
    security = ServerSecurity.from_files(args.tls_cert, args.tls_key, args.token_file)
    if args.log_format == "json":
        from server.observability import JsonFormatter

        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    serve(
        args.db, host=args.host, port=args.port, leases=leases, security=security,
        metrics_port=args.metrics_port, suggest_workers=args.suggest_workers,
        max_workers=args.grpc_threads, waiting=args.max_waiting,
    )  # fmt: skip
    return 0


def cmd_ray(args: argparse.Namespace) -> int:
    try:
        from server.raytune import local_ray, run_ray
    except ImportError as exc:
        raise ValidationError(
            "ray", f"Ray Tune is not installed ({exc})", "pip install 'ray[tune]'"
        ) from None
    overrides = {"trials": args.trials, "db": args.db, "name": args.name}
    config = load_config(args.config, overrides)
    if config.phases:
        raise ValidationError("session.phases", "tuner ray runs one study, not phases")
    tls_ca = read_file(args.tls_ca, "--tls-ca") if args.tls_ca else None
    token = read_token(args.token_file, "--token-file") if args.token_file else None
    with local_ray(args.parallel), _local_server(args.server, config.db) as server:
        out.print(
            f"study [bold]{config.spec.name}[/]: {config.trials} trials on Ray, "
            f"{args.parallel} at a time, server {server}"
        )
        run_ray(
            server, config.spec, config.target, config.trials, args.parallel, tls_ca, token,
            storage=config.db.parent / "ray",
        )  # fmt: skip
        with _api(server, config.db) as api:
            trials = api.list_trials(config.spec.name)
    result = summarize(config.spec, trials)
    _print_result(result)
    out.print(f"convergence plot: {plot_convergence(config.spec, result.trials, config.plot)}")
    return 0


@contextmanager
def _local_server(server: str | None, db: Path) -> Iterator[str]:
    """``server``, or a tuner server on 127.0.0.1 over ``db`` for the block's duration."""
    if server:
        yield server
        return
    from server.app import build_server, stop_server
    from server.service import TuningService

    db.parent.mkdir(parents=True, exist_ok=True)
    storage = SQLiteStorage(db)
    service = TuningService(storage, leases=DEFAULT_LEASES)
    grpc_server, port = build_server(service, "127.0.0.1", 0)
    grpc_server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_server(grpc_server, 5).wait()
        service.close()


def cmd_import(args: argparse.Namespace) -> int:
    from server.service import ImportedTrial

    with _api(args.server, args.db, writable=True) as api:
        spec = api.get_study(args.study).spec
        items: list[ImportedTrial]
        if args.from_study:
            other = api.list_trials(args.from_study, list(OBSERVED))
            items = [
                ImportedTrial(t.config, t.status, t.metrics, t.reason, f"import:{args.from_study}")
                for t in other
            ]
        else:
            items = read_trials_csv(args.csv, spec)
        if not items:
            raise ValidationError("--from-study" if args.from_study else "--csv", "no trials")
        stored = api.import_trials(args.study, items)
    counts = Counter(t.status.value for t in stored)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    print(f"imported {len(stored)} trials into {args.study} ({summary}): "
          f"ids {stored[0].id}-{stored[-1].id}")  # fmt: skip
    return 0


def read_trials_csv(path: Path, spec: StudySpec) -> list[Any]:
    """Trials from a CSV file: a column per knob, per metric, and optional ``status`` and
    ``reason`` columns (COMPLETED when there is no status). Other columns are ignored.

    Raises:
        ValidationError: A missing knob column or a value that does not parse, named as
            ``csv line N, column C``.
    """
    from server.service import ImportedTrial

    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise ValidationError("--csv", f"cannot read {path}: {exc.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        columns = list(reader.fieldnames or ())
        missing = [n for n in spec.space.names if n not in columns]
        if missing:
            raise ValidationError("--csv", f"{path} has no column for knob {missing[0]!r}",
                                  spec.space.names)  # fmt: skip
        metrics = [m for m in spec.metric_names if m in columns]
        ignored = [c for c in columns if c not in (*spec.space.names, *metrics, "status", "reason")]
        if ignored:
            err.print(f"ignoring columns {', '.join(ignored)}", highlight=False)
        items = []
        for line, row in enumerate(reader, start=2):
            where = f"csv line {line}"
            config = {k.name: parse_cell(k, row[k.name], f"{where}, column {k.name}")
                      for k in spec.space.knobs}  # fmt: skip
            values = {}
            for m in metrics:
                if (row[m] or "").strip():
                    values[m] = parse_number(row[m], f"{where}, column {m}")
            status = (row.get("status") or "COMPLETED").strip().upper()
            if status not in TrialStatus.__members__:
                raise ValidationError(f"{where}, column status", f"got {status!r}",
                                      [s.value for s in TrialStatus if s.is_final])  # fmt: skip
            reason = (row.get("reason") or "").strip()
            items.append(
                ImportedTrial(config, TrialStatus(status), values, reason, f"import:{path.name}")
            )
    return items


def parse_cell(knob: Knob, text: str | None, where: str) -> Scalar:
    """A CSV cell as ``knob``'s value: choices as ``tuner ask`` prints them."""
    cell = (text or "").strip()
    if isinstance(knob, _ChoiceKnob):
        for choice in knob.choices:
            if cell in (format_value(choice), str(choice)):
                return choice
        raise ValidationError(where, f"got {cell!r}", [format_value(c) for c in knob.choices])
    number = parse_number(cell, where)
    if isinstance(knob, IntKnob):
        if not number.is_integer():
            raise ValidationError(where, f"got {cell!r}", "an integer")
        return knob.validate(int(number), where)
    return knob.validate(number, where)


def parse_number(text: str | None, where: str) -> float:
    try:
        value = float((text or "").strip())
    except ValueError:
        raise ValidationError(where, f"got {text!r}", "a number") from None
    if not math.isfinite(value):
        raise ValidationError(where, f"got {text!r}", "a finite number")
    return value


def cmd_heartbeat(args: argparse.Namespace) -> int:
    with _api(args.server, args.db, writable=True) as api:
        trial = api.heartbeat(args.study, args.trial)
    until = trial.lease_expires_at
    if until is None:
        print(f"trial {trial.id} is ACTIVE (the server runs without leases)")
    else:
        stamp = datetime.fromtimestamp(until, UTC).isoformat(timespec="seconds")
        print(f"trial {trial.id} is ACTIVE; lease until {stamp}")
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    spec = load_study(args.config, args.name)
    with _api(args.server, args.db, writable=True) as api:
        _, created = api.create_study(spec)
    state = "created" if created else "exists with the same spec:"
    print(f"study {spec.name} {state} {len(spec.space)} knobs, objective {spec.objective.name}")
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
    with _api(args.server, args.db, writable=True) as api:
        (trial,) = api.suggest_trials(args.study, 1, args.client_id)
    if args.format == "json":
        print(json.dumps({"study": args.study, "trial": trial.id, "config": trial.config}))
    elif args.format == "env":
        print(f"TUNER_STUDY={shlex.quote(args.study)}")
        print(f"TUNER_TRIAL_ID={trial.id}")
        for name, value in trial.config.items():
            print(f"{env_name(name)}={shlex.quote(format_value(value))}")
    else:
        words = [str(trial.id)]
        words += [f"--{name}={format_value(value)}" for name, value in trial.config.items()]
        print(" ".join(shlex.quote(w) for w in words))
    return 0


def cmd_tell(args: argparse.Namespace) -> int:
    outcomes = [
        (TrialStatus.INFEASIBLE, args.infeasible),
        (TrialStatus.FAILED, args.failed),
        (TrialStatus.TIMED_OUT, args.timed_out),
    ]
    given = [(status, reason) for status, reason in outcomes if reason is not None]
    if len(given) + bool(args.metric) != 1:
        err.print(
            "error: tell takes metrics (--metric NAME=VALUE, repeatable) or one of "
            "--infeasible/--failed/--timed-out REASON",
            highlight=False,
        )
        return 2
    metrics = _metrics(args.metric or [])
    if metrics is None:
        return 2
    status, reason = given[0] if given else (TrialStatus.COMPLETED, "")
    with _api(args.server, args.db, writable=True) as api:
        trial = api.complete_trial(args.study, args.trial, metrics, status, reason)
    print(f"trial {trial.id} {trial.status.value}")
    return 0


def _metrics(pairs: list[str]) -> dict[str, float] | None:
    """``NAME=VALUE`` pairs as metrics; None (after a message naming the pair) if malformed."""
    metrics: dict[str, float] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        problem = (
            "expected NAME=VALUE"
            if not sep or not name
            else f"metric {name!r} given twice"
            if name in metrics
            else f"{text!r} is not a finite number"
            if not math.isfinite(value)
            else ""
        )
        if problem:
            err.print(f"error: --metric {pair!r}: {problem}", highlight=False)
            return None
        metrics[name] = value
    return metrics


def cmd_studies(args: argparse.Namespace) -> int:
    with _api(args.server, args.db) as api:
        infos = api.list_studies()
    table = Table("study", "objective", "knobs", "trials", "best trial")
    for info in infos:
        spec = info.spec
        table.add_row(
            spec.name,
            f"{spec.objective.goal.value} {spec.objective.name}",
            str(len(spec.space)),
            str(sum(info.trial_counts.values())),
            str(info.best_trial_id or "-"),
        )
    out.print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with _api(args.server, args.db) as api:
        spec = api.get_study(args.study).spec
        trials = api.list_trials(args.study)
    if args.json:
        print(
            json.dumps(
                {"study": spec.to_dict(), "trials": [_trial_dict(t) for t in trials]}, indent=2
            )
        )
        return 0
    metrics = list(spec.metric_names)
    table = Table("id", "status", "source", "n", *metrics, *spec.space.names, "reason")
    for t in trials:
        table.add_row(
            str(t.id),
            t.status.value,
            t.source,
            str(t.repeats) if t.status.is_final else "-",
            *[_mean_and_spread(t, m) for m in metrics],
            *[_fmt(t.config[k]) for k in spec.space.names],
            t.reason[:60],
        )
    out.print(table)
    return 0


def cmd_front(args: argparse.Namespace) -> int:
    with _api(args.server, args.db) as api:
        spec = api.get_study(args.study).spec
        front = api.get_pareto_front(args.study)
    if args.json:
        print(json.dumps([_trial_dict(t) for t in front], indent=2))
    elif not front:
        out.print(f"study {args.study} has no feasible trial yet")
    else:
        _print_front(spec, front)
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    with _api(args.server, args.db) as api:
        trial = api.get_best_trial(args.study)
        measurements = api.list_measurements(args.study)
        confirmation = None
        if any(m.kind is MeasurementKind.CONFIRM for m in measurements):
            spec = api.get_study(args.study).spec
            trials = api.list_trials(args.study)
            confirmation = stored_confirmation(spec, trials, measurements)
    if args.json:
        found = _trial_dict(trial)
        if confirmation is not None:
            found["confirmation"] = {
                "best_trial": confirmation.best.trial.id if confirmation.best else None,
                "interval": _interval_dict(confirmation.interval),
                "significant": confirmation.significant,
                "rounds": confirmation.best.repeats if confirmation.best else 0,
            }
        print(json.dumps(found, indent=2))
        return 0
    _print_trial(f"best trial of {args.study}", trial)
    if confirmation is None:
        out.print("(not confirmed: the study has no confirmation rounds)")
    elif confirmation.best is None:
        kept = "the default" if trial.step is StepKind.DEFAULT else "the one feasible most often"
        out.print(
            f"not confirmed: no candidate was feasible and stable in every round; kept {kept}"
        )
    elif confirmation.interval is not None:
        verdict = "confirmed" if confirmation.significant else "not beyond noise"
        out.print(
            f"{verdict}: trial {confirmation.best.trial.id} is {confirmation.interval} the "
            f"default, {confirmation.best.repeats} interleaved repeats each",
            highlight=False,
        )
    return 0


def cmd_measurements(args: argparse.Namespace) -> int:
    kinds = [MeasurementKind(k) for k in args.kind] if args.kind else None
    with _api(args.server, args.db) as api:
        found = api.list_measurements(args.study, args.trial, kinds)
    rows = [
        {"trial": m.trial_id, "kind": m.kind.value, "round": m.round, "at": m.at,
         "metrics": m.metrics}
        for m in found
    ]  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    names = sorted({k for m in found for k in m.metrics})
    table = Table("trial", "kind", "round", "at", *names)
    for m in found:
        at = datetime.fromtimestamp(m.at, UTC).strftime("%H:%M:%S")
        table.add_row(str(m.trial_id), m.kind.value, str(m.round or ""), at,
                      *(_fmt(m.metrics.get(n)) for n in names))  # fmt: skip
    out.print(table)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    with _api(args.server, args.db) as api:
        spec = api.get_study(args.study).spec
        trials = api.list_trials(args.study)
    path = plot_convergence(spec, trials, args.out or f"{args.study}.png")
    out.print(f"wrote {path}")
    return 0


# -- helpers --------------------------------------------------------------------------------
@contextmanager
def _api(server: str | None, db: Path, writable: bool = False) -> Iterator[Any]:
    """A ``TunerClient`` for ``server``, else a ``TuningService`` over the file ``db``."""
    if server:
        from server.client import TunerClient

        ca, token_file = _SECURITY.get("tls_ca"), _SECURITY.get("token_file")
        token = read_token(token_file, "--token-file") if token_file else None
        tls_ca = read_file(ca, "--tls-ca") if ca else None
        with TunerClient(server, tls_ca=tls_ca, token=token) as client:
            client.wait_ready(10)
            yield client
        return
    from server.service import TuningService

    if writable:
        db.parent.mkdir(parents=True, exist_ok=True)
    elif not db.exists():
        raise TunerError(f"no database at {db}; run `tuner tune` first or pass --db/--server")
    storage = SQLiteStorage(db, read_only=not writable)
    service = TuningService(storage)
    try:
        yield service
    finally:
        service.close()


@contextmanager
def _progress() -> Iterator[Progress]:
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best: {task.fields[best]}"),
        TimeElapsedColumn(),
        console=out,
    ) as progress:
        yield progress


def _print_confirmation(spec: StudySpec, confirmation: Confirmation) -> None:
    """The confirmation's tables and its headline: the ratio with its 95 % interval."""
    name = spec.objective.name
    default = confirmation.default
    if confirmation.selection:
        rounds = confirmation.selection[0].repeats
        measured = confirmation.measured
        chosen = measured[1].trial.id if len(measured) > 1 else None
        out.print(
            f"selection: {rounds} interleaved rounds of the default and the "
            f"{len(confirmation.selection) - 1} best by the model choose "
            + (f"trial {chosen}" if chosen is not None else "none")
            + "; fresh rounds estimate its ratio",
            highlight=False,
        )
        out.print(_confirmation_table(spec, confirmation, confirmation.selection, "selection"))
    table = _confirmation_table(spec, confirmation, confirmation.measured, "confirmed")
    out.print(table)
    best = confirmation.best
    rounds = best.repeats if best else 0
    if best is None:
        out.print(
            "[bold red]not confirmed: no candidate was feasible and stable in every round; "
            "keep the default[/]"
        )
        return
    if default is not None and not confirmation.default_feasible:
        under = ", ".join(map(str, spec.outcome_constraints))
        broke = sum(not ok for ok in default.feasible)
        out.print(
            f"[bold yellow]the default breaks {under} in {broke} of {default.repeats} rounds[/]; "
            f"trial {best.trial.id} meets it in every round",
            highlight=False,
        )
        for label, m in (("default", default), (f"trial {best.trial.id}", best)):
            values = ", ".join(f"{k} {_fmt(m.metric_mean(k))}" for k in spec.metric_names)
            out.print(f"  {label}: {values} (means of {m.repeats} rounds)", highlight=False)
        if confirmation.interval is not None:
            out.print(f"  {name}: {confirmation.interval} the default's", highlight=False)
        return
    if confirmation.interval is None:
        out.print(f"best by confirmed mean: trial {best.trial.id} (no default to compare with)")
        return
    headline = f"{confirmation.interval} the default, {rounds} interleaved repeats each"
    if confirmation.significant:
        out.print(f"[bold green]confirmed: trial {best.trial.id} is {headline}[/]", highlight=False)
    else:
        out.print(
            f"[bold yellow]not confirmed: no configuration beat the default beyond noise "
            f"(best: trial {best.trial.id}, {headline})[/]",
            highlight=False,
        )


def _confirmation_table(
    spec: StudySpec, confirmation: Confirmation, rows: Sequence[Remeasured], label: str
) -> Table:
    name = spec.objective.name
    choosing = label == "selection"  # a few rounds: the ratio, not its (wide) interval
    table = Table(
        "trial", "source", f"session {name}", f"{label} {name}",
        "vs default" if choosing else "vs default (95 % CI)", "feasible rounds",
    )  # fmt: skip
    intervals = confirmation.selection_intervals if choosing else confirmation.intervals
    for m in rows:
        found = intervals.get(m.trial.id)
        shown = "-" if found is None else f"{found.ratio:.2f}x" if choosing else str(found)
        note = " unstable" if m.trial.id in confirmation.unstable else ""
        table.add_row(
            str(m.trial.id),
            m.trial.source,
            f"{_fmt(m.trial.metrics.get(name))} (n={m.trial.repeats})",
            f"{_fmt(m.metric_mean(name))} ± {_fmt(m.std)}" if m.std else _fmt(m.metric_mean(name)),
            ("1" if m.trial.step is StepKind.DEFAULT else shown) + note,
            f"{sum(m.feasible)}/{m.repeats}",
        )
    return table


def _confirmation_dict(confirmation: Confirmation) -> dict[str, Any]:
    interval = confirmation.interval

    def row(m: Remeasured, found: RatioInterval | None) -> dict[str, Any]:
        return {
            "trial": m.trial.id,
            "source": m.trial.source,
            "session": m.trial.metrics,
            "session_repeats": m.trial.repeats,
            "rounds": list(m.rounds),
            "feasible": list(m.feasible),
            "values": list(m.values),
            "repeats": m.repeats,
            "mean": m.mean,
            "std": m.std,
            "not_counted": list(m.reasons),
            "vs_default": _interval_dict(found),
            "unstable": m.trial.id in confirmation.unstable,
        }

    best = confirmation.best
    return {
        "measured": [row(m, confirmation.intervals.get(m.trial.id)) for m in confirmation.measured],
        "selection": [
            row(m, confirmation.selection_intervals.get(m.trial.id)) for m in confirmation.selection
        ],
        "best_trial": best.trial.id if best else None,
        "best_config": best.trial.config if best else None,
        "default_feasible": confirmation.default_feasible,
        "ratio": confirmation.ratio,
        "interval": _interval_dict(interval),
        "significant": confirmation.significant,
    }


def _confirmed(
    spec: StudySpec, confirmation: Confirmation | None
) -> tuple[float, float, float] | None:
    """The confirmation's best in metric units for the plot: the default's confirmed mean
    times the ratio and its interval (divided by them when minimizing)."""
    if confirmation is None or confirmation.interval is None or confirmation.default is None:
        return None
    base = confirmation.default.metric_mean(spec.objective.name)
    if base is None:
        return None
    found = confirmation.interval
    if spec.objective.goal is Goal.MAXIMIZE:
        return base * found.ratio, base * found.low, base * found.high
    return base / found.ratio, base / found.high, base / found.low


def _interval_dict(interval: RatioInterval | None) -> dict[str, Any] | None:
    if interval is None:
        return None
    return {
        "ratio": interval.ratio, "low": interval.low, "high": interval.high,
        "level": interval.level, "pairs": interval.n,
    }  # fmt: skip


def _standing(spec: StudySpec, trials: list[Trial]) -> str:
    """The progress bar's "best" column: the best value, or the Pareto front's size."""
    if spec.multi_objective:
        front = pareto_front(spec, trials)
        return f"front of {len(front)}" if front else "none feasible"
    best = best_trial(spec, trials)
    return f"{best.metrics[spec.objective.name]:.4g}" if best else "none feasible"


def _print_front(spec: StudySpec, front: Sequence[Trial], default: Trial | None = None) -> None:
    """The Pareto front as a table, one row per trial, objectives first; ``*`` marks the
    trials that dominate the default configuration."""
    names = [o.name for o in spec.objectives]
    metrics = [m for m in spec.metric_names if m not in names]
    goals = ", ".join(f"{o.goal.value} {o.name}" for o in spec.objectives)
    table = Table(title=f"Pareto front of {spec.name} ({len(front)} trials; {goals})")
    for column in ("trial", *names, *metrics, *spec.space.names):
        table.add_column(column)
    for t in front:
        mark = "*" if default is not None and dominates(spec, t.metrics, default.metrics) else ""
        table.add_row(
            f"{t.id}{mark}",
            *[_fmt(t.metrics.get(m)) for m in (*names, *metrics)],
            *[_fmt(t.config.get(k)) for k in spec.space.names],
        )
    out.print(table)


def _print_result(result: SessionResult, confirming: bool = False) -> None:
    """The session's default and best (by trial means), what the measurements say about
    the machine, and the session's own ratio (labelled as unconfirmed when a confirmation
    follows: that one is the headline)."""
    spec = result.spec
    name = spec.objective.name
    if result.default is not None:
        _print_trial("default configuration", result.default)
    if spec.multi_objective:
        _print_multi_result(result)
        return
    _print_noise(result)
    if result.best is None:
        out.print("[bold red]no feasible configuration found[/]")
        return
    _print_trial("best configuration", result.best)
    unsafe = unsafe_settings(spec, result.best.config)
    if unsafe:
        out.print(
            f"[yellow]the best configuration uses unsafe values: {', '.join(unsafe)}[/] "
            "(study.allow_unsafe = true; see the knob catalog for what each risks)",
            highlight=False,
        )
    under = ", ".join(map(str, spec.outcome_constraints)) or "no constraints"
    if result.default is not None and not is_feasible(spec, result.default):
        out.print(
            f"[yellow]the default configuration is not feasible under {under}[/]; "
            "the best is the best feasible configuration found",
            highlight=False,
        )
    elif result.ratio is not None:
        word = "higher" if spec.objective.goal.value == "maximize" else "lower"
        if confirming:
            out.print(
                f"session estimate: {result.ratio:.2f}x ({name} {word} than the default's, by "
                "trial means; the confirmation below re-measures it)",
                highlight=False,
            )
        else:
            out.print(
                f"[bold green]improvement: {result.ratio:.2f}x[/] ({name} {word} than the "
                f"default's, feasible under {under}; unconfirmed: session.confirm = 0)",
                highlight=False,
            )
        then = result.relative.get(result.best.id)
        if then and result.drift is not None and result.drift.changed():
            then = then if spec.objective.goal.value == "maximize" else 1 / then
            out.print(
                f"against the default as the machine was then (interpolated between the "
                f"nearest controls): {then:.2f}x",
                highlight=False,
            )


def _print_noise(result: SessionResult) -> None:
    """What the repeats and controls say: the machine's drift and unstable trials."""
    drift = result.drift
    if drift is not None and len(drift.values) > 1:
        factors = drift.factors
        low, high = min(factors), max(factors)
        goal = result.spec.objective.goal.value == "maximize"
        at, worst = drift.worst(goal)
        after = max((t.id for t in result.trials if t.updated_at <= at), default=0)
        text = (
            f"the default measured {low:.2f}x to {high:.2f}x of its first measurements over "
            f"{len(factors)} measurements (repeats and controls); most off: {worst:.2f}x "
            f"after trial {after}"
        )
        if drift.changed():
            out.print(f"[bold yellow]the machine drifted:[/] {text}", highlight=False)
        else:
            out.print(f"machine steady: {text}", highlight=False)
    if result.unstable:
        out.print(
            f"[yellow]unstable (repeats disagree beyond the measured noise; never the best): "
            f"trials {', '.join(map(str, result.unstable))}[/]",
            highlight=False,
        )


def unsafe_settings(spec: StudySpec, config: Mapping[str, Any]) -> list[str]:
    """``name = value`` for each value of ``config`` its knob lists as unsafe (a study with
    ``allow_unsafe = true`` can choose them: durability or availability risks)."""
    found = []
    for knob in spec.space.knobs:
        if knob.name in config and any(
            value_key(config[knob.name]) == value_key(v) for v in knob.unsafe_values
        ):
            found.append(f"{knob.name} = {config[knob.name]}")
    return found


def _print_multi_result(result: SessionResult) -> None:
    spec, default = result.spec, result.default
    if not result.front:
        out.print("[bold red]no feasible configuration found[/]")
        return
    feasible_default = default if default is not None and is_feasible(spec, default) else None
    _print_front(spec, result.front, feasible_default)
    if feasible_default is not None:
        better = sum(dominates(spec, t.metrics, feasible_default.metrics) for t in result.front)
        out.print(
            f"{better} of {len(result.front)} front trials (*) are better than the default in "
            "every objective",
            highlight=False,
        )
    elif default is not None:
        under = ", ".join(map(str, spec.outcome_constraints)) or "no constraints"
        out.print(f"[yellow]the default configuration is not feasible under {under}[/]")


def _print_trial(title: str, trial: Trial) -> None:
    table = Table(title=f"{title} (trial {trial.id}, {trial.status.value})", show_header=False)
    for key, value in trial.config.items():
        table.add_row(key, _fmt(value))
    for key, value in trial.metrics.items():
        table.add_row(f"[bold]{key}[/]", _fmt(value))
    if trial.reason:
        table.add_row("reason", trial.reason)
    out.print(table)


def _mean_and_spread(trial: Trial, name: str) -> str:
    """A metric of a trial: its mean, and ± the repeats' standard deviation when measured
    more than once."""
    spread = trial.spread.get(name)
    text = _fmt(trial.metrics.get(name))
    return f"{text} ± {_fmt(spread)}" if spread is not None and trial.repeats > 1 else text


def _trial_dict(trial: Trial) -> dict[str, Any]:
    return {
        "id": trial.id,
        "status": trial.status.value,
        "config": trial.config,
        "metrics": trial.metrics,
        "repeats": trial.repeats,
        "spread": trial.spread,
        "reason": trial.reason,
        "source": trial.source,
        "client_id": trial.client_id,
        "warning": trial.warning,
        **({"embedded": list(trial.embedded)} if trial.embedded else {}),
    }


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: an integer >= 1")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: an integer >= 0")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuner",
        description="Bayesian-optimization tuning of systems knobs: run sessions, serve studies "
        "over gRPC, and inspect results.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--threads",
        type=_positive_int,
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

    def command(name: str, func: Any, help_: str, db: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(func=func)
        if db:
            p.add_argument("--server", metavar="HOST:PORT", help="use a running tuner server")
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
                type=Path,
                default=DEFAULT_DB,
                help=f"local study database (default {DEFAULT_DB})",
            )
        return p

    tune = command("tune", cmd_tune, "run a tuning session from a TOML config")
    tune.set_defaults(db=None)
    tune.add_argument("config", type=Path)
    tune.add_argument("--trials", type=int, help="trial budget (overrides [session] trials)")
    tune.add_argument("--name", help="study name (overrides [study] name)")
    tune.add_argument("--plot", type=Path, help="convergence plot PNG path")
    for flag, help_ in (
        ("--repeats", "measurements of every trial"),
        ("--max-repeats", "measurements of a promising trial and of the default (0: --repeats)"),
        ("--control-every", "re-measure the default after every N trials (0: never)"),
        ("--confirm", "interleaved confirmation rounds at the end (0: none)"),
        ("--confirm-select", "rounds that choose the confirmed candidate first (0: none)"),
        ("--confirm-max", "rounds the confirmation may grow to while its interval is wide"),
    ):
        tune.add_argument(flag, type=int, help=f"{help_} (overrides [session])")

    daemon = command("daemon", cmd_daemon, "tune, apply the best, watch, re-tune (unattended)")
    daemon.set_defaults(db=None)
    daemon.add_argument("config", type=Path)
    daemon.add_argument("--name", help="study name (overrides [study] name)")
    daemon.add_argument("--state", type=Path, help="state file (overrides [daemon] state)")
    daemon.add_argument(
        "--max-windows", type=int, help="stop after N watch windows (overrides [daemon])"
    )

    serve = command("serve", cmd_serve, "serve studies over gRPC", db=False)
    serve.add_argument("--db", type=Path, default=DEFAULT_DB)
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
    serve.add_argument("--tls-cert", type=Path, metavar="PEM", help="server certificate chain")
    serve.add_argument("--tls-key", type=Path, metavar="PEM", help="private key of --tls-cert")
    serve.add_argument(
        "--token-file", type=Path, metavar="FILE", help="require this bearer token on every call"
    )
    serve.add_argument("--port", type=int, default=50051)
    serve.add_argument(
        "--suggest-workers", type=_non_negative_int, metavar="N",
        help="processes running the designer, apart from the gRPC threads (0: in the gRPC "
        f"threads; default one per CPU, at most 4: {default_suggest_workers()} here)",
    )  # fmt: skip
    serve.add_argument(
        "--max-waiting", type=_positive_int, metavar="N",
        help="SuggestTrials calls that may wait for the designer at once; one more is "
        "answered RESOURCE_EXHAUSTED with a retry delay (default and most: three quarters "
        "of --grpc-threads)",
    )  # fmt: skip
    serve.add_argument(
        "--grpc-threads", type=_positive_int, default=DEFAULT_THREADS, metavar="N",
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

    create = command("create", cmd_create, "create the study of a config (for ask/tell)")
    create.add_argument("config", type=Path)
    create.add_argument("--name", help="study name (overrides [study] name)")
    ask = command("ask", cmd_ask, "print the next configuration to try, with its trial id")
    ask.add_argument("study")
    ask.add_argument("--format", choices=("json", "env", "args"), default="json")
    ask.add_argument(
        "--client-id", default="", help="caller id: a repeated ask returns its ACTIVE trial"
    )
    tell = command("tell", cmd_tell, "report a trial's metrics or why it has none")
    tell.add_argument("study")
    tell.add_argument("trial", type=int)
    tell.add_argument(
        "--metric", action="append", metavar="NAME=VALUE", help="a measured metric (repeat)"
    )
    tell.add_argument("--infeasible", metavar="REASON", help="the configuration is at fault")
    tell.add_argument("--failed", metavar="REASON", help="the run failed for another reason")
    tell.add_argument("--timed-out", metavar="REASON", help="the run exceeded its time limit")

    ray = command("ray", cmd_ray, "run a study's trials in parallel on Ray Tune")
    ray.set_defaults(db=None)
    ray.add_argument("config", type=Path)
    ray.add_argument("--parallel", type=int, default=2, help="trials at once (default 2)")
    ray.add_argument("--trials", type=int, help="trial budget (overrides [session] trials)")
    ray.add_argument("--name", help="study name (overrides [study] name)")

    imp = command("import", cmd_import, "add trials measured elsewhere (warm start)")
    imp.add_argument("study")
    source = imp.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--csv", type=Path, help="one row per trial: knob columns, metric columns, [status, reason]"
    )
    source.add_argument("--from-study", metavar="STUDY", help="another study with the same knobs")
    beat = command("heartbeat", cmd_heartbeat, "renew the lease of a trial that is running")
    beat.add_argument("study")
    beat.add_argument("trial", type=int)

    command("studies", cmd_studies, "list studies")
    for name, func, help_ in (
        ("show", cmd_show, "show a study's trials"),
        ("best", cmd_best, "show a study's best feasible trial"),
        ("front", cmd_front, "show a study's Pareto front (several objectives)"),
    ):
        p = command(name, func, help_)
        p.add_argument("study")
        p.add_argument("--json", action="store_true", help="machine-readable output")
    meas = command(
        "measurements", cmd_measurements, "list a study's measurements: repeats, controls, "
        "confirmation rounds",
    )  # fmt: skip
    meas.add_argument("study")
    meas.add_argument("--trial", type=int, help="only this trial's")
    meas.add_argument(
        "--kind", action="append", choices=[k.value for k in MeasurementKind],
        help="only these kinds (repeatable)",
    )  # fmt: skip
    meas.add_argument("--json", action="store_true", help="machine-readable output")
    plot = command("plot", cmd_plot, "write a study's convergence plot")
    plot.add_argument("study")
    plot.add_argument("--out", type=Path, help="PNG path (default STUDY.png)")
    return parser


if __name__ == "__main__":
    sys.exit(main())
