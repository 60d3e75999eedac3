"""``tuner tune``, ``tuner daemon`` and ``tuner ray``: sessions that measure trials on a target."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.table import Table

from cli.common import connect, out, progress_bar, stored_rule
from cli.plot import plot_convergence
from cli.render import (
    cell,
    confirmation_dict,
    print_confirmation,
    print_importance,
    print_result,
    report_trial,
    standing,
)
from cli.verdict import print_verdict, reported_best
from runner.config import SessionConfig, load_config
from runner.confirm import RoundWindow, chosen_window, confirm, confirm_session
from runner.session import run_phases, run_session, summarize
from server.defaults import DEFAULT_LEASES
from server.security import read_file, read_token
from server.storage import SQLiteStorage
from targets.host.signals import terminate_on_sigterm
from tuner import runtime
from tuner.confirmation import stored_confirmation
from tuner.errors import ValidationError
from tuner.study import StudySpec
from tuner.trial import (
    Measurement,
    MeasurementKind,
    StepKind,
    Trial,
    with_resolved_constraints,
)


def cmd_tune(args: argparse.Namespace) -> int:
    overrides = {
        "trials": args.trials, "db": args.db, "plot": args.plot, "name": args.name,
        "repeats": args.repeats, "max_repeats": args.max_repeats,
        "control_every": args.control_every, "confirm": args.confirm,
        "confirm_select": args.confirm_select, "confirm_max": args.confirm_max,
    }  # fmt: skip
    config = load_config(args.config, overrides)
    if config.phases:
        return tune_phases(args, config)
    fresh = args.new_database
    with terminate_on_sigterm(), connect(args.server, config.db, True, fresh) as api:
        config = keep_stored_rule(api, config)
        spec = config.spec
        where = args.server or str(config.db)
        out.print(
            f"study [bold]{spec.name}[/]: {len(spec.space)} knobs, {config.trials} trials, "
            f"target {config.target.kind}, results in {where}",
            highlight=False,
        )
        out.print(f"preparing the {config.target.kind} target...")
        with config.target as target, progress_bar() as progress:
            task = progress.add_task("tuning", total=config.trials, best="-")

            def on_trial(trial: Trial, finished: int) -> None:
                value = standing(spec, api.list_trials(spec.name))
                progress.update(task, completed=finished, best=value)
                report_trial(spec, trial, finished, config.trials, value)

            protocol = config.protocol
            started = time.monotonic()
            result = run_session(api, target, spec, config.trials, on_trial, protocol)
            trials_s = time.monotonic() - started
            confirmation = None
            if protocol.confirm:
                check = progress.add_task("confirming", total=None, best="")

                def on_measure(done: int, total: int) -> None:
                    progress.update(check, completed=done, total=total)

                def store(trial_id: int, measurement: Measurement) -> None:
                    api.add_measurements(spec.name, trial_id, [measurement])

                confirmation = confirm_session(target, result, protocol, store, on_measure,
                                               trials_s, announce=announce_window)  # fmt: skip
        trials = api.list_trials(spec.name)
        measurements = api.list_measurements(spec.name)
        final = None if spec.multi_objective else reported_best(
            api, spec.name, spec, trials, measurements
        )  # fmt: skip
    print_result(result, confirming=confirmation is not None)
    print_importance(
        result.spec,
        result.trials,
        f" --server {args.server}" if args.server else f" --db {config.db}",
    )
    out.print(
        f"convergence plot: {plot_convergence(spec, trials, config.plot, measurements, final)}"
    )
    if confirmation is not None:
        saved = config.plot.with_name(config.plot.stem + "-confirm.json")
        saved.write_text(json.dumps(confirmation_dict(confirmation), indent=2) + "\n")
        out.print(f"confirmation rounds: {saved}")
        print_confirmation(result.spec, confirmation)
    if final is not None:  # the last lines: the answer, and what it changes
        print_verdict(result.spec, final, trials)
    return 0


def keep_stored_rule(api: Any, config: SessionConfig) -> SessionConfig:
    """``config`` with its study's stored confirmation rule (``cli.common.stored_rule``)."""
    return replace(config, spec=stored_rule(api, config.spec, config.rule_given))


