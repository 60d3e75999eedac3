"""Tune any program: a target that runs a command per trial and reads the metrics it prints.

The program is named as an argument list, never a shell string, so a knob value reaches it
as exactly one argument whatever it contains (spaces, quotes, ``;``, ``$(...)``, newlines)::

    [target]
    kind = "command"
    command = ["python3", "bench.py", "--level", "{level}", "--threads={threads}"]
    metrics = ["mb_per_s", "ratio"]       # what the program reports (checked against the study)
    timeout_s = 60                        # per trial; the whole process group is then killed
    infeasible_exit_codes = [3]           # exit codes that mean "this configuration is bad"
    setup = ["python3", "bench.py", "--make-data"]      # optional, once before the first trial
    restore = ["sh", "-c", "rm -f out.tmp"]            # optional, after every trial, always
    teardown = ["python3", "bench.py", "--clean"]      # optional, once at the end, always
    metrics_file = "metrics.json"         # optional: read this file instead of stdout
    progress = 'tps=(?P<tps>[0-9.]+)'     # optional: a stdout line per window of the run
    env = { DATA = "data.bin" }           # optional fixed environment variables
    knob_env = true                       # also pass TUNER_<KNOB> variables (default)
    allow_dash_values = false             # values like "-r" may start an argument (default: no)
    workdir = "."                         # where the commands run (default: the current dir)

Placeholders: ``{knob}`` in any argument of ``command`` and ``restore`` is replaced by the
knob's value (``{{`` and ``}}`` stand for literal braces); ints print as integers, floats
as Python's shortest round-trip form (``0.1``, ``1e-05``), bools as ``true``/``false``,
choices as their text. With ``knob_env`` every command also gets ``TUNER_<KNOB>`` (the name
upper-cased, ``.`` and ``-`` turned into ``_``) with the same text. Every placeholder must
name a knob of the study; ``setup`` and ``teardown`` run without a configuration and so
take none.

An argument that starts with a knob's value and, rendered whole, looks like an option
(``-`` and more: a choice ``-r`` or ``--output=f``, a negative number, or ``{a}{b}`` with
``a`` = ``-`` and ``b`` = ``-output=f``) is refused: ``check_space`` refuses a study whose
knobs can render one (``sort {mode}``), and ``render`` checks every rendered argument, so
that a value never reaches the program as an option it did not mean. Put the value inside
an option's argument (``--mode={mode}``), put a ``--`` argument before it (most programs
then read what follows as operands), or set ``allow_dash_values = true``.

Metrics: the last JSON object printed on stdout, starting at the beginning of a line (one
line, or pretty-printed with its closing brace on a later line); lines after it are
ignored. Each name in ``metrics`` must be there with a finite number; other numeric keys
are kept as extra metrics, other values ignored. Malformed output is a FAILED trial whose
reason names the line.

Progress: with ``progress``, a regular expression whose named groups are metric names, each
stdout line it matches while the program runs is one window of the measurement (its groups
that hold a number are the window's metrics), reported as the line appears
(``Target.window``: stored with the trial, and the study may stop the trial early). A trial
stopped early has its process group killed; its metrics are the means of its windows.

Outcomes: exit status 0 with valid metrics is COMPLETED; an exit status listed in
``infeasible_exit_codes`` is INFEASIBLE; any other non-zero status (or death by a signal) is
FAILED, with the end of stderr as the reason. Past ``timeout_s`` the command's whole process
group gets SIGTERM, then SIGKILL two seconds later, and the trial is TIMED_OUT. Each command
runs in a new session (its own process group), so nothing it started survives the trial:
processes it leaves behind are killed when it exits. ``setup`` is the exception: what it
starts in the background (a server, say) keeps running until ``teardown``. ``restore`` runs
after every trial whatever happened, and ``teardown`` whenever ``setup`` was started; if
either fails the session stops, since the system may be left changed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar

from targets.base import Target, option_directory, option_int, option_number
from tuner.constraints import METRIC_NAME
from tuner.errors import ConfigRejected, TargetError, TrialTimedOut, ValidationError
from tuner.space import Config, FloatKnob, IntKnob, Knob, Scalar, SearchSpace

KILL_GRACE_S = 2.0  # SIGTERM -> SIGKILL
FOLLOW_S = 0.05  # how often a run with progress lines is read while it runs
STDERR_TAIL = 1500  # characters of stderr kept in a failure reason
OUTPUT_LIMIT = 8 * 1024 * 1024  # bytes of stdout read for the metrics (the end is kept)
MAX_TIMEOUT_S = 7 * 24 * 3600.0
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


@dataclass(frozen=True)
class Finished:
    """A command that ran to its end: exit status and what it printed."""

    status: int
    stdout: str
    stderr: str
    stopped: bool = False  # ``on_line`` stopped it (its process group was killed)


class CommandTarget(Target):
    """Runs a user's program once per trial (see the module doc for the config).

    Args:
        command: Argument list run once per trial, the program first (never via a shell);
            ``{knob}`` placeholders are replaced by the trial's values. Required.
        metrics: Names of the metrics the program must report, a non-empty list without
            repeats.
        timeout_s: Seconds each command may run (trial, setup, restore, teardown) before its
            process group is killed; in ``(0, 604800]``.
        infeasible_exit_codes: Exit statuses in ``[1, 255]`` that make the trial INFEASIBLE
            rather than FAILED (default: none).
        setup: Argument list run once before the first trial, without placeholders; what it
            starts in the background keeps running until ``teardown`` (default: none).
        restore: Argument list run after every trial whatever happened; placeholders allowed
            (default: none).
        teardown: Argument list run once at the end whenever ``setup`` was started, without
            placeholders (default: none).
        metrics_file: File, relative to ``workdir``, to read the metrics from instead of
            stdout; deleted before each trial (default: stdout).
        env: Table of fixed environment variables added to every command (default: none).
        knob_env: Whether every command also gets a ``TUNER_<KNOB>`` variable per knob.
        workdir: Existing directory the commands run in (default: the current directory).
        allow_dash_values: Whether a knob value that looks like an option (``-r``, a negative
            number) may start an argument.
        progress: A regular expression with named groups, each a metric name; every stdout
            line it matches while the program runs is one window of the measurement
            (default: none).
    """

    kind: ClassVar[str] = "command"

    def __init__(
        self,
        *,
        command: Any = None,
        metrics: Any = None,
        timeout_s: Any = 600.0,
        infeasible_exit_codes: Any = (),
        setup: Any = None,
        restore: Any = None,
        teardown: Any = None,
        metrics_file: Any = None,
        env: Any = None,
        knob_env: Any = True,
        workdir: Any = None,
        allow_dash_values: Any = False,
        progress: Any = None,
    ) -> None:
        self.command: list[str] = argv_option("command", command, required=True) or []
        self.setup_command = argv_option("setup", setup)
        self.restore_command = argv_option("restore", restore)
        self.teardown_command = argv_option("teardown", teardown)
        for name, argv in (("command", self.command), ("restore", self.restore_command)):
            for index, arg in enumerate(argv or ()):
                placeholders(arg, f"target.{name}[{index}]")  # the syntax; names: check_space
        for name, argv in (("setup", self.setup_command), ("teardown", self.teardown_command)):
            for index, arg in enumerate(argv or ()):
                if placeholders(arg, f"target.{name}[{index}]"):
                    raise ValidationError(
                        f"target.{name}[{index}]",
                        f"{arg!r} has a placeholder, but {name} runs without a configuration",
                        "literal arguments ({{ and }} for braces)",
                    )
        self.metrics = metric_names(metrics)
        self.timeout_s = option_number("timeout_s", timeout_s, 0.0, MAX_TIMEOUT_S, open_low=True)
        self.infeasible_exit_codes = _exit_codes(infeasible_exit_codes)
        if metrics_file is not None and (not isinstance(metrics_file, str) or not metrics_file):
            raise ValidationError(
                "target.metrics_file", f"got {metrics_file!r}", "a file path, or omit it"
            )
        self.metrics_file: str | None = metrics_file
        self.env = _env_table(env)
        if not isinstance(knob_env, bool):
            raise ValidationError("target.knob_env", f"got {knob_env!r}", "true or false")
        self.knob_env = knob_env
        if not isinstance(allow_dash_values, bool):
            raise ValidationError(
                "target.allow_dash_values", f"got {allow_dash_values!r}", "true or false"
            )
        self.allow_dash_values = allow_dash_values
        self.workdir = (option_directory("workdir", workdir) or Path(".")).resolve()
        self.progress = _progress_pattern(progress)
        self._set_up = False
        self._config: dict[str, Scalar] | None = None  # the trial in progress

    # -- life cycle ---------------------------------------------------------------------
    def setup(self) -> None:
        if self.setup_command is not None:
            self._set_up = True
            self._must_succeed("setup", self.setup_command, self._environment({}), group=False)

    def close(self) -> None:
        if self._set_up and self.teardown_command is not None:
            self._set_up = False
            self._must_succeed("teardown", self.teardown_command, self._environment({}))

    # -- the adapter ------------------------------------------------------------------
    def describe_knobs(self) -> tuple[Knob, ...]:
        return ()  # no catalog: the study lists its knobs

    def describe_metrics(self) -> dict[str, str]:
        return {name: "reported by the command" for name in self.metrics}

    def check_space(self, space: SearchSpace) -> None:
        names = tuple(space.names)
        for field_, argv in (("command", self.command), ("restore", self.restore_command)):
            for index, arg in enumerate(argv or ()):
                for name in placeholders(arg, f"target.{field_}[{index}]"):
                    if name not in names:
                        raise ValidationError(
                            f"target.{field_}[{index}]",
                            f"placeholder {{{name}}} names no knob of the study",
                            names,
                        )
            if not self.allow_dash_values:
                _check_no_option_values(argv or [], space, field_)
        seen: dict[str, str] = {}
        for name in names:
            variable = env_name(name)
            if variable in seen:
                raise ValidationError(
                    "study.knobs",
                    f"knobs {seen[variable]!r} and {name!r} share the variable {variable}",
                    "knob names that differ after upper-casing and '.'/'-' -> '_'",
                )
            seen[variable] = name

    def apply(self, config: Config) -> None:
        self._config = dict(config)

    def measure(self) -> dict[str, float]:
        config = self._config or {}
        argv = render(self.command, config, "command", self.allow_dash_values)
        metrics_path = self.workdir / self.metrics_file if self.metrics_file else None
        if metrics_path is not None:
            metrics_path.unlink(missing_ok=True)  # never read a previous trial's numbers
        windows: list[dict[str, float]] = []

        def on_line(line: str) -> bool:
            window = _window(self.progress, line) if self.progress is not None else None
            if window is None:
                return False
            windows.append(window)
            return self.window(window)

        follow = on_line if self.progress is not None and self.watched else None
        done = run_command(argv, self._environment(config), self.workdir, self.timeout_s,
                           on_line=follow)  # fmt: skip
        if done.stopped:
            names = dict.fromkeys(k for w in windows for k in w)
            return {n: sum(w[n] for w in windows if n in w) / sum(n in w for w in windows)
                    for n in names}  # fmt: skip
        if done.status != 0:
            what = _exit_text(done.status)
            tail = tail_text(done.stderr)
            if done.status in self.infeasible_exit_codes:
                raise ConfigRejected(
                    f"{what} (listed in target.infeasible_exit_codes)"
                    + (f": {tail}" if tail else "")
                )
            raise TargetError(what + (f": {tail}" if tail else ""))
        if metrics_path is None:
            return parse_metrics(done.stdout, self.metrics, "stdout")
        try:
            text = metrics_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            raise TargetError(
                f"the command exited 0 but wrote no metrics file {metrics_path}"
            ) from None
        return parse_metrics(text, self.metrics, f"metrics file {self.metrics_file}")

    def restore(self) -> None:
        config, self._config = self._config, None
        if self.restore_command is not None and config is not None:
            argv = render(self.restore_command, config, "restore", self.allow_dash_values)
            self._must_succeed("restore", argv, self._environment(config))

    # -- helpers ------------------------------------------------------------------------
    def _environment(self, config: Mapping[str, Scalar]) -> dict[str, str]:
        environment = {**os.environ, **self.env}
        if self.knob_env:
            for name, value in config.items():
                environment[env_name(name)] = _nul_free(format_value(value), name)
        return environment

    def _must_succeed(
        self, what: str, argv: list[str], environment: dict[str, str], group: bool = True
    ) -> None:
        try:
            done = run_command(argv, environment, self.workdir, self.timeout_s, group)
        except TargetError as exc:
            raise TargetError(f"{what} command: {exc}") from exc
        if done.status != 0:
            tail = tail_text(done.stderr)
            raise TargetError(
                f"{what} command {argv[0]!r}: {_exit_text(done.status)}"
                + (f": {tail}" if tail else "")
            )


def run_command(
    argv: Sequence[str],
    environment: Mapping[str, str],
    cwd: Path,
    timeout_s: float,
    kill_leftovers: bool = True,
    on_line: Callable[[str], bool] | None = None,
) -> Finished:
    """Run ``argv`` in a new session, wait at most ``timeout_s``, return its output.

    Output goes to temporary files (not pipes), so a background process that inherits
    stdout cannot make the wait hang. On timeout, and on any exception while waiting (a
    SIGTERM turned into ``SystemExit``, Ctrl-C), the whole process group is killed. With
    ``on_line``, every complete stdout line goes to it as it appears (read every
    ``FOLLOW_S``); True from it kills the process group and ends the run ``stopped``.

    Raises:
        TrialTimedOut: It ran past ``timeout_s``.
        TargetError: It could not be started (no such program, not executable).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=dict(environment),
                start_new_session=True,
            )
        except OSError as exc:
            raise TargetError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
        try:
            if on_line is None:
                status = proc.wait(timeout=timeout_s)
            elif (followed := _follow(proc, out, timeout_s, on_line)) is None:
                kill_group(proc)
                return Finished(-1, _read(out, OUTPUT_LIMIT), _read(err), stopped=True)
            else:
                status = followed
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise TrialTimedOut(
                f"{argv[0]!r} ran past timeout_s = {timeout_s:g} s; its process group was "
                "killed" + (f"; stderr: {tail_text(_read(err))}" if _read(err).strip() else "")
            ) from None
        except BaseException:
            kill_group(proc)
            raise
        if kill_leftovers:
            _signal_group(proc.pid, signal.SIGKILL)
        return Finished(status, _read(out, OUTPUT_LIMIT), _read(err))


