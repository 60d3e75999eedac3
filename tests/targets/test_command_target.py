"""The command target with real subprocesses: arguments, environment, metrics, exit codes,
timeouts, restore, setup and teardown."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from runner.config import parse_config
from targets.command.target import CommandTarget, env_name, parse_metrics
from targets.registry import build_target
from tuner.errors import TargetError, ValidationError
from tuner.trial import TrialStatus

PY = sys.executable
# Values a shell would interpret; the program must receive each one as exactly this text.
HOSTILE = [
    "; rm -rf ~ #",
    "$(touch pwned) `touch pwned2` $HOME",
    "two words\nand a second line",
    "'single' \"double\" \\back",
    "* ? [a-z] {a,b} > out < in | cat &",
    "ünïcødé ✓",
    "-",
    "",
]

PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    mode = os.environ.get("MODE", "ok")
    record = os.environ.get("RECORD")
    if record:
        env = {k: v for k, v in os.environ.items() if k.startswith("TUNER_")}
        with open(record, "w", encoding="utf-8") as f:
            json.dump({"argv": sys.argv[1:], "env": env, "cwd": os.getcwd()}, f)
    if mode == "ok":
        print("warming up")
        print(json.dumps({"y": 1.5, "extra": 7, "note": "text"}))
        print("done")
    elif mode == "pretty":
        print("log line")
        print(json.dumps({"ignored": 1}))
        print(json.dumps({"y": 2.5, "nested": {"a": [1, {"b": 2}]}}, indent=2))
        print("trailing words")
    elif mode == "badjson":
        print("a")
        print("b")
        print('{"y": 1.0,')
    elif mode == "missing":
        print(json.dumps({"z": 1}))
    elif mode == "nan":
        print('{"y": NaN}')
    elif mode == "string":
        print(json.dumps({"y": "fast"}))
    elif mode == "none":
        print("no numbers here")
    elif mode == "exit":
        print("went wrong", file=sys.stderr)
        sys.exit(int(os.environ["CODE"]))
    elif mode == "signal":
        import signal
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "program.py"
    path.write_text(PROGRAM, encoding="utf-8")
    return path


def target(program: Path, mode: str = "ok", **options: Any) -> CommandTarget:
    env = {"MODE": mode, **options.pop("env", {})}
    options.setdefault("command", [PY, str(program)])
    options.setdefault("metrics", ["y"])
    built = build_target("command", {"env": env, **options})
    assert isinstance(built, CommandTarget)
    return built


# -- arguments and environment ---------------------------------------------------------
@pytest.mark.parametrize("value", HOSTILE)
def test_placeholder_and_env_values_reach_the_program_literally(
    program: Path, tmp_path: Path, value: str
) -> None:
    record = tmp_path / "record.json"
    command = [PY, str(program), "{text}", "--text={text}", "{{literal}}", "{n}", "{x}", "{b}"]
    with target(program, command=command, env={"RECORD": str(record)}) as t:
        outcome = t.run_trial({"text": value, "n": 42, "x": 0.1, "b": True})
    assert outcome.status is TrialStatus.COMPLETED, outcome.reason
    seen = json.loads(record.read_text(encoding="utf-8"))
    assert seen["argv"] == [value, f"--text={value}", "{literal}", "42", "0.1", "true"]
    assert seen["env"] == {
        "TUNER_TEXT": value,
        "TUNER_N": "42",
        "TUNER_X": "0.1",
        "TUNER_B": "true",
    }
    assert not (tmp_path / "pwned").exists() and not (Path.cwd() / "pwned").exists()


def test_knob_env_can_be_turned_off_and_workdir_is_used(program: Path, tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    work = tmp_path / "work"
    work.mkdir()
    t = target(program, env={"RECORD": str(record)}, knob_env=False, workdir=str(work))
    with t:
        assert t.run_trial({"level": 3}).status is TrialStatus.COMPLETED
    seen = json.loads(record.read_text(encoding="utf-8"))
    assert seen["env"] == {} and seen["cwd"] == str(work)


def test_env_names_of_knobs() -> None:
    assert env_name("shared_buffers") == "TUNER_SHARED_BUFFERS"
    assert env_name("gpu.sm-clock") == "TUNER_GPU_SM_CLOCK"


# -- metrics ---------------------------------------------------------------------------
def test_metrics_come_from_the_last_json_object_and_extras_are_kept(program: Path) -> None:
    with target(program) as t:
        outcome = t.run_trial({})
    assert outcome.status is TrialStatus.COMPLETED
    assert outcome.metrics == {"y": 1.5, "extra": 7.0}  # the text field is ignored
    with target(program, "pretty") as t:
        outcome = t.run_trial({})
    assert outcome.metrics == {"y": 2.5}


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("badjson", "stdout line 3: not valid JSON"),
        ("missing", "stdout line 1: metric 'y' is missing (the object has ['z'])"),
        ("nan", "stdout line 1: metric 'y' is nan, expected a finite number"),
        ("string", "stdout line 1: metric 'y' is 'fast', expected a finite number"),
        ("none", "no JSON object of metrics"),
    ],
)
def test_malformed_metric_output_is_a_failed_trial_naming_the_line(
    program: Path, mode: str, expected: str
) -> None:
    with target(program, mode) as t:
        outcome = t.run_trial({})
    assert outcome.status is TrialStatus.FAILED
    assert expected in outcome.reason


def test_parse_metrics_reports_the_offending_line_text() -> None:
    with pytest.raises(TargetError, match=r"stdout line 2: not valid JSON .*'\{\"y\": oops\}'"):
        parse_metrics('hello\n{"y": oops}\n', ["y"], "stdout")


def test_metrics_file_is_read_and_a_stale_one_never_counts(tmp_path: Path) -> None:
    writer = tmp_path / "writer.py"
    writer.write_text(
        "import json, os, sys\n"
        "if os.environ.get('WRITE') == '1':\n"
        "    json.dump({'y': float(sys.argv[1])}, open('m.json', 'w'))\n",
        encoding="utf-8",
    )
    options = {
        "command": [PY, str(writer), "{v}"],
        "metrics": ["y"],
        "metrics_file": "m.json",
        "workdir": str(tmp_path),
    }
    with build_target("command", {**options, "env": {"WRITE": "1"}}) as t:
        assert t.run_trial({"v": 4.0}).metrics == {"y": 4.0}
    with build_target("command", {**options, "env": {"WRITE": "0"}}) as t:
        outcome = t.run_trial({"v": 5.0})  # m.json of the last trial is still there
    assert outcome.status is TrialStatus.FAILED and "wrote no metrics file" in outcome.reason


# -- exit statuses ---------------------------------------------------------------------
def test_exit_statuses_map_to_failed_or_infeasible(program: Path) -> None:
    with target(program, "exit", env={"CODE": "2"}, infeasible_exit_codes=[3]) as t:
        failed = t.run_trial({})
    assert failed.status is TrialStatus.FAILED
    assert failed.reason == "exit status 2: went wrong"
    with target(program, "exit", env={"CODE": "3"}, infeasible_exit_codes=[3]) as t:
        infeasible = t.run_trial({})
    assert infeasible.status is TrialStatus.INFEASIBLE
    assert "exit status 3 (listed in target.infeasible_exit_codes)" in infeasible.reason
    with target(program, "signal") as t:
        killed = t.run_trial({})
    assert killed.status is TrialStatus.FAILED and killed.reason == "killed by SIGKILL"


def test_a_missing_program_is_a_failed_trial() -> None:
    with build_target("command", {"command": ["/no/such/program"], "metrics": ["y"]}) as t:
        outcome = t.run_trial({})
    assert outcome.status is TrialStatus.FAILED
    assert "cannot start '/no/such/program'" in outcome.reason


# -- timeouts and leftovers ------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_dead(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


SPAWNER = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    child = subprocess.Popen(["sleep", "60"])
    with open(sys.argv[1], "w") as f:
        f.write(str(child.pid))
    if sys.argv[2] == "hang":
        time.sleep(60)
    print(json.dumps({"y": 1}))
    """
)