def tune_phases(args: argparse.Namespace, config: SessionConfig) -> int:
    """``tune`` with ``[session] phases``: one study per phase, the other knobs held."""
    spec, phases = config.spec, config.phases
    fresh = args.new_database
    with terminate_on_sigterm(), connect(args.server, config.db, True, fresh) as api:
        out.print(
            f"study [bold]{spec.name}[/]: {len(spec.space)} knobs in {len(phases)} phases, "
            f"{config.trials} trials, target {config.target.kind}, results in "
            f"{args.server or config.db}",
            highlight=False,
        )
        out.print(f"preparing the {config.target.kind} target...")
        with config.target as target, progress_bar() as progress:
            task = progress.add_task("phase 1", total=config.trials, best="-")
            state: dict[str, Any] = {"spec": spec, "offset": 0}

            def on_phase(index: int, sub: StudySpec, held: dict[str, Any]) -> None:
                state.update(spec=sub, offset=sum(p.trials for p in phases[:index]))
                progress.update(task, description=f"phase {index + 1}")
                holding = ", ".join(f"{k}={cell(v)}" for k, v in held.items()) or "nothing"
                out.print(
                    f"phase {index + 1} ({sub.name}): tuning {', '.join(sub.space.names)}; "
                    f"holding {holding}",
                    highlight=False,
                )

            def on_trial(trial: Trial, finished: int) -> None:
                value = standing(state["spec"], api.list_trials(state["spec"].name))
                progress.update(task, completed=state["offset"] + finished, best=value)
                report_trial(state["spec"], trial, state["offset"] + finished, config.trials,
                             value)  # fmt: skip

            results = run_phases(api, target, spec, phases, on_trial, on_phase, config.protocol)
        bests = [  # ranked and kept with each phase's study, as tuner best will name them
            reported_best(api, r.result.spec.name, r.result.spec, r.result.trials,
                          r.result.measurements)
            for r in results
        ]  # fmt: skip
    for index, (phase, best) in enumerate(zip(results, bests, strict=True)):
        out.print(f"[bold]phase {index + 1}[/]", highlight=False)
        found = phase.result
        print_result(found)
        stem = config.plot.with_name(f"{config.plot.stem}-phase{index + 1}{config.plot.suffix}")
        path = plot_convergence(found.spec, found.trials, stem, found.measurements, best)
        out.print(f"convergence plot: {path}")
        print_verdict(found.spec, best, found.trials)
        carried = phase.carried
        if carried is not None and (best.trial is None or carried.id != best.trial.id):
            why = (
                "the default, which no other trial beat by trial means"
                if carried.step is StepKind.DEFAULT
                else "the best of the others, which beat the default by trial means"
            )
            out.print(f"phase {index + 1} hands on trial {carried.id}: {why}", highlight=False)
    final = results[-1].best_config
    if final is not None:
        out.print("[bold]best configuration over all phases[/]")
        table = Table(show_header=False)
        for key, value in final.items():
            table.add_row(key, cell(value))
        out.print(table)
    return 0


def announce_window(window: RoundWindow) -> None:
    out.print(
        f"confirmation rounds: {window.measure_s:g} s after {window.warmup_s:g} s of warm-up "
        f"({window.reason})", highlight=False,
    )  # fmt: skip