def _follow(
    proc: subprocess.Popen[bytes], out: IO[bytes], timeout_s: float, on_line: Callable[[str], bool]
) -> int | None:
    """Wait for ``proc`` while handing each complete line of ``out`` to ``on_line``: its
    exit status, or None as soon as ``on_line`` says stop.

    Raises:
        subprocess.TimeoutExpired: It ran past ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    offset, pending = 0, b""
    while True:
        try:
            status: int | None = proc.wait(timeout=FOLLOW_S)
        except subprocess.TimeoutExpired:
            status = None
        while chunk := os.pread(out.fileno(), 1 << 16, offset):
            offset += len(chunk)
            pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if on_line(line.decode("utf-8", errors="replace")):
                return None
        if status is not None:
            return status
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)


def _window(pattern: re.Pattern[str], line: str) -> dict[str, float] | None:
    """The metrics a progress line gives (its named groups that hold a finite number), or
    None when the line is not one."""
    found = pattern.search(line)
    if found is None:
        return None
    window = {}
    for name, text in found.groupdict().items():
        try:
            value = float(text) if text is not None else math.nan
        except ValueError:
            continue
        if math.isfinite(value):
            window[name] = value
    return window or None


def _progress_pattern(value: Any) -> re.Pattern[str] | None:
    """``target.progress``: a regular expression whose named groups are metric names."""
    if value is None:
        return None
    allowed = "a regular expression with named groups (?P<metric>...), each a metric name"
    if not isinstance(value, str) or not value:
        raise ValidationError("target.progress", f"got {value!r}", allowed)
    try:
        pattern = re.compile(value)
    except re.error as exc:
        raise ValidationError(
            "target.progress", f"{value!r} does not compile: {exc}", allowed
        ) from None
    if not pattern.groupindex:
        raise ValidationError("target.progress", f"{value!r} has no named group", allowed)
    for name in pattern.groupindex:
        if not METRIC_NAME.fullmatch(name):
            raise ValidationError(
                "target.progress", f"group {name!r} is not a metric name", allowed
            )
    return pattern


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL after ``KILL_GRACE_S``; reap ``proc``."""
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(pgid, sig)


