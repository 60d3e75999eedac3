"""Writers sharing one database never store one configuration twice.

Two services on one database (two connections to one SQLite file, or two to one
PostgreSQL database: what two ``tuner tune`` sessions or two server replicas are) read
the same trials at the same moment and choose from them: without a check both would
store the default, the same Sobol point, the same random draw, the same BO candidate.
Each designer here is the real one, held (``Lockstep``) until the other service has read
the same history, so the race happens every time. Then the same with real processes:
two ``tuner tune`` sessions on one SQLite file. (Two ``tuner serve`` replicas on one
PostgreSQL database under load: ``test_replicas.py``.)
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from server.records import ImportedTrial
from server.service import TuningService
from server.storage import SQLiteStorage, Storage
from server.storage.postgres import PostgresStorage
from server.suggest import InlineDesigner
from tuner.designer import FitCache, Suggestion
from tuner.errors import OverloadedError
from tuner.study import StudySpec
from tuner.transfer import SourceStudy
from tuner.trial import StepKind, Trial, TrialStatus

ROOT = Path(__file__).resolve().parents[2]


def spec(algorithm: str, name: str = "shared") -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": [
                {"name": "x", "kind": "float", "low": 0.0, "high": 1.0, "default": 0.5},
                {"name": "n", "kind": "int", "low": 1, "high": 1000, "default": 4},
            ],
            "objectives": [{"name": "y", "goal": "minimize"}],
            "designer": {"algorithm": algorithm, "seed": 7, "initial_trials": 3},
        }
    )


class Lockstep(InlineDesigner):
    """The real designer; its first run waits until the other service's first run has
    read the same trials too (``barrier``). Records the salt of every run."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier
        self.salts: list[int] = []

    def propose(
        self,
        spec: StudySpec,
        trials: Sequence[Trial],
        count: int,
        cache: FitCache,
        salt: int = 0,
        sources: Sequence[SourceStudy] = (),
    ) -> list[Suggestion]:
        self.salts.append(salt)
        if len(self.salts) == 1:
            self.barrier.wait(60)
        salted = [salt] if salt else []
        return super().propose(spec, trials, count, cache, *salted, sources=sources)


Opener = Callable[[], Storage]


