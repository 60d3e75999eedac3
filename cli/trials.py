"""``tuner create``, ``ask``, ``report``, ``tell``, ``heartbeat`` and ``import``: a study
driven from a shell, and trials measured elsewhere.

``report`` sends one window of a running trial's measurement and prints the study's answer:
``go on`` or ``stop: REASON`` (``--json``: ``{"stop": ..., "reason": ..., "windows": ...}``);
a script that stops then finishes the trial with ``tell --early-stopped REASON`` and the
metrics of the part that ran.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cli.common import connect, err, stored_rule
from targets.command.target import env_name, format_value
from tuner.errors import NotFoundError, ValidationError
from tuner.space import IntKnob, Knob, Scalar, _ChoiceKnob
from tuner.study import StudySpec
from tuner.trial import (
    OBSERVED,
    TrialStatus,
)


def cmd_import(args: argparse.Namespace) -> int:
    from server.records import ImportedTrial

    with connect(args.server, args.db, writable=True) as api:
        items: list[ImportedTrial]
        if args.export:
            exported, items = read_export(args.export, args.study)
            try:
                api.get_study(args.study)  # an existing study takes the trials as it is
            except NotFoundError:
                api.create_study(exported)
        elif args.from_study:
            other = api.list_trials(args.from_study, list(OBSERVED))
            items = [
                ImportedTrial(t.config, t.status, t.metrics, t.reason, f"import:{args.from_study}")
                for t in other
            ]
        else:
            items = read_trials_csv(args.csv, api.get_study(args.study).spec)
        if not items:
            where = "--export" if args.export else "--from-study" if args.from_study else "--csv"
            raise ValidationError(where, "no trials")
        stored = api.import_trials(args.study, items)
    counts = Counter(t.status.value for t in stored)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    print(f"imported {len(stored)} trials into {args.study} ({summary}): "
          f"ids {stored[0].id}-{stored[-1].id}")  # fmt: skip
    return 0


def read_export(path: Path, name: str) -> tuple[StudySpec, list[Any]]:
    """A study exported by ``tuner export --format json``: its spec under ``name``, without
    its embedding and sources (a study made from an export holds evidence, e.g. for another
    study's ``transfer_from``; an embedding's model would not see imported trials), and its
    finished trials as imported ones (``import:<exported name>``).

    Raises:
        ValidationError: The file cannot be read, or is not such an export (``--export``).
    """
    from server.records import ImportedTrial

    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        data = dict(document["study"])
        trials = list(document["trials"])
    except OSError as exc:
        raise ValidationError("--export", f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValidationError(
            "--export",
            f"{path} is not a study exported as JSON ({exc})",
            "tuner export --format json",
        ) from None
    origin = str(data.get("name", ""))
    data = {k: v for k, v in data.items() if k not in ("embedding", "transfer_from")}
    spec = StudySpec.from_dict({**data, "name": name})
    observed = {s.value for s in OBSERVED}
    items = [
        ImportedTrial(t["config"], TrialStatus(t["status"]), t.get("metrics", {}),
                      t.get("reason", "") or "", f"import:{origin}")
        for t in trials if t.get("status") in observed
    ]  # fmt: skip
    return spec, items


def read_trials_csv(path: Path, spec: StudySpec) -> list[Any]:
    """Trials from a CSV file: a column per knob, per metric, and optional ``status`` and
    ``reason`` columns (COMPLETED when there is no status). Other columns are ignored.

    Raises:
        ValidationError: A missing knob column or a value that does not parse, named as
            ``csv line N, column C``.
    """
    from server.records import ImportedTrial

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
    with connect(args.server, args.db, writable=True) as api:
        trial = api.heartbeat(args.study, args.trial, args.client_id, args.override_holder)
    until = trial.lease_expires_at
    if until is None:
        print(f"trial {trial.id} is ACTIVE (the server runs without leases)")
    else:
        stamp = datetime.fromtimestamp(until, UTC).isoformat(timespec="seconds")
        print(f"trial {trial.id} is ACTIVE; lease until {stamp}")
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    from runner.config import load_study  # targets and the session: only to create

    spec, rule_given = load_study(args.config, args.name)
    with connect(args.server, args.db, writable=True) as api:
        spec = stored_rule(api, spec, rule_given)
        _, created = api.create_study(spec)
    state = "created" if created else "exists with the same spec:"
    print(f"study {spec.name} {state} {len(spec.space)} knobs, objective {spec.objective.name}")
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
    with connect(args.server, args.db, writable=True) as api:
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
        (TrialStatus.EARLY_STOPPED, args.early_stopped),
    ]
    given = [(status, reason) for status, reason in outcomes if reason is not None]
    stopped = bool(given) and given[0][0] is TrialStatus.EARLY_STOPPED
    if len(given) + bool(args.metric and not stopped) != 1:
        err.print(
            "error: tell takes metrics (--metric NAME=VALUE, repeatable) or one of "
            "--infeasible/--failed/--timed-out/--early-stopped REASON (--early-stopped "
            "with the metrics measured)",
            highlight=False,
        )
        return 2
    metrics = parse_metrics(args.metric or [])
    if metrics is None:
        return 2
    status, reason = given[0] if given else (TrialStatus.COMPLETED, "")
    with connect(args.server, args.db, writable=True) as api:
        trial = api.complete_trial(
            args.study, args.trial, metrics, status, reason,
            client_id=args.client_id, override_holder=args.override_holder,
        )  # fmt: skip
    print(f"trial {trial.id} {trial.status.value}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    metrics = parse_metrics(args.metric)
    if metrics is None:
        return 2
    with connect(args.server, args.db, writable=True) as api:
        decision = api.report_progress(args.study, args.trial, metrics, args.client_id)
    if args.json:
        print(json.dumps({"stop": decision.stop, "reason": decision.reason,
                          "windows": decision.windows}))  # fmt: skip
    elif decision.stop:
        print(f"stop: {decision.reason}")
    else:
        print(f"go on ({decision.windows} windows reported)")
    return 0


def parse_metrics(pairs: list[str]) -> dict[str, float] | None:
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