def placeholders(arg: str, field_: str) -> list[str]:
    """The knob names ``arg`` refers to as ``{name}``.

    Raises:
        ValidationError: A brace that is neither ``{name}``, ``{{`` nor ``}}``.
    """
    names = []
    for match in _PLACEHOLDER.finditer(arg):
        token = match.group(0)
        if token in ("{{", "}}"):
            continue
        if match.group(1) is None or not match.group(1):
            raise ValidationError(
                field_,
                f"unmatched or empty brace at column {match.start() + 1} of {arg!r}",
                "{knob} placeholders, and {{ or }} for literal braces",
            )
        names.append(match.group(1))
    return names


def render(
    argv: Sequence[str], config: Mapping[str, Scalar], field_: str, dash_values: bool = False
) -> list[str]:
    """``argv`` with every ``{knob}`` replaced by the knob's value, each argument kept whole.

    Raises:
        TargetError: A placeholder names a knob the configuration lacks, or a value holds
            a NUL character (which no program argument can carry).
        ConfigRejected: Unless ``dash_values``, an argument (before any ``--``) whose
            rendering starts with a knob's value and looks like an option
            (``_option_like``); ``check_space`` refuses such a study before it runs, so
            this guards direct calls.
    """
    out = []
    ended = False  # a "--" argument ends the options: what follows is never one
    for index, arg in enumerate(argv):
        where = f"target.{field_}[{index}]"
        pieces = [_render_piece(match, config, where) for match in _tokens(arg)]
        text = "".join(piece for piece, _ in pieces)
        if not dash_values and not ended:
            # the rendered argument is checked, not each knob: "{a}{b}" with a = "-" and
            # b = "-output=f" is "--output=f" though neither value alone starts an option
            first = next(((piece, knob) for piece, knob in pieces if piece), ("", None))
            if first[1] is not None and _option_like(text):
                raise ConfigRejected(
                    f"{where}: {arg!r} renders as {text!r}, which starts with knob "
                    f"{first[1]!r} = {config[first[1]]!r} and would reach the program as an "
                    "option (see allow_dash_values)"
                )
        ended = ended or arg == "--"
        out.append(text)
    return out


