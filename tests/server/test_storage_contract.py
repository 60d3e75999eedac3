"""Conformance suite for ``server.storage.Storage``: every backend must pass all of it.

To run the suite against a new backend, add a factory to ``BACKENDS``; the ``storage``
fixture is parametrized over its keys. The PostgreSQL backend runs against a real server
(``conftest.postgres_url``: a new schema per test), skipped where PostgreSQL is missing.
Backend-specific behaviour (files, pragmas, migrations, replicas) is tested next to the
backend: ``test_sqlite_storage.py``, ``test_postgres_storage.py``.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.storage import (
    ROW_CHARS,
    FinishedTrial,
    LeaseLapsed,
    NewBatch,
    NewTrial,
    Request,
    SQLiteStorage,
    Storage,
    StoredSize,
)
from server.storage.postgres import PostgresStorage
from tuner.errors import (
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    StateError,
    StorageError,
    TakenError,
    ValidationError,
)
from tuner.study import StudySpec
from tuner.trial import Measurement, MeasurementKind, TrialStatus

BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Storage]] = {
    "sqlite": lambda _, tmp: SQLiteStorage(tmp / "tuner.db"),
    "postgresql": lambda request, _: PostgresStorage(request.getfixturevalue("postgres_url")),
}


@pytest.fixture(params=list(BACKENDS))
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    store = BACKENDS[request.param](request, tmp_path)
    yield store
    store.close()


def make_spec(name: str = "pg-oltp", seed: int = 0) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": name,
            "knobs": [
                {"name": "shared_buffers_mb", "kind": "int", "low": 16, "high": 8192},
                {"name": "random_page_cost", "kind": "float", "low": 1.0, "high": 8.0},
                {"name": "jit", "kind": "bool"},
                {"name": "wal_level", "kind": "categorical", "choices": ["minimal", "replica"]},
            ],
            "objectives": [{"name": "tps", "goal": "maximize"}],
            "outcome_constraints": ["p95_ms <= 20"],
            "designer": {"seed": seed},
        }
    )


CONFIG: dict[str, Any] = {
    "shared_buffers_mb": 128,
    "random_page_cost": 4.0,
    "jit": True,
    "wal_level": "replica",
}


def add_one(storage: Storage, study: str = "pg-oltp", **kwargs: Any) -> int:
    return storage.add_trials(study, [NewTrial(dict(CONFIG), **kwargs)])[0].id


def typed(config: dict[str, Any]) -> dict[str, tuple[type, str]]:
    """Values with their exact type and repr, so 1 != 1.0 != True and -0.0 != 0.0."""
    return {name: (type(value), repr(value)) for name, value in config.items()}


# -- studies ---------------------------------------------------------------------------
def test_created_study_reads_back_equal(storage: Storage) -> None:
    created = storage.create_study(make_spec())
    stored = storage.get_study("pg-oltp")
    assert stored == created
    assert stored.spec == make_spec()
    assert stored.spec.fingerprint() == make_spec().fingerprint()


@pytest.mark.parametrize(("seed", "fragment"), [(0, "the same spec"), (1, "a different spec")])
def test_creating_an_existing_name_raises_already_exists(
    storage: Storage, seed: int, fragment: str
) -> None:
    storage.create_study(make_spec())
    with pytest.raises(AlreadyExistsError, match=fragment):
        storage.create_study(make_spec(seed=seed))
    assert storage.get_study("pg-oltp").spec == make_spec()


def test_unknown_study_raises_not_found_naming_it(storage: Storage) -> None:
    with pytest.raises(NotFoundError, match="study 'nope' not found"):
        storage.get_study("nope")
    with pytest.raises(NotFoundError, match="'nope'"):
        storage.add_trials("nope", [NewTrial(dict(CONFIG))])
    with pytest.raises(NotFoundError, match="'nope'"):
        storage.list_trials("nope")


def test_studies_are_listed_in_creation_order(storage: Storage) -> None:
    for name in ("b-study", "a-study", "c-study"):
        storage.create_study(make_spec(name))
    studies = storage.list_studies()
    assert [s.name for s in studies] == ["b-study", "a-study", "c-study"]
    assert len({s.id for s in studies}) == 3


# -- adding and reading trials ------------------------------------------------------------
def test_trial_ids_count_from_one_per_study(storage: Storage) -> None:
    storage.create_study(make_spec("first"))
    storage.create_study(make_spec("second"))
    batch = [NewTrial(dict(CONFIG)), NewTrial(dict(CONFIG))]
    assert [t.id for t in storage.add_trials("first", batch)] == [1, 2]
    assert [t.id for t in storage.add_trials("second", batch[:1])] == [1]
    assert [t.id for t in storage.add_trials("first", batch[:1])] == [3]
    assert storage.add_trials("first", []) == []
    assert [t.id for t in storage.list_trials("first")] == [1, 2, 3]


def test_added_trials_read_back_as_returned(storage: Storage) -> None:
    storage.create_study(make_spec())
    new = NewTrial(dict(CONFIG), client_id="worker-1", source="sobol", warning="fell back to Sobol")
    (added,) = storage.add_trials("pg-oltp", [new])
    assert storage.get_trial("pg-oltp", added.id) == added
    assert (added.status, added.client_id, added.source, added.warning) == (
        TrialStatus.ACTIVE,
        "worker-1",
        "sobol",
        "fell back to Sobol",
    )
    assert added.metrics == {} and added.reason == ""
    assert 0 < added.created_at == added.updated_at


def test_parameter_values_keep_their_python_type(storage: Storage) -> None:
    storage.create_study(make_spec())
    config: dict[str, Any] = {
        "an_int": 1,
        "a_float": 1.0,
        "a_bool": True,
        "a_str": "1",
        "big_int": 2**70,
        "neg_zero": -0.0,
        "inexact": 0.1 + 0.2,
        "tiny": 5e-324,
        "unicode": "naïve ✓",
    }
    trial_id = storage.add_trials("pg-oltp", [NewTrial(config)])[0].id
    stored = storage.get_trial("pg-oltp", trial_id).config
    assert typed(stored) == typed(config)
    assert list(stored) == list(config)


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    config=st.dictionaries(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,20}", fullmatch=True),
        st.one_of(
            st.booleans(),
            st.integers(),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_any_scalar_config_round_trips_exactly(storage: Storage, config: dict[str, Any]) -> None:
    if not storage.list_studies():
        storage.create_study(make_spec())
    trial_id = storage.add_trials("pg-oltp", [NewTrial(config)])[0].id
    assert typed(storage.get_trial("pg-oltp", trial_id).config) == typed(config)


def test_unknown_trial_raises_not_found(storage: Storage) -> None:
    storage.create_study(make_spec())
    with pytest.raises(NotFoundError, match="trial 7 not found in study 'pg-oltp'"):
        storage.get_trial("pg-oltp", 7)
    with pytest.raises(NotFoundError, match="trial 7"):
        storage.finish_trial("pg-oltp", 7, TrialStatus.COMPLETED, {"tps": 1.0})
    with pytest.raises(NotFoundError, match="trial 7"):
        storage.trial_events("pg-oltp", 7)


def test_list_trials_filters_by_status_in_id_order(storage: Storage) -> None:
    storage.create_study(make_spec())
    for _ in range(4):
        add_one(storage)
    add_one(storage, status=TrialStatus.PENDING)
    storage.finish_trial("pg-oltp", 3, TrialStatus.COMPLETED, {"tps": 1.0})
    storage.finish_trial("pg-oltp", 1, TrialStatus.FAILED, {}, "host down")
    by_status = storage.list_trials("pg-oltp", [TrialStatus.COMPLETED, TrialStatus.FAILED])
    assert [t.id for t in by_status] == [1, 3]
    assert [t.id for t in storage.list_trials("pg-oltp", {TrialStatus.PENDING})] == [5]
    assert [t.id for t in storage.list_trials("pg-oltp")] == [1, 2, 3, 4, 5]
    assert storage.list_trials("pg-oltp", []) == []


def test_list_trials_rejects_unknown_status(storage: Storage) -> None:
    storage.create_study(make_spec())
    with pytest.raises(ValidationError, match="unknown trial status 'DONE'"):
        storage.list_trials("pg-oltp", ["DONE"])  # type: ignore[list-item]


def test_active_trials_are_the_clients_active_ones(storage: Storage) -> None:
    storage.create_study(make_spec())
    add_one(storage, client_id="a")
    add_one(storage, client_id="b")
    add_one(storage, client_id="a")
    add_one(storage, client_id="a", status=TrialStatus.PENDING)
    storage.finish_trial("pg-oltp", 1, TrialStatus.COMPLETED, {"tps": 2.0})
    assert [t.id for t in storage.active_trials("pg-oltp", "a")] == [3]
    assert [t.id for t in storage.active_trials("pg-oltp", "b")] == [2]
    assert storage.active_trials("pg-oltp", "c") == []


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"config": {"x": float("nan")}}, "config.x"),
        ({"config": {"x": [1, 2]}}, "config.x: got a list"),
        ({"config": {"x": None}}, "config.x"),
        ({"config": [("x", 1)]}, "config: must be a mapping"),
        ({"config": {"x": 1}, "status": TrialStatus.COMPLETED}, "cannot start as COMPLETED"),
        ({"config": {"x": 1}, "status": "RUNNING"}, "unknown trial status 'RUNNING'"),
        ({"config": {"x": 1}, "client_id": 3}, "trial.client_id: must be a string"),
    ],
)
def test_new_trial_rejects_bad_input(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        NewTrial(**kwargs)


def test_new_trial_keeps_its_own_copy_of_the_config() -> None:
    config: dict[str, Any] = {"x": 1}
    new = NewTrial(config)
    config["x"] = 2
    assert new.config == {"x": 1}


# -- finishing trials -----------------------------------------------------------------
def test_finish_records_status_metrics_reason_and_event(storage: Storage) -> None:
    storage.create_study(make_spec())
    trial_id = add_one(storage)
    done = storage.finish_trial(
        "pg-oltp", trial_id, TrialStatus.COMPLETED, {"tps": 1200, "p95_ms": 12.5}, "measured"
    )
    assert done.status is TrialStatus.COMPLETED
    assert done.metrics == {"tps": 1200.0, "p95_ms": 12.5}
    assert all(type(v) is float for v in done.metrics.values())
    assert done.reason == "measured"
    assert done.updated_at >= done.created_at
    assert storage.get_trial("pg-oltp", trial_id) == done
    last = storage.trial_events("pg-oltp", trial_id)[-1]
    assert (last.event, last.detail) == ("status:COMPLETED", "from ACTIVE: measured")


def test_finishing_a_finished_trial_raises_state_error(storage: Storage) -> None:
    storage.create_study(make_spec())
    trial_id = add_one(storage)
    done = storage.finish_trial("pg-oltp", trial_id, TrialStatus.COMPLETED, {"tps": 1.0})
    with pytest.raises(StateError, match="is COMPLETED and cannot become FAILED"):
        storage.finish_trial("pg-oltp", trial_id, TrialStatus.FAILED, {"tps": 9.0}, "late")
    assert storage.get_trial("pg-oltp", trial_id) == done
    assert len(storage.trial_events("pg-oltp", trial_id)) == 2


def test_pending_trial_can_start_or_finish_directly(storage: Storage) -> None:
    storage.create_study(make_spec())
    queued = add_one(storage, status=TrialStatus.PENDING)
    started = add_one(storage, status=TrialStatus.PENDING)
    # a queued trial measured elsewhere is completed without ever being ACTIVE
    done = storage.finish_trial("pg-oltp", queued, TrialStatus.COMPLETED, {"tps": 1.0})
    assert done.status is TrialStatus.COMPLETED
    storage.finish_trial("pg-oltp", started, TrialStatus.ACTIVE, {})
    done = storage.finish_trial("pg-oltp", started, TrialStatus.COMPLETED, {"tps": 2.0})
    assert done.status is TrialStatus.COMPLETED
    with pytest.raises(StateError, match="is COMPLETED and cannot become ACTIVE"):
        storage.finish_trial("pg-oltp", started, TrialStatus.ACTIVE, {})


@pytest.mark.parametrize(
    ("metrics", "fragment"),
    [
        ({"tps": math.nan}, "metrics.tps"),
        ({"tps": 1.0, "p95_ms": math.inf}, "metrics.p95_ms"),
        ({"tps": -math.inf}, "metrics.tps"),
        ({"tps": True}, "metrics.tps"),
        ({"tps": "fast"}, "metrics.tps"),
        ({"tps": 10**400}, "metrics.tps"),
        ({"": 1.0}, "metric names must be non-empty strings"),
    ],
)
def test_bad_metrics_are_rejected_and_nothing_is_stored(
    storage: Storage, metrics: dict[str, Any], fragment: str
) -> None:
    storage.create_study(make_spec())
    trial_id = add_one(storage)
    before = storage.get_trial("pg-oltp", trial_id)
    with pytest.raises(ValidationError, match=fragment):
        storage.finish_trial("pg-oltp", trial_id, TrialStatus.COMPLETED, metrics)
    assert storage.get_trial("pg-oltp", trial_id) == before


def test_concurrent_reports_for_one_trial_finish_it_once(storage: Storage) -> None:
    storage.create_study(make_spec())
    trial_id = add_one(storage)
    barrier = threading.Barrier(8)

    def report(n: int) -> str:
        barrier.wait()
        try:
            storage.finish_trial("pg-oltp", trial_id, TrialStatus.COMPLETED, {"tps": float(n)})
        except StateError:
            return "refused"
        return "finished"

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(report, range(8)))
    assert sorted(outcomes) == ["finished"] + ["refused"] * 7
    events = [e.event for e in storage.trial_events("pg-oltp", trial_id)]
    assert events == ["created", "status:COMPLETED"]


# -- events ---------------------------------------------------------------------------
def test_events_are_kept_in_order(storage: Storage) -> None:
    storage.create_study(make_spec())
    trial_id = add_one(storage, client_id="w1")
    recorded = storage.add_trial_event("pg-oltp", trial_id, "reoffered", "to 'w1'")
    events = storage.trial_events("pg-oltp", trial_id)
    assert [e.event for e in events] == ["created", "reoffered"]
    assert events[-1] == recorded
    assert events[0].trial_id == trial_id and "w1" in events[0].detail


def test_the_last_event_of_a_name_is_found_across_trials(storage: Storage) -> None:
    storage.create_study(make_spec())
    first, second = add_one(storage), add_one(storage)
    assert storage.last_event("pg-oltp", "ranked_best") is None
    storage.add_trial_event("pg-oltp", second, "ranked_best", "a")
    storage.add_trial_event("pg-oltp", first, "ranked_best", "b")
    storage.add_trial_event("pg-oltp", second, "reoffered", "c")
    last = storage.last_event("pg-oltp", "ranked_best")
    assert last is not None and (last.trial_id, last.detail) == (first, "b")
    with pytest.raises(NotFoundError, match="nope"):
        storage.last_event("nope", "ranked_best")


def test_event_needs_a_name_and_a_known_trial(storage: Storage) -> None:
    storage.create_study(make_spec())
    trial_id = add_one(storage)
    with pytest.raises(ValidationError, match="event: must be a non-empty string"):
        storage.add_trial_event("pg-oltp", trial_id, "")
    with pytest.raises(NotFoundError, match="trial 99"):
        storage.add_trial_event("pg-oltp", 99, "reoffered")


# -- concurrency and lifecycle ----------------------------------------------------------
def test_concurrent_add_trials_never_duplicate_ids(storage: Storage) -> None:
    storage.create_study(make_spec())
    barrier = threading.Barrier(8)

    def add_batches(_: int) -> list[int]:
        barrier.wait()
        ids: list[int] = []
        for _ in range(10):
            batch = [NewTrial(dict(CONFIG)) for _ in range(3)]
            ids += [t.id for t in storage.add_trials("pg-oltp", batch)]
        return ids

    with ThreadPoolExecutor(8) as pool:
        per_thread = list(pool.map(add_batches, range(8)))
    all_ids = [i for ids in per_thread for i in ids]
    assert sorted(all_ids) == list(range(1, 241))
    assert [t.id for t in storage.list_trials("pg-oltp")] == list(range(1, 241))


def test_closed_storage_raises_storage_error(storage: Storage) -> None:
    storage.create_study(make_spec())
    storage.close()
    storage.close()
    with pytest.raises(StorageError, match="closed"):
        storage.get_study("pg-oltp")


# -- leases ------------------------------------------------------------------------------
def test_expired_leases_are_given_up_once_and_re_offered_in_one_step(storage: Storage) -> None:
    storage.create_study(make_spec())
    stale = add_one(storage, client_id="w1", lease_expires_at=100.0)
    fresh = add_one(storage, client_id="w2", lease_expires_at=300.0)
    unleased = add_one(storage, client_id="w3")
    [expired] = storage.expire_leases("pg-oltp", 200.0, TrialStatus.ABANDONED, reoffer=True)
    assert expired.id == stale and expired.status is TrialStatus.ABANDONED
    assert expired.expired_at == 200.0 and expired.reoffered_as == unleased + 1
    copy = storage.get_trial("pg-oltp", unleased + 1)
    assert copy.status is TrialStatus.PENDING and typed(copy.config) == typed(CONFIG)
    assert storage.expire_leases("pg-oltp", 200.0, TrialStatus.ABANDONED, reoffer=True) == []
    for other in (fresh, unleased):
        assert storage.get_trial("pg-oltp", other).status is TrialStatus.ACTIVE
    [claimed] = storage.claim_trials("pg-oltp", "w4", 5, lease_expires_at=500.0)
    assert claimed.id == copy.id and claimed.client_id == "w4"
    assert claimed.status is TrialStatus.ACTIVE and claimed.lease_expires_at == 500.0
    assert storage.claim_trials("pg-oltp", "w5", 5, lease_expires_at=None) == []


def test_a_lease_is_renewed_only_while_the_trial_is_active(storage: Storage) -> None:
    storage.create_study(make_spec())
    trial_id = add_one(storage, client_id="w1", lease_expires_at=100.0)
    assert storage.renew_lease("pg-oltp", trial_id, 250.0).lease_expires_at == 250.0
    storage.expire_leases("pg-oltp", 300.0, TrialStatus.FAILED, reoffer=False)
    with pytest.raises(StateError, match="lease expired"):
        storage.renew_lease("pg-oltp", trial_id, 400.0)
    late = storage.finish_trial("pg-oltp", trial_id, TrialStatus.COMPLETED, {"tps": 1.0})
    assert late.reported_late and late.status is TrialStatus.COMPLETED
    with pytest.raises(StateError):
        storage.finish_trial("pg-oltp", trial_id, TrialStatus.COMPLETED, {"tps": 2.0})
    with pytest.raises(NotFoundError):
        storage.renew_lease("pg-oltp", 99, 400.0)


def test_a_late_result_drops_its_untaken_re_offer_and_leaves_a_taken_one(
    storage: Storage,
) -> None:
    storage.create_study(make_spec())
    first = add_one(storage, client_id="w1", lease_expires_at=100.0)
    second = add_one(storage, client_id="w2", lease_expires_at=100.0)
    storage.expire_leases("pg-oltp", 200.0, TrialStatus.ABANDONED, reoffer=True)
    copy_1, copy_2 = (storage.get_trial("pg-oltp", i).reoffered_as for i in (first, second))
    assert copy_1 is not None and copy_2 is not None
    [taken] = storage.claim_trials("pg-oltp", "w3", 1, None)  # the older copy is taken
    assert taken.id == copy_1
    for late in (first, second):
        storage.finish_trial("pg-oltp", late, TrialStatus.COMPLETED, {"tps": 1.0})
    assert storage.get_trial("pg-oltp", copy_1).status is TrialStatus.ACTIVE
    dropped = storage.get_trial("pg-oltp", copy_2)
    assert dropped.status is TrialStatus.ABANDONED
    assert dropped.reason == f"not needed: trial {second} reported its result late"
    events = [(e.event, e.detail) for e in storage.trial_events("pg-oltp", copy_2)]
    assert events[-1] == ("status:ABANDONED", f"from PENDING: {dropped.reason}")
    assert [e.event for e in storage.trial_events("pg-oltp", copy_1)].count("status:ABANDONED") == 0


def test_a_result_after_its_unexpired_lease_ran_out_is_refused_with_nothing_written(
    storage: Storage,
) -> None:
    storage.create_study(make_spec())
    trial_id = add_one(storage, client_id="w1", lease_expires_at=100.0)
    before = storage.trial_events("pg-oltp", trial_id)
    with pytest.raises(LeaseLapsed):
        storage.finish_trial(
            "pg-oltp", trial_id, TrialStatus.COMPLETED, {"tps": 1.0}, holder="w1", due=100.5
        )
    kept = storage.get_trial("pg-oltp", trial_id)
    assert kept.status is TrialStatus.ACTIVE and kept.metrics == {}
    assert storage.trial_events("pg-oltp", trial_id) == before
    # once expired, the same result is a late one; before its lease ends, an ordinary one
    storage.expire_leases("pg-oltp", 100.5, TrialStatus.ABANDONED, reoffer=False)
    late = storage.finish_trial(
        "pg-oltp", trial_id, TrialStatus.COMPLETED, {"tps": 1.0}, holder="w1", due=100.5
    )
    assert late.reported_late and late.metrics == {"tps": 1.0}
    timely = add_one(storage, client_id="w1", lease_expires_at=100.0)
    done = storage.finish_trial(
        "pg-oltp", timely, TrialStatus.COMPLETED, {"tps": 2.0}, holder="w1", due=99.0
    )
    assert done.status is TrialStatus.COMPLETED and not done.reported_late


def test_measurements_are_kept_in_order_for_finished_trials_only(storage: Storage) -> None:
    storage.create_study(make_spec())
    trial_id = add_one(storage)
    repeats = [Measurement({"tps": v}, MeasurementKind.REPEAT, at=10.0 + v) for v in (1, 2)]
    with pytest.raises(StateError, match="only a finished trial"):
        storage.add_measurements("pg-oltp", trial_id, repeats)
    done = storage.finish_trial(
        "pg-oltp", trial_id, TrialStatus.COMPLETED, {"tps": 1.5}, measurements=repeats,
        spread={"tps": 0.5},
    )  # fmt: skip
    assert done.repeats == 2 and done.spread == {"tps": 0.5}
    control = Measurement({"tps": 3.0}, MeasurementKind.CONTROL)
    [stored] = storage.add_measurements("pg-oltp", trial_id, [control])
    assert stored.trial_id == trial_id and stored.at > 0
    listed = storage.list_measurements("pg-oltp")
    assert [(m.kind, m.metrics) for m in listed] == [
        (MeasurementKind.REPEAT, {"tps": 1.0}),
        (MeasurementKind.REPEAT, {"tps": 2.0}),
        (MeasurementKind.CONTROL, {"tps": 3.0}),
    ]
    assert storage.list_measurements("pg-oltp", kinds=[MeasurementKind.CONTROL]) == [stored]
    assert storage.list_measurements("pg-oltp", trial_id, kinds=[]) == []
    with pytest.raises(NotFoundError):
        storage.list_measurements("pg-oltp", 99)


def test_an_active_trial_takes_windows_in_progress_and_may_end_early_stopped(
    storage: Storage,
) -> None:
    """Windows of a measurement in progress (PROGRESS) go to an ACTIVE trial only, and on
    their own; the trial then ends EARLY_STOPPED with what the part that ran measured."""
    storage.create_study(make_spec())
    trial_id = add_one(storage)
    windows = [Measurement({"tps": v}, MeasurementKind.PROGRESS, round=i) for i, v in
               enumerate((10.0, 12.0), start=1)]  # fmt: skip
    stored = storage.add_measurements("pg-oltp", trial_id, windows)
    assert [(m.kind, m.round, m.metrics) for m in stored] == [
        (MeasurementKind.PROGRESS, 1, {"tps": 10.0}),
        (MeasurementKind.PROGRESS, 2, {"tps": 12.0}),
    ]
    control = Measurement({"tps": 3.0}, MeasurementKind.CONTROL)
    with pytest.raises(StateError, match="and alone"):
        storage.add_measurements("pg-oltp", trial_id, [windows[0], control])
    done = storage.finish_trial(
        "pg-oltp", trial_id, TrialStatus.EARLY_STOPPED, {"tps": 11.0},
        "stopped early after 2 windows",
    )  # fmt: skip
    assert (done.status, done.metrics) == (TrialStatus.EARLY_STOPPED, {"tps": 11.0})
    assert done.windows == 2 == storage.get_trial("pg-oltp", trial_id).windows  # its fidelity
    other = add_one(storage)  # measured in one piece: no windows
    assert storage.finish_trial("pg-oltp", other, TrialStatus.COMPLETED, {"tps": 9.0}).windows == 0
    with pytest.raises(StateError, match="only an ACTIVE trial"):
        storage.add_measurements("pg-oltp", trial_id, windows[:1])
    kinds = [MeasurementKind.PROGRESS]
    assert len(storage.list_measurements("pg-oltp", trial_id, kinds=kinds)) == 2


# -- request ids ---------------------------------------------------------------------------
def test_only_the_holder_finishes_or_renews_a_trial_and_a_refusal_writes_nothing(
    storage: Storage,
) -> None:
    storage.create_study(make_spec())
    held = add_one(storage, client_id="w1", lease_expires_at=100.0)
    anyone = add_one(storage)  # handed out anonymously: anyone's
    before = storage.get_trial("pg-oltp", held)
    for holder in ("w2", ""):
        with pytest.raises(PermissionDeniedError, match=r"handed to client 'w1', not '"):
            storage.finish_trial(
                "pg-oltp", held, TrialStatus.COMPLETED, {"tps": 1.0}, holder=holder
            )
        with pytest.raises(PermissionDeniedError, match="only that client may renew it"):
            storage.renew_lease("pg-oltp", held, 500.0, holder=holder)
    assert storage.get_trial("pg-oltp", held) == before
    assert len(storage.trial_events("pg-oltp", held)) == 1
    assert storage.renew_lease("pg-oltp", held, 500.0, holder="w1").lease_expires_at == 500.0
    done = storage.finish_trial("pg-oltp", held, TrialStatus.COMPLETED, {"tps": 1.0}, holder="w1")
    assert done.status is TrialStatus.COMPLETED
    # a finished trial is a StateError for anyone (a retry learns what became of it)
    with pytest.raises(StateError, match="is COMPLETED"):
        storage.finish_trial("pg-oltp", held, TrialStatus.COMPLETED, {"tps": 2.0}, holder="w2")
    assert storage.finish_trial(
        "pg-oltp", anyone, TrialStatus.COMPLETED, {"tps": 3.0}, holder="w9"
    ).metrics == {"tps": 3.0}
    with pytest.raises(NotFoundError, match="trial 99"):
        storage.finish_trial("pg-oltp", 99, TrialStatus.COMPLETED, {"tps": 1.0}, holder="w1")


def test_expiring_leases_of_an_unknown_study_raises_not_found(storage: Storage) -> None:
    with pytest.raises(NotFoundError, match="study 'nope' not found"):
        storage.expire_leases("nope", 1.0, TrialStatus.ABANDONED, reoffer=True)


def test_a_request_is_recorded_with_its_write_and_found_again(storage: Storage) -> None:
    storage.create_study(make_spec())
    storage.create_study(make_spec("other"))
    first = add_one(storage)
    ask = Request("req-1", "SuggestTrials", "d1")
    added = storage.add_trials("pg-oltp", [NewTrial(dict(CONFIG))], ask, answered=[first])
    assert storage.find_request("pg-oltp", "req-1") == Request(
        "req-1", "SuggestTrials", "d1", (first, added[0].id)
    )
    tell = Request("req-2", "CompleteTrial", "d2")
    storage.finish_trial("pg-oltp", first, TrialStatus.COMPLETED, {"tps": 1.0}, request=tell)
    assert storage.find_request("pg-oltp", "req-2") == Request(
        "req-2", "CompleteTrial", "d2", (first,)
    )
    assert storage.find_request("pg-oltp", "req-3") is None
    with pytest.raises(ValidationError) as caught:
        storage.find_request("other", "req-1")
    assert caught.value.field == "request_id"
    # a write that fails records nothing: the retry runs it again
    with pytest.raises(StateError):
        storage.finish_trial(
            "pg-oltp", first, TrialStatus.FAILED, {}, "x", request=Request("req-4", "C", "d")
        )
    assert storage.find_request("pg-oltp", "req-4") is None
    # measurements: the request answers with their ids, which list them again
    added = storage.add_measurements(
        "pg-oltp", first, [Measurement({"tps": 2.0}, MeasurementKind.CONTROL)] * 2,
        request=Request("req-5", "AddMeasurements", "d5"),
    )  # fmt: skip
    known = storage.find_request("pg-oltp", "req-5")
    assert known is not None and len(known.answer_ids) == 2
    assert storage.list_measurements("pg-oltp", ids=known.answer_ids) == added
    assert storage.list_measurements("pg-oltp", ids=[]) == []
    with pytest.raises(AlreadyExistsError):
        storage.add_measurements(
            "pg-oltp", first, [Measurement({"tps": 9.0}, MeasurementKind.CONTROL)],
            request=Request("req-5", "AddMeasurements", "d5"),
        )  # fmt: skip
    assert len(storage.list_measurements("pg-oltp", first)) == 2


def test_a_result_returns_the_trial_as_stored_and_a_taken_request_stores_none_of_it(
    storage: Storage,
) -> None:
    """``finish_trial`` sends its writes and the trial's read-back together (PostgreSQL: in
    one round trip): what it returns is what a later read finds, and when its request id
    turns out to be taken, none of its writes stays."""
    storage.create_study(make_spec())
    first, second = add_one(storage), add_one(storage)
    done = storage.finish_trial(
        "pg-oltp", first, TrialStatus.COMPLETED, {"tps": 3.5, "p95_ms": 2.0}, "ok",
        request=Request("req-1", "CompleteTrial", "d1"), spread={"tps": 0.5},
    )  # fmt: skip
    assert done == storage.get_trial("pg-oltp", first)
    assert done.config == CONFIG and done.metrics == {"tps": 3.5, "p95_ms": 2.0}
    assert done.status is TrialStatus.COMPLETED and done.spread == {"tps": 0.5}
    before = storage.get_trial("pg-oltp", second), storage.trial_events("pg-oltp", second)
    with pytest.raises(AlreadyExistsError, match="req-1"):
        storage.finish_trial(
            "pg-oltp", second, TrialStatus.COMPLETED, {"tps": 9.0},
            request=Request("req-1", "CompleteTrial", "d1"),
        )  # fmt: skip
    assert (storage.get_trial("pg-oltp", second), storage.trial_events("pg-oltp", second)) == before
    assert before[0].status is TrialStatus.ACTIVE and before[0].metrics == {}
    with pytest.raises(NotFoundError, match="'nowhere'"):
        storage.finish_trial("nowhere", first, TrialStatus.COMPLETED, {"tps": 1.0})
    with pytest.raises(NotFoundError, match="trial 99 not found"):
        storage.finish_trial("pg-oltp", 99, TrialStatus.COMPLETED, {"tps": 1.0})


def test_one_designer_runs_batches_are_stored_together_and_a_taken_request_stores_nothing(
    storage: Storage,
) -> None:
    storage.create_study(make_spec())
    held = add_one(storage)
    storage.add_trials("pg-oltp", [], Request("taken", "SuggestTrials", "d0"))  # answered first
    batches = [
        NewBatch([NewTrial(dict(CONFIG), client_id="a")] * 2, Request("r-a", "SuggestTrials", "d")),
        NewBatch([NewTrial(dict(CONFIG), client_id="b")], Request("taken", "SuggestTrials", "d")),
        NewBatch([NewTrial(dict(CONFIG), client_id="c")], None, answered=[held]),
        NewBatch([], Request("r-d", "SuggestTrials", "d"), answered=[held]),
    ]
    a, b, c, d = storage.add_trial_batches("pg-oltp", batches)
    assert b is None  # another call recorded "taken": none of b's trials is stored
    assert a is not None and c is not None and d == []
    assert [t.id for t in a] == [held + 1, held + 2] and [t.client_id for t in a] == ["a", "a"]
    assert [t.id for t in c] == [held + 3] and c[0].client_id == "c"
    assert [t.id for t in storage.list_trials("pg-oltp")] == [held, held + 1, held + 2, held + 3]
    assert storage.find_request("pg-oltp", "r-a") == Request(
        "r-a", "SuggestTrials", "d", (held + 1, held + 2)
    )
    assert storage.find_request("pg-oltp", "r-d") == Request("r-d", "SuggestTrials", "d", (held,))
    with pytest.raises(ValidationError, match=r"batches\[1\]\.trials\[0\]"):
        storage.add_trial_batches("pg-oltp", [NewBatch([]), NewBatch(["x"])])  # type: ignore[list-item]
    with pytest.raises(NotFoundError):
        storage.add_trial_batches("nope", [NewBatch([NewTrial(dict(CONFIG))])])


# -- pages and sizes ------------------------------------------------------------------------
def test_listings_take_a_cursor_and_a_limit(storage: Storage) -> None:
    """What the paged RPCs read: trials after an id, studies and measurements from an
    offset, at most a limit of them; the same on every backend."""
    for name in ("pg-oltp", "b-study", "c-study"):
        storage.create_study(make_spec(name))
    for _ in range(5):
        add_one(storage)
    for trial_id in (2, 4):
        storage.finish_trial(
            "pg-oltp", trial_id, TrialStatus.COMPLETED, {"tps": 1.0, "p95_ms": 2.0}
        )
    assert [t.id for t in storage.list_trials("pg-oltp", after=2, limit=2)] == [3, 4]
    assert [t.id for t in storage.list_trials("pg-oltp", after=4)] == [5]
    assert storage.list_trials("pg-oltp", after=5, limit=3) == []
    done = storage.list_trials("pg-oltp", [TrialStatus.COMPLETED], after=2, limit=1)
    assert [t.id for t in done] == [4] and done[0].metrics == {"tps": 1.0, "p95_ms": 2.0}
    assert storage.list_trials("pg-oltp", after=0, limit=2)[1].config == CONFIG
    assert [s.name for s in storage.list_studies(1, 1)] == ["b-study"]
    assert [s.name for s in storage.list_studies(2)] == ["c-study"]
    assert storage.list_studies(0, 0) == []
    kinds = [MeasurementKind.CONTROL, MeasurementKind.CONFIRM, MeasurementKind.CONTROL]
    storage.add_measurements(
        "pg-oltp", 2, [Measurement({"tps": float(i)}, kind) for i, kind in enumerate(kinds)]
    )
    page = storage.list_measurements("pg-oltp", offset=1, limit=1)
    assert [m.metrics["tps"] for m in page] == [1.0]
    assert [m.metrics["tps"] for m in storage.list_measurements("pg-oltp", offset=2)] == [2.0]
    controls = storage.list_measurements("pg-oltp", 2, [MeasurementKind.CONTROL], offset=1)
    assert [m.metrics["tps"] for m in controls] == [2.0]
    with pytest.raises(ValidationError, match="offset"):
        storage.list_studies(-1)


def test_stored_size_counts_what_a_study_holds_alike_on_every_backend(storage: Storage) -> None:
    """Every text the study's rows hold, in characters (a non-ASCII client counts its
    characters, not its bytes, on both), and ROW_CHARS a row; and its unfinished trials."""
    spec = make_spec()
    storage.create_study(spec)
    total = len(json.dumps(spec.to_dict(), allow_nan=False))
    assert storage.stored_size("pg-oltp") == StoredSize(total, 0)
    add_one(storage, client_id="wörker")
    total += len("wörker") + len("[]") + len("{}") + len("[]") + ROW_CHARS  # the trial's row
    total += sum(len(name) + len(json.dumps(v)) + ROW_CHARS for name, v in CONFIG.items())
    total += len("created") + len("ACTIVE, client 'wörker'") + ROW_CHARS  # its event
    assert storage.stored_size("pg-oltp") == StoredSize(total, 1)
    storage.finish_trial("pg-oltp", 1, TrialStatus.COMPLETED, {"tps": 1.0, "p95_ms": 2.0})
    total += len("tps") + len("p95_ms") + 2 * ROW_CHARS
    total += len("status:COMPLETED") + len("from ACTIVE") + ROW_CHARS
    assert storage.stored_size("pg-oltp") == StoredSize(total, 0)
    storage.add_measurements("pg-oltp", 1, [Measurement({"tps": 1.5}, MeasurementKind.CONTROL)])
    total += len(json.dumps({"tps": 1.5})) + ROW_CHARS
    assert storage.stored_size("pg-oltp") == StoredSize(total, 0)
    with pytest.raises(NotFoundError, match="'nope'"):
        storage.stored_size("nope")


def test_a_trial_keeps_its_transfer_weights_alike_on_every_backend(storage: Storage) -> None:
    """What each transfer source weighed in a suggestion (``Trial.transfer``) reads back as
    stored, through finishing and re-offering; bad weights are refused by name."""
    storage.create_study(make_spec())
    weights = (("", 0.25), ("src-tpcc", 0.7), ("ycsb é", 0.05))
    trial_id = add_one(storage, transfer=weights)
    assert storage.get_trial("pg-oltp", trial_id).transfer == weights
    done = storage.finish_trial(
        "pg-oltp", trial_id, TrialStatus.COMPLETED, {"tps": 1.0, "p95_ms": 2.0}
    )
    assert done.transfer == weights == storage.list_trials("pg-oltp")[0].transfer
    assert storage.get_trial("pg-oltp", add_one(storage)).transfer == ()
    cases = [
        ((("a", 1.5),), "trial.transfer[0].weight"),
        ((("a",),), "trial.transfer[0]"),
        (((3, 0.5),), "trial.transfer[0].source"),
    ]
    for bad, field in cases:
        with pytest.raises(ValidationError) as raised:
            NewTrial(dict(CONFIG), transfer=bad)  # type: ignore[arg-type]
        assert raised.value.field == field


# -- configurations stored meanwhile ----------------------------------------------------------
def keyed(key: str, **kwargs: Any) -> NewTrial:
    return NewTrial(dict(CONFIG), key=key, **kwargs)


def test_a_configuration_stored_after_the_history_it_was_chosen_from_is_refused(
    storage: Storage,
) -> None:
    """Two writers chose from the same history (up to trial 1): the second to store a
    configuration is refused and stores nothing, naming the trial that holds it."""
    storage.create_study(make_spec())
    storage.add_trials("pg-oltp", [keyed("k0")])
    storage.add_trials("pg-oltp", [keyed("k1"), keyed("k2")], since=1)  # the first writer
    request = Request("r-late", "SuggestTrials", "d")
    with pytest.raises(TakenError, match=r"trials 3, after trial 1") as caught:
        storage.add_trials("pg-oltp", [keyed("k9"), keyed("k2")], request, since=1)
    assert caught.value.trial_ids == (3,)
    assert [t.id for t in storage.list_trials("pg-oltp")] == [1, 2, 3]
    assert storage.find_request("pg-oltp", "r-late") is None
    [fresh] = storage.add_trials("pg-oltp", [keyed("k9")], request, since=1)  # a new one
    assert fresh.id == 4 and storage.find_request("pg-oltp", "r-late") is not None


def test_a_configuration_the_writer_saw_may_be_stored_again(storage: Storage) -> None:
    """Trials up to ``since`` are not compared: a FAILED configuration the designer retries
    on purpose, or a trial without ``since`` (no history), is stored."""
    storage.create_study(make_spec())
    [failed] = storage.add_trials("pg-oltp", [keyed("k0")])
    storage.finish_trial("pg-oltp", failed.id, TrialStatus.FAILED, {}, "crashed")
    [again] = storage.add_trials("pg-oltp", [keyed("k0")], since=failed.id)
    [unchecked] = storage.add_trials("pg-oltp", [keyed("k0")])
    [unkeyed] = storage.add_trials("pg-oltp", [NewTrial(dict(CONFIG))], since=failed.id)
    assert (again.id, unchecked.id, unkeyed.id) == (2, 3, 4)


def test_a_re_offer_and_an_import_keep_the_configuration_key(storage: Storage) -> None:
    storage.create_study(make_spec())
    [held] = storage.add_trials("pg-oltp", [keyed("k0", client_id="w1", lease_expires_at=1.0)])
    [expired] = storage.expire_leases("pg-oltp", 2.0, TrialStatus.ABANDONED, reoffer=True)
    storage.import_trials("pg-oltp", [FinishedTrial(dict(CONFIG), TrialStatus.FAILED,
                                                    reason="elsewhere", key="k1")])  # fmt: skip
    for key, holder in (("k0", expired.reoffered_as), ("k1", 3)):
        with pytest.raises(TakenError) as caught:
            storage.add_trials("pg-oltp", [keyed(key)], since=held.id)
        assert caught.value.trial_ids == (holder,)


def test_of_writers_racing_with_one_configuration_exactly_one_stores_it(
    storage: Storage,
) -> None:
    storage.create_study(make_spec())

    def store(i: int) -> str:
        try:
            storage.add_trials("pg-oltp", [keyed("same", client_id=f"w{i}")], since=0)
        except TakenError:
            return "taken"
        return "stored"

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = sorted(pool.map(store, range(8)))
    assert outcomes == ["stored"] + ["taken"] * 7
    assert len(storage.list_trials("pg-oltp")) == 1