@pytest.mark.parametrize("mode", ["hang", "exit"])
def test_timeout_kills_the_whole_group_and_leftovers_never_survive(
    tmp_path: Path, mode: str
) -> None:
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER, encoding="utf-8")
    pid_file = tmp_path / "child.pid"
    restored = tmp_path / "restored"
    options = {
        "command": [PY, str(script), str(pid_file), mode],
        "metrics": ["y"],
        "timeout_s": 1.5,
        "restore": [PY, "-c", f"open({str(restored)!r}, 'w').write('{{v}}')"],
    }
    started = time.monotonic()
    with build_target("command", options) as t:
        outcome = t.run_trial({"v": 7})
    elapsed = time.monotonic() - started
    child = int(pid_file.read_text())
    assert _wait_dead(child), "a process the command started outlived the trial"
    assert restored.read_text() == "7"  # restore ran, with the trial's value
    if mode == "hang":
        assert outcome.status is TrialStatus.TIMED_OUT
        assert "ran past timeout_s = 1.5 s; its process group was killed" in outcome.reason
        assert elapsed < 10
    else:  # exited at once with a child still holding stdout: no hang, child killed
        assert outcome.status is TrialStatus.COMPLETED and elapsed < 10


def test_restore_runs_after_every_outcome_and_its_failure_stops_the_session(
    program: Path, tmp_path: Path
) -> None:
    log = tmp_path / "restore.log"
    restore = [PY, "-c", f"open({str(log)!r}, 'a').write('{{level}} {{{{x}}}}' + chr(10))"]
    for mode in ("ok", "badjson", "exit"):
        with target(program, mode, env={"CODE": "1"}, restore=restore) as t:
            t.run_trial({"level": 5})
    assert log.read_text().splitlines() == ["5 {x}"] * 3
    broken = target(program, restore=[PY, "-c", "import sys; sys.exit(4)"])
    with broken as t, pytest.raises(TargetError, match=r"restore command .*: exit status 4"):
        t.run_trial({"level": 5})