def _tokens(arg: str) -> list[re.Match[str] | str]:
    """``arg`` split into literal text and placeholder matches, in order."""
    parts: list[re.Match[str] | str] = []
    end = 0
    for match in _PLACEHOLDER.finditer(arg):
        if match.start() > end:
            parts.append(arg[end : match.start()])
        parts.append(match)
        end = match.end()
    if end < len(arg):
        parts.append(arg[end:])
    return parts


def _render_piece(
    part: re.Match[str] | str, config: Mapping[str, Scalar], where: str
) -> tuple[str, str | None]:
    """One part of an argument as rendered, with the knob it came from (None: literal)."""
    if isinstance(part, str):
        return part, None
    token = part.group(0)
    if token in ("{{", "}}"):
        return token[0], None
    name = part.group(1)
    if not name or name not in config:
        raise TargetError(f"{where}: placeholder {token} names no knob of this trial")
    return _nul_free(format_value(config[name]), name), name


def _option_like(text: str) -> bool:
    """Whether a program would read ``text`` as an option: ``-`` then at least one character
    (``-`` alone conventionally means standard input)."""
    return len(text) > 1 and text.startswith("-")


def _check_no_option_values(argv: Sequence[str], space: SearchSpace, field_: str) -> None:
    """Refuses an argument (before any ``--``) that can render as an option whose leading
    ``-`` comes from a knob's value (``sort {mode} ...`` with ``mode`` =
    ``--output=/some/file`` writes that file): a choice such as ``-r``, a range below 0, or
    a ``-`` choice followed by more text (``{a}{b}`` with ``a`` = ``-``)."""
    knobs = {knob.name: knob for knob in space.knobs}
    for index, arg in enumerate(argv):
        if arg == "--":
            return
        example = _option_rendering(_tokens(arg), knobs)
        if example is not None:
            raise ValidationError(
                f"target.{field_}[{index}]",
                f"{arg!r} starts with a knob's value and can render as {example!r}, which "
                "the program would read as an option",
                "the value inside an option's argument (--mode={mode}), a '--' argument "
                "before it, or allow_dash_values = true",
            )