@pytest.fixture(params=["sqlite", "postgresql"])
def open_shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens another connection to one database each call."""
    opened: list[Storage] = []

    def open_one() -> Storage:
        if request.param == "sqlite":
            store: Storage = SQLiteStorage(tmp_path / "shared.db")
        else:
            store = PostgresStorage(request.getfixturevalue("postgres_url"))
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        store.close()


def in_threads(*calls: Callable[[], list[Trial]]) -> list[list[Trial]]:
    answers: list[list[Trial]] = [[] for _ in calls]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            answers[i] = calls[i]()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return answers


def distinct(trials: Sequence[Trial]) -> int:
    return len({tuple(sorted(t.config.items())) for t in trials})


@pytest.mark.parametrize("algorithm", ["sobol", "random"])
def test_two_writers_choosing_from_one_history_store_different_configurations(
    open_shared: Opener, algorithm: str
) -> None:
    barrier = threading.Barrier(2)
    designers = [Lockstep(barrier), Lockstep(barrier)]
    a, b = (TuningService(open_shared(), designer=d) for d in designers)
    a.create_study(spec(algorithm))
    first, second = in_threads(
        lambda: a.suggest_trials("shared", 3, client_id="a"),
        lambda: b.suggest_trials("shared", 3, client_id="b"),
    )
    trials = a.list_trials("shared")
    assert len(trials) == 6 and distinct(trials) == 6
    assert Counter(t.step for t in trials)[StepKind.DEFAULT] == 1
    assert {t.client_id for t in first} == {"a"} and {t.client_id for t in second} == {"b"}
    # the writer that lost the race chose again, with a salt of its own
    assert sorted(len(d.salts) for d in designers) == [1, 2]
    assert sorted(d.salts[-1] != 0 for d in designers) == [False, True]


def test_two_writers_choosing_one_bo_candidate_store_it_once(open_shared: Opener) -> None:
    barrier = threading.Barrier(2)
    designers = [Lockstep(barrier), Lockstep(barrier)]
    a, b = (TuningService(open_shared(), designer=d) for d in designers)
    a.create_study(spec("bo"))
    measured = [
        ImportedTrial({"x": x, "n": n}, TrialStatus.COMPLETED, {"y": (x - 0.3) ** 2 + n / 1e3})
        for x, n in ((0.5, 4), (0.1, 800), (0.9, 300), (0.4, 60))
    ]
    a.import_trials("shared", measured)
    first, second = in_threads(
        lambda: a.suggest_trials("shared", 1, client_id="a"),
        lambda: b.suggest_trials("shared", 1, client_id="b"),
    )
    assert first[0].step.model_based and second[0].step.model_based
    assert first[0].config != second[0].config
    assert distinct(a.list_trials("shared")) == 6


def test_a_failed_configuration_allowed_a_retry_is_still_suggested_again(
    open_shared: Opener,
) -> None:
    """``retry_failed``: the designer re-suggests a FAILED configuration on purpose; the
    check compares only what was stored after the history it chose from."""
    retried = StudySpec.from_dict({**spec("sobol").to_dict(), "designer": {
        "algorithm": "sobol", "seed": 7, "retry_failed": 1}})  # fmt: skip
    service = TuningService(open_shared())
    service.create_study(retried)
    (default,) = service.suggest_trials("shared", 1, client_id="w")
    service.complete_trial("shared", default.id, status=TrialStatus.FAILED, reason="flaky")
    (again,) = service.suggest_trials("shared", 1, client_id="w")
    assert again.step is StepKind.DEFAULT and again.config == default.config


def test_a_writer_that_keeps_losing_the_race_is_refused_as_overloaded(
    open_shared: Opener,
) -> None:
    """Another writer stores every configuration this one chooses, just before it: after
    ``MAX_TAKEN_RETRIES`` more runs the call is RESOURCE_EXHAUSTED, storing nothing."""
    from server.service import MAX_TAKEN_RETRIES
    from server.storage import NewTrial
    from tuner.config_key import config_key, key_text

    rival = open_shared()

    class Outrun(InlineDesigner):
        runs = 0

        def propose(self, spec: StudySpec, *args: Any, **kwargs: Any) -> list[Suggestion]:
            chosen = super().propose(spec, *args, **kwargs)
            Outrun.runs += 1
            rival.add_trials(spec.name, [
                NewTrial(s.config, key=key_text(config_key(spec.space, s.config)))
                for s in chosen
            ])  # fmt: skip
            return chosen

    service = TuningService(open_shared(), designer=Outrun())
    service.create_study(spec("sobol"))
    with pytest.raises(OverloadedError, match="other writers stored") as caught:
        service.suggest_trials("shared", 2, client_id="w")
    assert caught.value.retry_after_s > 0
    assert Outrun.runs == MAX_TAKEN_RETRIES + 1
    trials = service.list_trials("shared")
    assert len(trials) == 2 * Outrun.runs and not [t for t in trials if t.client_id == "w"]


SESSION = """
[study]
name = "shared"
objectives = [{{ name = "ops", goal = "maximize" }}]
[[study.knobs]]
name = "x"
kind = "float"
low = 0.0
high = 1.0
default = 0.5
[[study.knobs]]
name = "n"
kind = "int"
low = 1
high = 1000
default = 4
[study.designer]
algorithm = "sobol"
seed = 3
[target]
kind = "command"
command = ["{python}", "-c", "import json, sys; print(json.dumps(dict(ops=float(sys.argv[1]))))",
           "{{x}}"]
metrics = ["ops"]
[session]
db = "{db}"
trials = 8
"""


def test_two_tune_sessions_on_one_file_measure_every_configuration_once(
    tmp_path: Path,
) -> None:
    """Both sessions start at once, read the empty study and suggest its default while the
    designer loads (seconds): one of them stores it, the other suggests again."""
    db = tmp_path / "shared.db"
    config = tmp_path / "shared.toml"
    config.write_text(SESSION.format(python=sys.executable, db=db))
    argv = [sys.executable, "-m", "cli.main", "tune", str(config), "--confirm", "0"]
    sessions = [
        subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [s.communicate(timeout=300)[0].decode() for s in sessions]
    assert [s.returncode for s in sessions] == [0, 0], outputs
    with SQLiteStorage(db, read_only=True) as storage:
        trials = storage.list_trials("shared")
    assert len(trials) >= 8 and all(t.status is TrialStatus.COMPLETED for t in trials)
    assert distinct(trials) == len(trials), [t.config for t in trials]
    assert [t.step for t in trials].count(StepKind.DEFAULT) == 1