def test_setup_and_teardown_run_once_and_teardown_runs_after_a_failed_setup(
    program: Path, tmp_path: Path
) -> None:
    log = tmp_path / "life.log"

    def step(word: str, code: int = 0) -> list[str]:
        return [PY, "-c", f"open({str(log)!r}, 'a').write({word!r} + chr(10)); exit({code})"]

    with target(program, setup=step("setup"), teardown=step("teardown")) as t:
        t.run_trial({})
        t.run_trial({})
    assert log.read_text().splitlines() == ["setup", "teardown"]
    log.unlink()
    failing = target(program, setup=step("setup", 1), teardown=step("teardown"))
    with pytest.raises(TargetError, match=r"setup command .*exit status 1"), failing:
        pass
    assert log.read_text().splitlines() == ["setup", "teardown"]


SESSION = textwrap.dedent(
    """
    import sys
    from targets.registry import build_target
    from targets.host.signals import terminate_on_sigterm
    pid_file, marker = sys.argv[1], sys.argv[2]
    sleeper = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    restore = "import sys; open(sys.argv[1], 'w').write('restored')"
    options = {
        "command": [sys.executable, "-c", sleeper, pid_file],
        "metrics": ["y"],
        "restore": [sys.executable, "-c", restore, marker],
    }
    with terminate_on_sigterm(), build_target("command", options) as target:
        target.run_trial({})
    """
)


def test_sigterm_during_a_trial_kills_the_program_and_still_restores(tmp_path: Path) -> None:
    pid_file, marker = tmp_path / "sleeper.pid", tmp_path / "restored"
    root = Path(__file__).resolve().parents[2]
    with subprocess.Popen(
        [PY, "-c", SESSION, str(pid_file), str(marker)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    ) as session:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        sleeper = int(pid_file.read_text())
        assert _alive(sleeper)
        session.send_signal(signal.SIGTERM)
        assert session.wait(timeout=20) == 128 + signal.SIGTERM
    assert _wait_dead(sleeper) and marker.read_text() == "restored"


# -- configuration errors ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"command": "python3 prog.py {x}", "metrics": ["y"]}, "target.command"),
        ({"metrics": ["y"]}, "target.command"),
        ({"command": [], "metrics": ["y"]}, "target.command"),
        ({"command": ["p", 3], "metrics": ["y"]}, "target.command[1]"),
        ({"command": ["p"], "metrics": []}, "target.metrics"),
        ({"command": ["p"], "metrics": ["y", "y"]}, "target.metrics"),
        ({"command": ["p"], "metrics": ["y", "two words"]}, "target.metrics[1]"),
        ({"command": ["p"], "metrics": ["y"], "timeout_s": 0}, "target.timeout_s"),
        (
            {"command": ["p"], "metrics": ["y"], "infeasible_exit_codes": [0]},
            "target.infeasible_exit_codes[0]",
        ),
        ({"command": ["p"], "metrics": ["y"], "setup": ["p", "{x}"]}, "target.setup[1]"),
        ({"command": ["p", "{x"], "metrics": ["y"]}, "target.command[1]"),
        ({"command": ["p"], "metrics": ["y"], "env": {"A B": "1"}}, "target.env.A B"),
        ({"command": ["p"], "metrics": ["y"], "knob_env": "yes"}, "target.knob_env"),
        (
            {"command": ["p"], "metrics": ["y"], "allow_dash_values": 1},
            "target.allow_dash_values",
        ),
        ({"command": ["p"], "metrics": ["y"], "workdir": "/no/such/dir"}, "target.workdir"),
        ({"command": ["p"], "metrics": ["y"], "shell": True}, "target.shell"),
    ],
)
def test_bad_options_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        build_target("command", options)
    assert info.value.field.startswith(field)