def _option_rendering(
    parts: Sequence[re.Match[str] | str], knobs: Mapping[str, Knob]
) -> str | None:
    """A rendering of an argument's ``parts`` (``_tokens``) that a program would read as an
    option and whose leading ``-`` comes from a knob's value, or None if it has none.

    Walks from the start over the parts that can render empty: a literal text starts the
    argument itself (the author's own option), a knob's value starting with ``-`` and more
    is an example, as is a ``-`` value followed by anything that can render non-empty."""
    for position, part in enumerate(parts):
        if isinstance(part, str) or part.group(0) in ("{{", "}}"):
            return None  # the author's own text starts the argument
        values = _values(part, knobs)
        dashed = [v for v in values if v.startswith("-")]
        if any(len(v) > 1 for v in dashed):
            return next(v for v in dashed if len(v) > 1)
        if dashed:
            rest = "".join(_non_empty(later, knobs) for later in parts[position + 1 :])
            if rest:
                return "-" + rest
        if "" not in values:
            return None
    return None


def _values(part: re.Match[str] | str, knobs: Mapping[str, Knob]) -> list[str]:
    """The texts a part of an argument renders as: a literal's own text (its braces
    unescaped); a knob's choices, or for a numeric knob its lower bound (the only value a
    program might read as an option is a negative number); [] for an unknown knob."""
    if isinstance(part, str):
        return [part]
    if part.group(0) in ("{{", "}}"):
        return [part.group(0)[0]]
    knob = knobs.get(part.group(1) or "")
    if knob is None:
        return []
    if isinstance(knob, (FloatKnob, IntKnob)):
        return [format_value(knob.low)]
    if hasattr(knob, "choices"):
        return [format_value(c) for c in knob.choices]
    return ["true", "false"]


