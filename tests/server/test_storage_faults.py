"""Fault injection on the server's database: deleted, replaced or unwritable while serving,
or unwritable from the start. The server must notice (file identity, a write probe), turn
NOT_SERVING, and acknowledge nothing it cannot keep.

A file is made unwritable with ``chattr +i`` when running as root (root ignores file
modes) and with ``chmod 0444`` otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server.app import serve
from server.client import TunerClient
from server.storage import SQLiteStorage
from tuner.errors import StorageError
from tuner.space import FloatKnob, SearchSpace
from tuner.study import DesignerSettings, Goal, Objective, StudySpec
from tuner.trial import TrialStatus

REPO = Path(__file__).resolve().parents[2]


def spec(name: str = "s") -> StudySpec:
    return StudySpec(
        name=name,
        space=SearchSpace((FloatKnob("x", low=0.0, high=1.0),)),
        objectives=(Objective("y", Goal.MAXIMIZE),),
        designer=DesignerSettings(algorithm="sobol", seed=1, start_with_default=False),
    )


def unwritable(db: Path) -> Callable[[], None]:
    """Make the database and its WAL (where commits go first) unwritable, even through the
    server's open files: ``chattr +i``, which needs root and a file system that has it;
    returns the undo, and skips the test where that is impossible (a file's mode does not
    reach files already open)."""
    paths = [p for p in (db, db.with_name(db.name + "-wal")) if p.exists()]
    if os.geteuid() != 0:
        pytest.skip("only root can make a file that is open unwritable (chattr +i)")
    done = subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True, check=False)
    if done.returncode != 0 or _writes(db):
        pytest.skip(f"cannot make a file unwritable here: {done.stderr!r}")
    return lambda: subprocess.run(["chattr", "-i", *map(str, paths)], check=True)


def _writes(path: Path) -> bool:
    try:
        with path.open("ab"):
            return True
    except OSError:
        return False


class Served:
    """``serve`` in a thread, on port 0, found through its port file."""

    def __init__(self, db: Path) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        port_file = db.with_suffix(".port")
        self.thread = threading.Thread(
            target=self._run, args=(db, port_file), name="serve", daemon=True
        )
        self.thread.start()
        end = time.monotonic() + 60
        while not port_file.exists():
            assert not self.errors, self.errors
            assert time.monotonic() < end, "the server never wrote its port file"
            time.sleep(0.05)
        self.target = f"127.0.0.1:{port_file.read_text().strip()}"
        self.channel = grpc.insecure_channel(self.target)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def _run(self, db: Path, port_file: Path) -> None:
        try:
            serve(db, port=0, stop=self.stop, port_file=port_file, suggest_workers=0)
        except BaseException as error:
            self.errors.append(error)

    def status(self) -> int:
        return self.health.Check(health_pb2.HealthCheckRequest(), timeout=5).status

    def wait_status(self, status: int, within: float = 10.0) -> None:
        end = time.monotonic() + within
        while self.status() != status:
            assert time.monotonic() < end, f"health never became {status}"
            time.sleep(0.1)

    def close(self) -> None:
        self.channel.close()
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    db = tmp_path / "tuner.db"
    server = Served(db)
    yield server, db
    server.close()


def rescued(db: Path) -> SQLiteStorage:
    (found,) = db.parent.glob(f"{db.name}.rescued-*")
    return SQLiteStorage(found)


def test_a_deleted_database_turns_the_server_not_serving_and_every_write_fails(
    served: tuple[Served, Path],
) -> None:
    """What was acknowledged before the file went is saved from the open connection."""
    server, db = served
    with TunerClient(server.target, retry_for=0) as client:
        client.create_study(spec())
        first, second = client.suggest_trials("s", 2, "w")
        client.complete_trial("s", first.id, {"y": 1.0})
        assert server.status() == SERVING
        db.unlink()
        with pytest.raises(StorageError, match=r"was deleted while in use.*saved in .*rescued"):
            client.complete_trial("s", second.id, {"y": 2.0})
        with pytest.raises(StorageError, match="was deleted"):
            client.suggest_trials("s", 1, "v")
        with pytest.raises(StorageError, match="was deleted"):
            client.list_trials("s")
    server.wait_status(NOT_SERVING)
    with rescued(db) as saved:
        kept = {t.id: t for t in saved.list_trials("s")}
    assert kept[first.id].metrics == {"y": 1.0}, "the acknowledged completion is kept"
    assert kept[second.id].status is TrialStatus.ACTIVE, "the refused one was not stored"


def test_a_replaced_database_is_refused(served: tuple[Served, Path], tmp_path: Path) -> None:
    server, db = served
    other = tmp_path / "other.db"
    with SQLiteStorage(other) as storage:
        storage.create_study(spec("elsewhere"))
    with TunerClient(server.target, retry_for=0) as client:
        client.create_study(spec())
        (trial,) = client.suggest_trials("s", 1, "w")
        shutil.copyfile(other, tmp_path / "swap.db")
        os.replace(tmp_path / "swap.db", db)
        with pytest.raises(StorageError, match="was replaced by another file"):
            client.complete_trial("s", trial.id, {"y": 1.0})
    server.wait_status(NOT_SERVING)
    server.close()
    with SQLiteStorage(db, read_only=True) as now, rescued(db) as saved:
        assert [s.spec.name for s in now.list_studies()] == ["elsewhere"], (
            "the new file is untouched (the old WAL, matched by name, was moved aside)"
        )
        assert [t.id for t in saved.list_trials("s")] == [trial.id]


def test_a_database_that_becomes_unwritable_turns_not_serving_until_it_is_writable(
    served: tuple[Served, Path],
) -> None:
    server, db = served
    with TunerClient(server.target, retry_for=0) as client:
        client.create_study(spec())
        (trial,) = client.suggest_trials("s", 1, "w")
        undo = unwritable(db)
        try:
            server.wait_status(NOT_SERVING)
            with pytest.raises(StorageError):
                client.complete_trial("s", trial.id, {"y": 1.0})
        finally:
            undo()
        server.wait_status(SERVING)
        done = client.complete_trial("s", trial.id, {"y": 1.0})
        assert done.metrics == {"y": 1.0}


def test_a_server_refuses_to_start_on_an_unwritable_database(tmp_path: Path) -> None:
    db = tmp_path / "tuner.db"
    with SQLiteStorage(db) as storage:
        storage.create_study(spec())
    undo = unwritable(db)
    try:
        with pytest.raises(StorageError, match=r"readonly|read-only|read only"):
            serve(db, port=0, stop=threading.Event(), suggest_workers=0)
    finally:
        undo()


def test_tuner_serve_prints_its_address_and_writes_its_port_file(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    tuner = Path(sys.executable).with_name("tuner")
    process = subprocess.Popen(
        [str(tuner), "serve", "--db", str(tmp_path / "t.db"), "--port", "0",
         "--port-file", str(port_file), "--suggest-workers", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        address = process.stdout.readline().strip()
        port = port_file.read_text().strip()
        assert address == f"127.0.0.1:{port}"
        with TunerClient(address) as client:
            client.wait_ready(30)
            assert client.list_studies() == []
    finally:
        process.terminate()
        process.wait(30)
        process.stdout.close()


# -- a restart on a lost database's path ------------------------------------------------------
class ServeProcess:
    """``tuner serve --db DB`` in a process of its own, on port 0 (read from its port file)."""

    def __init__(self, db: Path, *flags: str) -> None:
        stamp = time.monotonic_ns()
        self.port_file, self.log = db.with_name(f"port-{stamp}"), db.with_name(f"log-{stamp}")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "serve", "--db", str(db), "--port", "0",
                 "--port-file", str(self.port_file), "--suggest-workers", "0", *flags],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def target(self) -> str:
        """The address, once serving."""
        end = time.monotonic() + 120
        while not self.port_file.exists():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < end, "the server never wrote its port file"
            time.sleep(0.1)
        return f"127.0.0.1:{self.port_file.read_text().strip()}"

    def refusal(self) -> str:
        """What the server said when it refused to start (it must exit 1, not serve)."""
        end = time.monotonic() + 120
        while self.proc.poll() is None:
            assert not self.port_file.exists(), f"it started serving: {self.output()}"
            assert time.monotonic() < end, "it neither served nor exited"
            time.sleep(0.1)
        assert self.proc.returncode == 1, self.output()
        return self.output()

    def stop(self) -> None:
        self.proc.terminate()
        assert self.proc.wait(timeout=60) == 0, self.output()

    def output(self) -> str:
        """What it printed, its whitespace (rich's line breaks) made single spaces."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)
        return " ".join(self.log.read_text().split())


def lose(db: Path, target: str, replace_with: Path | None = None) -> Path:
    """Delete the database under a running server (or put ``replace_with`` in its place)
    and wait for the server to notice: NOT_SERVING, the rescued copy made."""
    if replace_with is None:
        db.unlink()
    else:
        os.replace(replace_with, db)
    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        end = time.monotonic() + 30
        while health.Check(health_pb2.HealthCheckRequest(), timeout=5).status != NOT_SERVING:
            assert time.monotonic() < end, "the server never noticed"
            time.sleep(0.2)
    (copy,) = db.parent.glob(f"{db.name}.rescued-*")
    return copy


def test_a_restart_on_a_deleted_database_names_the_copy_and_starts_empty_only_when_asked(
    tmp_path: Path,
) -> None:
    db = tmp_path / "tuner.db"
    server = ServeProcess(db)
    with TunerClient(server.target(), retry_for=0) as client:
        client.create_study(spec())
    copy = lose(db, server.target())
    server.stop()

    said = ServeProcess(db).refusal()
    assert f"{db} does not exist, but {copy} beside it holds the database" in said
    assert "--new-database" in said and f"--db {copy}" in said
    assert not db.exists(), "no empty database was made in its place"

    server = ServeProcess(db, "--new-database")
    with TunerClient(server.target(), retry_for=0) as client:
        assert client.list_studies() == []
    server.stop()
    server = ServeProcess(db)  # the copy was set aside: no need to say it again
    with TunerClient(server.target(), retry_for=0) as client:
        assert client.list_studies() == []
    server.stop()
    with SQLiteStorage(copy, read_only=True) as saved:
        assert [s.name for s in saved.list_studies()] == ["s"]


def test_a_restart_on_a_replaced_database_refuses_until_the_copy_is_put_back(
    tmp_path: Path,
) -> None:
    db, other = tmp_path / "tuner.db", tmp_path / "other.db"
    with SQLiteStorage(other) as storage:
        storage.create_study(spec("elsewhere"))
    server = ServeProcess(db)
    with TunerClient(server.target(), retry_for=0) as client:
        client.create_study(spec())
    copy = lose(db, server.target(), replace_with=other)
    server.stop()

    said = ServeProcess(db).refusal()
    assert f"{db} is not the database a server had open there: {copy} holds that one" in said
    assert "--new-database" in said

    shutil.copyfile(copy, db)  # the same database back (its copy stays beside it)
    server = ServeProcess(db)
    with TunerClient(server.target(), retry_for=0) as client:
        assert [s.spec.name for s in client.list_studies()] == ["s"]
    server.stop()


def test_a_tune_session_on_a_deleted_database_refuses_and_starts_anew_when_asked(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs" / "tuner.db"
    db.parent.mkdir()
    storage = SQLiteStorage(db)
    db.unlink()
    with pytest.raises(StorageError, match="saved in"):
        storage.check()  # what a running session or server does: the copy is made
    storage.close()
    (copy,) = db.parent.glob("tuner.db.rescued-*")
    config = tmp_path / "s.toml"
    config.write_text(SESSION.format(python=sys.executable, db=db))
    argv = [sys.executable, "-m", "cli.main", "tune", str(config), "--confirm", "0"]
    refused = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1
    said = " ".join(refused.stderr.split() + refused.stdout.split())
    assert f"{db} does not exist, but {copy}" in said and "--new-database" in said
    assert not db.exists()
    ran = subprocess.run([*argv, "--new-database"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    with SQLiteStorage(db, read_only=True) as fresh:
        assert len(fresh.list_trials("s")) == 2


SESSION = """
[study]
name = "s"
objectives = [{{ name = "ops", goal = "maximize" }}]
[[study.knobs]]
name = "x"
kind = "float"
low = 0.0
high = 1.0
[target]
kind = "command"
command = ["{python}", "-c", "import json, sys; print(json.dumps(dict(ops=float(sys.argv[1]))))",
           "{{x}}"]
metrics = ["ops"]
[session]
db = "{db}"
trials = 2
"""