def study_config(command: list[str], knobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    study: dict[str, Any] = {"name": "cmd", "objectives": [{"name": "y", "goal": "maximize"}]}
    if knobs is not None:
        study["knobs"] = knobs
    return {"study": study, "target": {"kind": "command", "command": command, "metrics": ["y"]}}


def test_config_checks_placeholders_and_knob_list() -> None:
    knobs = [{"name": "level", "kind": "int", "low": 1, "high": 9}]
    parse_config(study_config(["p", "{level}"], knobs), {})
    with pytest.raises(ValidationError) as info:
        parse_config(study_config(["p", "--x={levl}"], knobs), {})
    assert info.value.field == "target.command[1]" and "'level'" in str(info.value)
    with pytest.raises(ValidationError) as info:
        parse_config(study_config(["p"], None), {})
    assert info.value.field == "study.knobs" and "no knob catalog" in str(info.value)
    clash = [*knobs, {"name": "LEVEL", "kind": "int", "low": 1, "high": 2}]
    with pytest.raises(ValidationError, match="share the variable TUNER_LEVEL"):
        parse_config(study_config(["p"], clash), {})
    wrong_metric = study_config(["p"], knobs)
    wrong_metric["study"]["objectives"] = [{"name": "z", "goal": "maximize"}]
    with pytest.raises(ValidationError) as info:
        parse_config(wrong_metric, {})
    assert info.value.field == "study.objectives[0].name"


# -- values that look like options -----------------------------------------------------
MODES = {"name": "mode", "kind": "categorical", "choices": ["fast", "--output=/tmp/x", "-"]}
DASH = {"name": "a", "kind": "categorical", "choices": ["x", "-"]}
OUTPUT = {"name": "b", "kind": "categorical", "choices": ["y", "-output=PWN"]}
EMPTY = {"name": "e", "kind": "categorical", "choices": ["", "z"]}


@pytest.mark.parametrize(
    ("command", "knobs", "refused"),
    [
        (["sort", "{mode}", "in.txt"], [MODES], "target.command[1]"),
        (["sort", "--mode={mode}"], [MODES], None),  # inside an option's argument
        (["sort", "--", "{mode}"], [MODES], None),  # after "--": an operand
        (["nice", "-n", "{n}", "p"], [{"name": "n", "kind": "int", "low": -5, "high": 5}], "[2]"),
        (["nice", "-n", "{n}", "p"], [{"name": "n", "kind": "int", "low": 0, "high": 5}], None),
        (["p", "{c}"], [{"name": "c", "kind": "categorical", "choices": ["a", "-", ""]}], None),
        (["sort", "{a}{b}", "in.txt"], [DASH, OUTPUT], "target.command[1]"),  # "--output=PWN"
        (["sort", "{a}x"], [DASH], "target.command[1]"),  # "-x"
        (["p", "{e}{b}"], [EMPTY, OUTPUT], "target.command[1]"),  # "" then "-output=PWN"
        (["p", "{e}-{b}"], [EMPTY, OUTPUT], None),  # the author's own dash
        (["p", "{n}{a}"], [{"name": "n", "kind": "int", "low": 0, "high": 5}, DASH], None),
    ],
)
def test_a_value_that_would_be_read_as_an_option_is_refused(
    command: list[str], knobs: list[dict[str, Any]], refused: str | None
) -> None:
    """``sort {mode}`` with ``mode = --output=/tmp/x`` would write that file: a study whose
    knob can take such a value at the start of an argument is refused, naming the argument
    and the ways out; ``allow_dash_values = true`` lets it through."""
    config = study_config(command, knobs)
    if refused is None:
        parse_config(config, {})
        return
    with pytest.raises(ValidationError) as info:
        parse_config(config, {})
    assert info.value.field.startswith("target.command") and info.value.field.endswith(refused)
    assert "read as an option" in str(info.value) and "allow_dash_values" in str(info.value)
    config["target"]["allow_dash_values"] = True
    parse_config(config, {})


def test_an_option_like_value_never_reaches_the_program_unless_allowed(
    program: Path, tmp_path: Path
) -> None:
    """Called directly (no study check), the target still refuses the value: the trial is
    INFEASIBLE with the reason, and the program does not run; with the opt-in it runs and
    gets the value as its argument."""
    record = tmp_path / "record.json"
    command = [PY, str(program), "{mode}"]
    with target(program, command=command, env={"RECORD": str(record)}) as t:
        outcome = t.run_trial({"mode": "--output=/tmp/x"})
    assert outcome.status is TrialStatus.INFEASIBLE
    assert "'--output=/tmp/x'" in outcome.reason and "as an option" in outcome.reason
    assert not record.exists()
    with target(program, command=command, env={"RECORD": str(record)}, allow_dash_values=True) as t:
        assert t.run_trial({"mode": "-r"}).status is TrialStatus.COMPLETED
    assert json.loads(record.read_text(encoding="utf-8"))["argv"] == ["-r"]


def test_placeholders_are_checked_on_the_rendered_argument(tmp_path: Path) -> None:
    """``sort {a}{b} in.txt`` with a = "-" and b = "-output=PWN" renders ``--output=PWN``,
    and sort writes that file: neither value alone starts an option, the rendered argument
    does. Called directly (no study check), the trial is INFEASIBLE and sort never runs;
    only the opt-in lets the argument through (and then sort writes PWN, so this command
    really is the danger the check is for)."""
    (tmp_path / "in.txt").write_text("b\na\n", encoding="utf-8")
    options = {"command": ["sort", "{a}{b}", "in.txt"], "metrics": ["y"], "workdir": str(tmp_path)}
    config = {"a": "-", "b": "-output=PWN"}
    with build_target("command", options) as t:
        outcome = t.run_trial(config)
    assert outcome.status is TrialStatus.INFEASIBLE, outcome
    assert "'--output=PWN'" in outcome.reason and "as an option" in outcome.reason
    assert "knob 'a'" in outcome.reason
    assert not (tmp_path / "PWN").exists()
    with build_target("command", {**options, "allow_dash_values": True}) as t:
        t.run_trial(config)  # FAILED: sort prints no metrics, but it wrote the file
    assert (tmp_path / "PWN").read_text(encoding="utf-8") == "a\nb\n"


# -- progress lines ----------------------------------------------------------------------
WINDOWED = textwrap.dedent(
    """\
    import json, sys, time
    for i in range(8):
        print(f"window {i}: tps={100 + i} lat=2.5", flush=True)
        time.sleep(0.15)
    print(json.dumps({"tps": 103.5, "lat": 2.5}))
    """
)


def test_progress_lines_are_windows_and_a_stop_kills_the_run(tmp_path: Path) -> None:
    program = tmp_path / "windowed.py"
    program.write_text(WINDOWED, encoding="utf-8")
    options = {"command": [PY, str(program)], "metrics": ["tps", "lat"],
               "progress": r"tps=(?P<tps>[0-9.]+) lat=(?P<lat>[0-9.]+)"}  # fmt: skip
    heard: list[dict[str, float]] = []

    def stop_at_three(window: dict[str, float]) -> str:
        heard.append(window)
        return "enough" if len(heard) == 3 else ""

    with build_target("command", options) as target:
        started = time.monotonic()
        stopped = target.run_trial({}, stop_at_three)
        took = time.monotonic() - started
        assert stopped.status is TrialStatus.EARLY_STOPPED and stopped.reason == "enough"
        assert stopped.metrics == {"tps": 101.0, "lat": 2.5}  # the three windows' means
        assert took < 8 * 0.15  # killed at the third window, not run to its end
        heard.clear()
        whole = target.run_trial({}, lambda window: heard.append(window) or "")
        assert whole.status is TrialStatus.COMPLETED and whole.metrics["tps"] == 103.5
        assert [w["tps"] for w in heard] == [100.0 + i for i in range(8)]
        unwatched = target.run_trial({})
        assert unwatched.status is TrialStatus.COMPLETED


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [("tps=[0-9]+", "no named group"), ("(?P<tps>[", "does not compile"),
     ("(?P<9x>1)", "does not compile"), ("", "got ''")],
)  # fmt: skip
def test_a_progress_pattern_is_checked_naming_the_field(pattern: str, fragment: str) -> None:
    with pytest.raises(ValidationError, match=rf"target\.progress.*{re.escape(fragment)}"):
        build_target("command", {"command": [PY, "-c", "0"], "metrics": ["y"],
                                 "progress": pattern})  # fmt: skip