def _non_empty(part: re.Match[str] | str, knobs: Mapping[str, Knob]) -> str:
    """A non-empty text ``part`` can render as, or "" when it renders empty only."""
    return next((v for v in _values(part, knobs) if v), "")


def format_value(value: Scalar) -> str:
    """A knob value as program text: ``true``/``false``, ``42``, ``0.1``, or the choice."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def env_name(knob: str) -> str:
    """``TUNER_<KNOB>``: the knob name upper-cased, ``.`` and ``-`` turned into ``_``."""
    return "TUNER_" + re.sub(r"[^A-Z0-9_]", "_", knob.upper())


def parse_metrics(text: str, required: Sequence[str], source: str) -> dict[str, float]:
    """The metrics in the last JSON object of ``text`` that starts a line.

    Raises:
        TargetError: No such object, invalid JSON, or a required metric missing or not a
            finite number; the message names the line of ``source``.
    """
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("{")]
    if not starts:
        last = next((line.rstrip("\n") for line in reversed(lines) if line.strip()), "")
        raise TargetError(
            f"{source}: no JSON object of metrics (print one such as "
            f'{{"{required[0] if required else "metric"}": 1.5}} on a line of its own); '
            f"last line: {last[:200]!r}"
        )
    index = starts[-1]
    offset = sum(len(line) for line in lines[:index])
    where = f"{source} line {index + 1}"
    try:
        document, _ = json.JSONDecoder().raw_decode(text, offset)
    except json.JSONDecodeError as exc:
        raise TargetError(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
            f"{lines[index].rstrip()[:200]!r}"
        ) from None
    metrics: dict[str, float] = {}
    for name in required:
        if name not in document:
            raise TargetError(
                f"{where}: metric {name!r} is missing (the object has {sorted(document)})"
            )
        metrics[name] = _finite(document[name], name, where)
    for name, value in document.items():
        if name not in metrics and _is_number(value) and math.isfinite(value):
            metrics[str(name)] = float(value)
    return metrics


def _finite(value: Any, name: str, where: str) -> float:
    if not _is_number(value) or not math.isfinite(value):
        raise TargetError(f"{where}: metric {name!r} is {value!r}, expected a finite number")
    return float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _nul_free(text: str, knob: str) -> str:
    if "\0" in text:
        raise TargetError(f"knob {knob!r}: its value holds a NUL character: {text!r}")
    return text


def _exit_text(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def tail_text(text: str) -> str:
    text = text.strip()
    return text if len(text) <= STDERR_TAIL else "..." + text[-STDERR_TAIL:]


def _read(handle: IO[bytes], limit: int = 64 * 1024) -> str:
    """The last ``limit`` bytes written to ``handle``, decoded leniently."""
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(max(0, size - limit))
    return handle.read().decode("utf-8", errors="replace")


def argv_option(name: str, value: Any, required: bool = False) -> list[str] | None:
    allowed = 'a list of strings, the program first: ["prog", "--flag", "{knob}"]'
    if value is None:
        if required:
            raise ValidationError(f"target.{name}", "is required", allowed)
        return None
    if isinstance(value, str):
        raise ValidationError(
            f"target.{name}",
            f"got the string {value!r}: commands are never run by a shell",
            allowed,
        )
    if not isinstance(value, list | tuple) or not value:
        raise ValidationError(f"target.{name}", f"got {value!r}", allowed)
    for index, arg in enumerate(value):
        if not isinstance(arg, str) or "\0" in arg:
            raise ValidationError(f"target.{name}[{index}]", f"got {arg!r}", "a string without NUL")
    if not value[0]:
        raise ValidationError(f"target.{name}[0]", "the program is empty", allowed)
    return list(value)


def metric_names(value: Any) -> tuple[str, ...]:
    allowed = 'a non-empty list of metric names, e.g. ["mb_per_s", "ratio"]'
    if isinstance(value, str) or not isinstance(value, list | tuple) or not value:
        raise ValidationError("target.metrics", f"got {value!r}", allowed)
    for index, name in enumerate(value):
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
            pattern = f"a name matching {METRIC_NAME.pattern}"
            raise ValidationError(f"target.metrics[{index}]", f"got {name!r}", pattern)
    if len(set(value)) != len(value):
        raise ValidationError("target.metrics", f"repeated names in {value!r}", allowed)
    return tuple(value)


def _exit_codes(value: Any) -> frozenset[int]:
    allowed = "a list of exit statuses in [1, 255]"
    if not isinstance(value, list | tuple):
        raise ValidationError("target.infeasible_exit_codes", f"got {value!r}", allowed)
    return frozenset(
        option_int(f"infeasible_exit_codes[{i}]", code, 1, 255) for i, code in enumerate(value)
    )


def _env_table(value: Any) -> dict[str, str]:
    allowed = 'a table of NAME = "text"'
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError("target.env", f"got {value!r}", allowed)
    for name, text in value.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
            raise ValidationError(
                f"target.env.{name}", "not a variable name", "[A-Za-z_][A-Za-z0-9_]*"
            )
        if not isinstance(text, str) or "\0" in text:
            raise ValidationError(f"target.env.{name}", f"got {text!r}", allowed)
    return dict(value)
