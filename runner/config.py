"""Study configs: the TOML file behind ``tuner tune CONFIG``.

A config has three tables (and ``[daemon]`` for ``tuner daemon``, see ``runner/daemon.py``)::

    [study]            # StudySpec.from_dict's shape; knobs default to the target's catalog
    name = "sqlite-oltp"
    objectives = [{ name = "ops_per_s", goal = "maximize" }]
    outcome_constraints = ["p95_ms <= 5"]
    [study.designer]
    seed = 0
    [study.embedding]  # optional: search a LlamaTune embedding of many knobs
    kind = "llamatune"
    dims = 16

    [target]           # kind + the adapter's options
    kind = "sqlite"
    db_mb = 32

    [session]          # how long to run and where results go
    trials = 30

Every error names the field (``study.objectives[0].goal``, ``target.kind``,
``session.trials``) and what is allowed. Relative paths are resolved against the directory
the command runs in.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from runner.daemon import DaemonSettings, parse_daemon
from runner.defaults import DEFAULT_DB
from runner.measurement import DEFAULT_PROTOCOL, MeasurementProtocol
from runner.session import Phase
from targets.base import Target
from targets.registry import build_target
from tuner.errors import ValidationError, relocate
from tuner.space import Config, Knob, knob_from_dict
from tuner.study import StudySpec

_TABLES = ("study", "target", "session", "daemon")
#: The ``[session]`` settings besides the measurement protocol's: name -> (default, meaning).
SESSION_SETTINGS: dict[str, tuple[str, str]] = {
    "trials": ("30", "The study's budget of trials in all; a session on a study that has some "
               "already runs the rest (``--trials`` overrides it)."),
    "db": (str(DEFAULT_DB), "Where the study is stored: a SQLite file, or ``postgresql://...``."),
    "plot": ("<db folder>/<study>.png", "The convergence plot (PNG) written at the end."),
    "phases": ("none", "Tune groups of knobs one after another, each with its own trials: a "
               "list of ``{ knobs = [...], trials = N }``; ``trials`` is then their sum."),
}  # fmt: skip
_PROTOCOL_KEYS = (
    "repeats", "max_repeats", "control_every", "confirm", "confirm_top", "confirm_select",
    "confirm_max", "confirm_width", "confirm_share", "confirm_window",
)  # fmt: skip
_SESSION_KEYS = (*SESSION_SETTINGS, *_PROTOCOL_KEYS)
#: The closing confirmation's rule when ``[study.stopping]`` names none: the sequential one,
#: chosen on bench.noise_rules' develop cells (bench/NOTES.md, "Issue 61's decision").
#: ``StoppingSettings()`` stays ``fixed``: a study stored without a rule was confirmed by
#: that one, and its verdict is read back with that interval.
DEFAULT_CONFIRM_RULE = "sequential"


@dataclass(frozen=True)
class SessionConfig:
    """A parsed config: the study, the target to build, and the session settings."""

    spec: StudySpec
    target: Target
    trials: int
    db: Path
    plot: Path
    protocol: MeasurementProtocol = field(default_factory=MeasurementProtocol)
    phases: tuple[Phase, ...] = ()  # tune these knob groups one after another (see run_phases)
    daemon: DaemonSettings | None = None  # the [daemon] table, for `tuner daemon`
    rule_given: bool = True  # [study.stopping] names the confirmation's rule itself


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> SessionConfig:
    """Read and validate a config file; ``overrides`` (None: not given) replace
    ``[session]`` settings (trials, db, plot and the protocol's) and ``study.name``."""
    return parse_config(_read_toml(Path(path)), overrides or {})


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValidationError("config", f"file not found: {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise ValidationError("config", f"{path} is not valid TOML: {err}") from None


def load_study(path: str | Path, name: str | None = None) -> tuple[StudySpec, bool]:
    """The study of a config file, for ``tuner create``: ``[target]`` may be left out. With
    whether ``[study.stopping]`` names the confirmation's rule (``SessionConfig.rule_given``).

    Without a ``[target]`` table the ``[study]`` table must list its knobs; with one, the
    whole config is validated as ``tuner tune`` would (knobs from the target's catalog).
    """
    path = Path(path)
    data = _read_toml(path)
    if "target" in data:
        config = parse_config(data, {"name": name})
        return config.spec, config.rule_given
    unknown = set(data) - set(_TABLES)
    if unknown:
        raise ValidationError(sorted(unknown)[0], "unknown table", _TABLES)
    study = dict(_table(data, "study"))
    if name:
        study["name"] = name
    if "knobs" not in study:
        raise ValidationError(
            "study.knobs", "a config without [target] must list its knobs", "[[study.knobs]] tables"
        )
    spec = _study_spec(study, _listed_knobs(study.pop("knobs")), listed=True)
    return with_default_rule(spec, study)


def with_default_rule(
    spec: StudySpec, study: dict[str, Any], phases: bool = False
) -> tuple[StudySpec, bool]:
    """``spec`` with ``DEFAULT_CONFIRM_RULE`` where ``[study.stopping]`` names no rule and a
    confirmation can run (one objective, no phases), and whether the table named one."""
    stopping = study.get("stopping")
    given = isinstance(stopping, dict) and "confirm" in stopping
    if given or spec.multi_objective or phases:
        return spec, given
    return replace(spec, stopping=replace(spec.stopping, confirm=DEFAULT_CONFIRM_RULE)), given


def _study_spec(study: dict[str, Any], knobs: Sequence[Knob], listed: bool) -> StudySpec:
    """``StudySpec.from_dict`` with its errors named as in the file: ``study.objectives[0]``,
    and a listed knob by its place, ``study.knobs[3].unsafe_values`` (as ``knob_from_dict``
    names it); a knob of the target's catalog keeps its name, ``knobs.NAME...``."""
    try:
        return StudySpec.from_dict(study, knobs=tuple(knobs))
    except ValidationError as error:
        for i, knob in enumerate(knobs):
            own = f"knobs.{knob.name}"
            if error.field == own or error.field.startswith(own + "."):
                if not listed:
                    raise
                raise relocate(error, own, f"study.knobs[{i}]", f"knob {knob.name!r}") from None
        if error.field.startswith("study."):
            raise
        raise ValidationError(f"study.{error.field}", error.message, error.allowed) from None


def parse_config(data: dict[str, Any], overrides: dict[str, Any]) -> SessionConfig:
    """Validate the tables of a config already read from TOML."""
    unknown = set(data) - set(_TABLES)
    if unknown:
        raise ValidationError(sorted(unknown)[0], "unknown table", _TABLES)
    study = dict(_table(data, "study"))
    target_table = dict(_table(data, "target"))
    session = dict(_table(data, "session"))
    if overrides.get("name"):
        study["name"] = overrides["name"]
    kind = target_table.pop("kind", None)
    if kind is None:
        raise ValidationError("target.kind", "is required")
    named = target_table.get("knobs")
    target = build_target(kind, target_table)
    listed = "knobs" in study
    if listed:
        knobs = _listed_knobs(study.pop("knobs"), target.describe_knobs())
    elif not target.describe_knobs():
        raise ValidationError(
            "study.knobs",
            f"the {kind} target has no knob catalog: list the knobs to tune",
            '[[study.knobs]] tables such as { name = "level", kind = "int", low = 1, high = 9 }',
        )
    else:
        knobs = _tunable(target.describe_knobs(), study.get("allow_unsafe", False), named)
    if "candidates" not in study:
        offered = target.describe_candidates()
        if offered:
            described = target.describe_candidate_features()
            picked = _candidates_for(offered, knobs, target.describe_knobs())
            study["candidates"] = [c for _, c in picked]
            if described and "candidate_features" not in study:
                study["candidate_features"] = [described[i] for i, _ in picked]
    spec, rule_given = with_default_rule(
        _study_spec(study, knobs, listed), study, session.get("phases") is not None
    )
    _check_metrics(spec, target)
    target.check_space(spec.space)
    unknown = set(session) - set(_SESSION_KEYS)
    if unknown:
        raise ValidationError(f"session.{sorted(unknown)[0]}", "unknown setting", _SESSION_KEYS)
    trials = overrides.get("trials") or session.get("trials", 30)
    if isinstance(trials, bool) or not isinstance(trials, int) or not 1 <= trials <= 100_000:
        raise ValidationError("session.trials", f"got {trials!r}", "an integer in [1, 100000]")
    db = _session_db(overrides.get("db") or session.get("db", DEFAULT_DB))
    plot = Path(overrides.get("plot") or session.get("plot", db.parent / f"{spec.name}.png"))
    if overrides.get("name") and not overrides.get("plot"):
        # a study renamed for this run gets its own plot beside the configured one, not
        # the same file another run of the config writes
        plot = plot.with_name(f"{spec.name}{plot.suffix or '.png'}")
    given = {k: overrides[k] for k in _PROTOCOL_KEYS if overrides.get(k) is not None}
    given = {**{k: session[k] for k in _PROTOCOL_KEYS if k in session}, **given}
    repeats = given.get("repeats")
    if "max_repeats" not in given and isinstance(repeats, int) and not isinstance(repeats, bool):
        given["max_repeats"] = max(DEFAULT_PROTOCOL.max_repeats, repeats)  # at least repeats
    protocol = replace(DEFAULT_PROTOCOL, **given)
    if "confirm" not in given and (spec.multi_objective or session.get("phases") is not None):
        protocol = replace(protocol, confirm=0)
    confirm = protocol.confirm
    if confirm and spec.multi_objective:
        raise ValidationError(
            "session.confirm",
            "re-measures one best trial; not available with several objectives",
            "0",
        )
    phases = _phases(session.get("phases"), spec, "trials" in session or overrides.get("trials"))
    if phases and spec.candidates:
        raise ValidationError(
            "session.phases",
            "a phase searches some knobs with the others held, which a candidate list of "
            "whole configurations does not allow",
            "no phases with candidates",
        )
    if phases:
        trials = sum(p.trials for p in phases)
        if confirm:
            raise ValidationError("session.confirm", "not available with phases yet", "0")
    daemon = None
    if "daemon" in data:
        daemon = parse_daemon(_table(data, "daemon"), spec, db)
        available = target.describe_metrics()
        for i, name in enumerate(daemon.watch):
            if name not in available:
                raise ValidationError(
                    f"daemon.watch[{i}]", f"the target reports no metric {name!r}", available
                )
    return SessionConfig(spec, target, trials, db, plot, protocol, phases, daemon, rule_given)


def _phases(value: Any, spec: StudySpec, trials_given: Any) -> tuple[Phase, ...]:
    """``[session] phases``: a list of ``{ knobs = [...], trials = N }`` tables."""
    if value is None:
        return ()
    allowed = 'a list of { knobs = ["name", ...], trials = N } tables'
    if not isinstance(value, list) or not value:
        raise ValidationError("session.phases", f"got {value!r}", allowed)
    if trials_given:
        raise ValidationError("session.trials", "with phases, each phase sets its trials", allowed)
    if spec.parameter_constraints or spec.embedding is not None:
        raise ValidationError(
            "session.phases",
            "phases cannot be combined with parameter_constraints or an embedding",
        )
    relative = [str(c) for c in spec.outcome_constraints if c.relative]
    if relative:
        raise ValidationError(
            "session.phases",
            f"{relative[0]!r} is relative to the default configuration, and each phase measures "
            "its own default (the earlier phases' best); use an absolute bound",
        )
    if spec.multi_objective:
        raise ValidationError(
            "session.phases",
            "a phase holds its knobs at one best configuration; a study with several "
            "objectives has a Pareto front instead",
            "one objective",
        )
    seen: set[str] = set()
    phases = []
    for i, entry in enumerate(value):
        where = f"session.phases[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"knobs", "trials"}:
            raise ValidationError(where, f"got {entry!r}", allowed)
        knobs, trials = entry["knobs"], entry["trials"]
        if not isinstance(knobs, list) or not knobs:
            raise ValidationError(
                f"{where}.knobs", f"got {knobs!r}", "a non-empty list of knob names"
            )
        for j, name in enumerate(knobs):
            if name not in spec.space:
                raise ValidationError(
                    f"{where}.knobs[{j}]", f"unknown knob {name!r}", spec.space.names
                )
            if name in seen:
                raise ValidationError(f"{where}.knobs[{j}]", f"{name!r} is in an earlier phase")
            seen.add(name)
        if isinstance(trials, bool) or not isinstance(trials, int) or not 1 <= trials <= 100_000:
            raise ValidationError(f"{where}.trials", f"got {trials!r}", "an integer in [1, 100000]")
        phases.append(Phase(tuple(knobs), trials))
    for knob in spec.space.knobs:
        if knob.default is None and any(knob.name not in p.knobs for p in phases):
            raise ValidationError(
                f"knobs.{knob.name}.default",
                "a knob held during a phase needs a default",
                "a default value for the knob",
            )
    return tuple(phases)


def _listed_knobs(listed: Any, catalog: tuple[Knob, ...] = ()) -> tuple[Knob, ...]:
    """The study's own knob list; an entry with only a ``name`` takes the target's knob.

    So a study can tune catalog knobs (read from the device) together with knobs of its own
    (a workload's batch size): ``[{ name = "sm_mhz" }, { name = "batch", kind = "int", ...}]``.
    """
    if not isinstance(listed, list):
        raise ValidationError("study.knobs", f"got {listed!r}", "a list of knob tables")
    by_name = {k.name: k for k in catalog}
    knobs = []
    for i, entry in enumerate(listed):
        if isinstance(entry, dict) and set(entry) == {"name"}:
            if entry["name"] not in by_name:
                raise ValidationError(
                    f"study.knobs[{i}].name",
                    f"{entry['name']!r} is not a knob of the target (give its kind and range)",
                    tuple(by_name) or "no catalog: list kind and range",
                )
            knobs.append(by_name[entry["name"]])
        else:
            knobs.append(knob_from_dict(entry, f"study.knobs[{i}]"))
    return tuple(knobs)


def _candidates_for(
    offered: tuple[Config, ...], knobs: tuple[Knob, ...], catalog: tuple[Knob, ...]
) -> list[tuple[int, Config]]:
    """The target's candidates as configurations of the study's knobs, each with its index
    in ``offered``.

    A catalog knob the study leaves out stays at its default, so only the candidates that
    have it there remain; each is cut down to the study's knobs (repeats dropped).
    """
    names = [k.name for k in knobs]
    fixed = {k.name: k.default for k in catalog if k.name not in names}
    out: dict[tuple[Any, ...], tuple[int, Config]] = {}
    for i, config in enumerate(offered):
        if all(config.get(name) == value for name, value in fixed.items()):
            projected = {name: config[name] for name in names if name in config}
            out.setdefault(tuple(projected.items()), (i, projected))
    return list(out.values())


def _tunable(knobs: tuple[Knob, ...], allow_unsafe: object, named: object) -> tuple[Knob, ...]:
    """The catalog's knobs, less the choice knobs a safe study cannot tune.

    A bool knob with an unsafe value (PostgreSQL's ``full_page_writes = off``) has one safe
    value left, as has SQLite's ``locking_mode`` without ``exclusive``. Taking "every catalog
    knob" leaves such knobs at their default; naming one in ``target.knobs`` without
    ``allow_unsafe = true`` is an error (raised by the spec).
    """
    if allow_unsafe is True:
        return knobs
    listed = set(named) if isinstance(named, list) else set()
    return tuple(k for k in knobs if not _one_safe_choice(k) or k.name in listed)


def _one_safe_choice(knob: Knob) -> bool:
    """A choice knob (bool, categorical, ordinal) with unsafe values and at most one other."""
    choices = getattr(knob, "choices", None)
    return (
        bool(knob.unsafe_values)
        and isinstance(choices, tuple)
        and (len(choices) - len(knob.unsafe_values) < 2)
    )


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ValidationError(key, "must be a table")
    return value


def _check_metrics(spec: StudySpec, target: Target) -> None:
    available = target.describe_metrics()
    wanted = [(f"study.objectives[{i}].name", o.name) for i, o in enumerate(spec.objectives)]
    wanted += [
        (f"study.outcome_constraints[{i}]", c.metric)
        for i, c in enumerate(spec.outcome_constraints)
    ]
    for field_, metric in wanted:
        if metric not in available:
            raise ValidationError(
                field_, f"the {target.kind} target does not report {metric!r}", sorted(available)
            )


def _session_db(value: object) -> Path:
    """The SQLite file of ``session.db`` (a path, or ``sqlite:///PATH``). A session keeps
    its study in a file beside its plots; a shared PostgreSQL database is a server's
    (``tuner serve --db postgresql://...``), which a session reaches with ``--server``."""
    allowed = ["a file path", "sqlite:///PATH"]
    if not isinstance(value, str | os.PathLike):
        raise ValidationError("session.db", f"got {value!r}", allowed)
    text = os.fspath(value)
    if text.startswith("sqlite:///") and len(text) > len("sqlite:///"):
        return Path(text[len("sqlite:///") :])
    if "://" in text:
        raise ValidationError(
            "session.db",
            f"{text!r}: a session keeps its study in a SQLite file; for a PostgreSQL "
            "database run `tuner serve --db postgresql://...` and pass --server HOST:PORT",
            allowed,
        )
    return Path(text)