def cmd_confirm(args: argparse.Namespace) -> int:
    """``tuner confirm CONFIG``: confirm a finished study again on its target, with more
    rounds. A study whose confirmation chose a candidate gets ``--rounds`` more rounds of
    the default and that candidate, numbered on from the stored ones, so they join its
    estimate; a study never confirmed gets a whole confirmation by the config's protocol.
    The verdict is then read from all the stored rounds (``tuner best`` reads the same).
    The study's rule (``[study.stopping] confirm``) says which interval: the sequential one
    stays valid however many rounds are added after looking; the fixed one's t interval
    does not, and the command says so."""
    config = load_config(args.config, {"name": args.name, "db": args.db})
    name = config.spec.name
    with terminate_on_sigterm(), connect(args.server, config.db, True) as api:
        spec = api.get_study(name).spec  # the stored rule, as the study was created
        trials = api.list_trials(name)
        measurements = api.list_measurements(name)
        if spec.multi_objective:
            raise ValidationError("study.objectives", "has several objectives", "one objective")
        before = stored_confirmation(spec, trials, measurements)
        last = max((m.round for m in measurements if m.kind is MeasurementKind.CONFIRM), default=0)
        rounds = args.rounds if args.rounds else config.protocol.confirm or 5

        def store(trial_id: int, measurement: Measurement) -> None:
            api.add_measurements(name, trial_id, [measurement])

        with config.target as target, progress_bar() as progress:
            check = progress.add_task("confirming", total=None, best="")

            def on_measure(done: int, total: int) -> None:
                progress.update(check, completed=done, total=total)

            if before is not None and before.best is not None and before.default is not None:
                out.print(
                    f"study [bold]{name}[/]: {rounds} more rounds of the default and trial "
                    f"{before.best.trial.id} (after {last} stored rounds)", highlight=False,
                )  # fmt: skip
                if not spec.stopping.sequential:
                    out.print(
                        "[yellow]rounds added after reading a verdict bias a t interval; "
                        '[study.stopping] confirm = "sequential" gives one that stays valid[/]'
                    )
                exactly = replace(spec, stopping=replace(spec.stopping, confirm="fixed"))
                window = chosen_window(config.protocol, target, spec, trials, measurements)
                if window is not None:
                    announce_window(window)
                confirm(target, exactly, trials, [before.best.trial], rounds, 1, on_measure,
                        store, first_round=last, window=window)  # fmt: skip
            else:
                result = summarize(spec, trials, measurements, target.noiseless)
                out.print(
                    f"study [bold]{name}[/]: a confirmation of its "
                    f"{config.protocol.confirm_top} best", highlight=False,
                )  # fmt: skip
                confirm_session(target, result, config.protocol, store, on_measure,
                                rounds=rounds, announce=announce_window)  # fmt: skip
        trials = api.list_trials(name)
        measurements = api.list_measurements(name)
        found = stored_confirmation(spec, trials, measurements)
        final = reported_best(api, name, spec, trials, measurements)
    if found is not None:
        print_confirmation(with_resolved_constraints(spec, trials), found)
    print_verdict(with_resolved_constraints(spec, trials), final, trials)
    return 0


def cmd_daemon(args: argparse.Namespace) -> int:
    from runner.daemon import Daemon, EventLog, parse_daemon

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
            connect(args.server, config.db, writable=True) as api,
            config.target as target,
        ):
            spec = keep_stored_rule(api, config).spec
            Daemon(api, target, spec, config.trials, settings, events).run()
    finally:
        events.close()
    return 0


def cmd_ray(args: argparse.Namespace) -> int:
    overrides = {"trials": args.trials, "db": args.db, "name": args.name}
    config = load_config(args.config, overrides)
    if config.phases:
        raise ValidationError("session.phases", "tuner ray runs one study, not phases")
    tls_ca = read_file(args.tls_ca, "--tls-ca") if args.tls_ca else None
    token = read_token(args.token_file, "--token-file") if args.token_file else None
    # a server that does not answer fails now, not after starting Ray
    with connect(args.server, config.db, writable=True) as api:
        config = keep_stored_rule(api, config)
    from runner.raytune import local_ray, run_ray  # without ray: main names the ray extra

    with local_ray(args.parallel), local_server(args.server, config.db) as server:
        out.print(
            f"study [bold]{config.spec.name}[/]: {config.trials} trials on Ray, "
            f"{args.parallel} at a time, server {server}"
        )
        run_ray(
            server, config.spec, config.target, config.trials, args.parallel, tls_ca, token,
            storage=config.db.parent / "ray",
        )  # fmt: skip
        with connect(server, config.db) as api:
            trials = api.list_trials(config.spec.name)
            measurements = api.list_measurements(config.spec.name)
            final = None if config.spec.multi_objective else reported_best(
                api, config.spec.name, config.spec, trials, measurements
            )  # fmt: skip
    result = summarize(config.spec, trials, measurements)
    print_result(result)
    path = plot_convergence(config.spec, result.trials, config.plot, measurements, final)
    out.print(f"convergence plot: {path}")
    if final is not None:
        print_verdict(result.spec, final, trials)
    return 0


@contextmanager
def local_server(server: str | None, db: Path) -> Iterator[str]:
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
