"""``tuner create``/``ask``/``tell``: a shell script drives a study over gRPC or a local file."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.main import main
from server.app import build_server, stop_server
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.trial import TrialStatus

HOSTILE = "a b; echo pwned $(id) `id` 'q' \"q\" \\\n*"
STUDY = """
[study]
name = "shell"
objectives = [{ name = "y", goal = "maximize" }]
[study.designer]
seed = 3
initial_trials = 2
[[study.knobs]]
name = "level"
kind = "int"
low = 1
high = 9
[[study.knobs]]
name = "mode"
kind = "categorical"
choices = ["plain", '''@HOSTILE@''']
[[study.knobs]]
name = "fast"
kind = "bool"
""".replace("@HOSTILE@", HOSTILE)


@pytest.fixture
def study_file(tmp_path: Path) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(STUDY, encoding="utf-8")
    return path


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[list[str], SQLiteStorage]]:
    storage = SQLiteStorage(tmp_path / "server.db")
    service = TuningService(storage)
    grpc_server, port = build_server(service, "127.0.0.1", 0)
    grpc_server.start()
    try:
        yield ["--server", f"127.0.0.1:{port}"], storage
    finally:
        stop_server(grpc_server, 1).wait()
        storage.close()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_ask_and_tell_over_grpc(
    study_file: Path,
    server: tuple[list[str], SQLiteStorage],
    capsys: pytest.CaptureFixture[str],
) -> None:
    where, storage = server
    code, out, _ = run(capsys, "create", str(study_file), *where)
    assert code == 0 and out.startswith("study shell created 3 knobs")
    assert run(capsys, "create", str(study_file), *where)[1].startswith("study shell exists")
    code, out, _ = run(capsys, "ask", "shell", *where, "--client-id", "w1")
    asked = json.loads(out)
    assert code == 0 and asked["study"] == "shell"
    assert set(asked["config"]) == {"level", "mode", "fast"}
    # a retried ask of the same caller gets the same trial; another caller a new one
    assert json.loads(run(capsys, "ask", "shell", *where, "--client-id", "w1")[1]) == asked
    other = json.loads(run(capsys, "ask", "shell", *where, "--client-id", "w2")[1])
    assert other["trial"] != asked["trial"]
    # only the caller a trial was handed to may tell it (an operator may override)
    code, _, err = run(capsys, "tell", "shell", str(asked["trial"]), "--metric", "y=2.5", *where)
    assert code == 1 and "PermissionDeniedError" in err and "'w1'" in err
    w1, w2 = ("--client-id", "w1"), ("--client-id", "w2")
    code, _, err = run(capsys, "heartbeat", "shell", str(asked["trial"]), *where, *w2)
    assert code == 1 and "PermissionDeniedError" in err
    code, out, _ = run(
        capsys, "tell", "shell", str(asked["trial"]), "--metric", "y=2.5", *where, *w1
    )
    assert (code, out.strip()) == (0, f"trial {asked['trial']} COMPLETED")
    code, out, _ = run(
        capsys, "tell", "shell", str(other["trial"]), "--infeasible", "OOM", *where,
        "--override-holder",
    )  # fmt: skip
    assert (code, out.strip()) == (0, f"trial {other['trial']} INFEASIBLE")
    stored = {t.id: t for t in storage.list_trials("shell")}
    assert stored[asked["trial"]].metrics == {"y": 2.5}
    assert stored[asked["trial"]].config == asked["config"]
    assert stored[other["trial"]].status is TrialStatus.INFEASIBLE
    assert stored[other["trial"]].reason == "OOM"
    # telling a finished trial again is refused and changes nothing
    code, _, err = run(capsys, "tell", "shell", str(asked["trial"]), "--metric", "y=9", *where, *w1)
    assert code == 1 and "StateError" in err
    assert storage.get_trial("shell", asked["trial"]).metrics == {"y": 2.5}


def _bash(script: str, text: str) -> str:
    done = subprocess.run(
        ["bash", "-c", script, "_", text], capture_output=True, text=True, check=True
    )
    return done.stdout


def test_env_and_args_formats_eval_safely_in_bash(
    study_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--db", str(tmp_path / "local.db")]
    assert run(capsys, "create", str(study_file), *where)[0] == 0
    seen_hostile = False
    for _ in range(8):  # until the hostile choice has come up in both formats
        code, env_out, _ = run(capsys, "ask", "shell", *where, "--format", "env")
        assert code == 0
        values = _bash(
            'eval "$1"; printf "%s\\0" "$TUNER_STUDY" "$TUNER_TRIAL_ID" '
            '"$TUNER_LEVEL" "$TUNER_MODE" "$TUNER_FAST"',
            env_out,
        ).split("\0")[:-1]
        trial = int(values[1])
        with SQLiteStorage(tmp_path / "local.db", read_only=True) as storage:
            stored = storage.get_trial("shell", trial).config
        assert values == [
            "shell",
            str(trial),
            str(stored["level"]),
            stored["mode"],
            "true" if stored["fast"] else "false",
        ]
        code, args_out, _ = run(capsys, "ask", "shell", *where, "--format", "args")
        words = _bash('eval "set -- $1"; printf "%s\\0" "$@"', args_out).split("\0")[:-1]
        trial2 = int(words[0])
        with SQLiteStorage(tmp_path / "local.db", read_only=True) as storage:
            stored2 = storage.get_trial("shell", trial2).config
        assert sorted(words[1:]) == sorted(
            [
                f"--level={stored2['level']}",
                f"--mode={stored2['mode']}",
                f"--fast={'true' if stored2['fast'] else 'false'}",
            ]
        )
        seen_hostile |= HOSTILE in (stored["mode"], stored2["mode"])
        for t in (trial, trial2):
            assert run(capsys, "tell", "shell", str(t), "--metric", f"y={t}", *where)[0] == 0
        if seen_hostile:
            break
    assert seen_hostile, "the hostile choice never came up"
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--metric", "y=fast"], "--metric 'y=fast': 'fast' is not a finite number"),
        (["--metric", "y=nan"], "'nan' is not a finite number"),
        (["--metric", "y"], "--metric 'y': expected NAME=VALUE"),
        (["--metric", "y=1", "--metric", "y=2"], "metric 'y' given twice"),
        (["--metric", "y=1", "--failed", "disk"], "tell takes metrics"),
        ([], "tell takes metrics"),
    ],
)
def test_tell_usage_errors_exit_2_naming_the_problem(
    study_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    where = ["--db", str(tmp_path / "local.db")]
    run(capsys, "create", str(study_file), *where)
    trial = json.loads(run(capsys, "ask", "shell", *where)[1])["trial"]
    code, out, err = run(capsys, "tell", "shell", str(trial), *extra, *where)
    assert code == 2 and message in err and out == ""
    with SQLiteStorage(tmp_path / "local.db", read_only=True) as storage:
        assert storage.get_trial("shell", trial).status is TrialStatus.ACTIVE


def test_request_errors_exit_1(
    study_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--db", str(tmp_path / "local.db")]
    run(capsys, "create", str(study_file), *where)
    code, _, err = run(capsys, "ask", "nosuch", *where)
    assert code == 1 and "NotFoundError" in err
    trial = json.loads(run(capsys, "ask", "shell", *where)[1])["trial"]
    code, _, err = run(capsys, "tell", "shell", str(trial), "--metric", "z=1", *where)
    assert code == 1 and "metrics.y: is missing" in err
    assert err.count("\n") == 1  # one line, unwrapped, for scripts
    code, _, err = run(capsys, "tell", "shell", "999", "--metric", "y=1", *where)
    assert code == 1 and "NotFoundError" in err
    no_knobs = tmp_path / "bad.toml"
    no_knobs.write_text('[study]\nname = "x"\nobjectives = [{ name = "y" }]\n')
    code, _, err = run(capsys, "create", str(no_knobs), *where)
    assert code == 1 and "study.knobs" in err


def test_a_script_renews_its_lease_with_tuner_heartbeat(
    study_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from server.service import LeasePolicy

    storage = SQLiteStorage(tmp_path / "leased.db")
    service = TuningService(storage, leases=LeasePolicy(600.0))
    grpc_server, port = build_server(service, "127.0.0.1", 0)
    grpc_server.start()
    where = ["--server", f"127.0.0.1:{port}"]
    try:
        run(capsys, "create", str(study_file), *where)
        trial = json.loads(run(capsys, "ask", "shell", *where)[1])["trial"]
        code, out, _ = run(capsys, "heartbeat", "shell", str(trial), *where)
        assert code == 0 and out.startswith(f"trial {trial} is ACTIVE; lease until 20")
        run(capsys, "tell", "shell", str(trial), "--metric", "y=1", *where)
        code, _, err = run(capsys, "heartbeat", "shell", str(trial), *where)
        assert code == 1 and "COMPLETED" in err and "not ACTIVE" in err
    finally:
        stop_server(grpc_server, 1).wait()
        storage.close()


def test_create_again_keeps_the_rule_an_older_study_was_created_with(
    study_file: Path,
    server: tuple[list[str], SQLiteStorage],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A study created before the default confirmation rule became ``sequential`` stores no
    rule (the fixed one): ``tuner create`` of the same config, naming no rule, finds it and
    says which rule it keeps, where one naming a different rule fails, naming the field."""
    from dataclasses import replace

    from runner.config import load_study
    from tuner.study import StoppingSettings

    where, storage = server
    spec, given = load_study(study_file)
    assert spec.stopping.sequential and not given
    TuningService(storage).create_study(replace(spec, stopping=StoppingSettings()))
    code, out, _ = run(capsys, "create", str(study_file), *where)
    assert code == 0 and "keeps the fixed confirmation rule" in " ".join(out.split())
    assert "study shell exists with the same spec" in out
    assert not storage.get_study("shell").spec.stopping.sequential
    named = study_file.with_name("named.toml")
    named.write_text(STUDY + '[study.stopping]\nconfirm = "sequential"\n', encoding="utf-8")
    code, _, err = run(capsys, "create", str(named), *where)
    assert code == 1 and "stopping" in err
