"""Tests for the PostgreSQL target on real throwaway clusters (scale 1, one-second windows).

Tests that need PostgreSQL's programs skip, naming the system package, where they are
absent; ``scripts/system_packages.sh`` installs it. The rest (options, value formatting,
host clamps, pgbench output parsing) run everywhere.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from knobs.loader import load_catalog
from targets.db.postgres import tools as postgres_tools
from targets.db.postgres.cluster import Setting
from targets.db.postgres.host_knobs import Host, conf_line, resolve_knobs, same
from targets.db.postgres.pgbench import (
    Workload,
    WorkloadResultError,
    parse_summary,
    read_latencies,
    summarize,
)
from targets.db.postgres.target import PostgresTarget
from targets.db.postgres.tools import DIR_PREFIX, find_tools, reap_orphans
from tuner.errors import StateError, TargetError, ValidationError
from tuner.space import CategoricalKnob, Config, IntKnob, Knob
from tuner.trial import TrialStatus

ROOT = Path(__file__).resolve().parents[2]


def _installed() -> bool:
    try:
        find_tools()
    except TargetError:
        return False
    return True


needs_postgres = pytest.mark.skipif(
    not _installed(),
    reason="system package postgresql is not installed (initdb, postgres, pgbench)",
)
SMALL: dict[str, Any] = {"scale": 1, "clients": 2, "threads": 1, "warmup_s": 0, "measure_s": 1}
FEW = ["shared_buffers", "work_mem", "random_page_cost", "enable_seqscan"]

# knob, value, what pg_settings.setting must then show
ROUND_TRIPS: list[tuple[str, Any, str]] = [
    ("shared_buffers", 32768, "32768"),
    ("wal_buffers", -1, "512"),  # auto: 1/32 of the default 16384 shared_buffers
    ("wal_buffers", 64, "64"),
    ("max_connections", 20, "20"),
    ("work_mem", 65536, "65536"),
    ("effective_cache_size", 131072, "131072"),
    ("max_wal_size", 2048, "2048"),
    ("checkpoint_timeout", 60, "60"),
    ("random_page_cost", 1.1, "1.1"),
    ("cpu_operator_cost", 0.0001, "0.0001"),
    ("checkpoint_completion_target", 0.5, "0.5"),
    ("autovacuum_vacuum_cost_delay", -1.0, "-1"),
    ("vacuum_cost_delay", 2.5, "2.5"),
    ("enable_seqscan", False, "off"),
    ("wal_log_hints", True, "on"),
    ("wal_compression", "lz4", "lz4"),
    ("max_stack_depth", 6144, "6144"),
    ("old_snapshot_threshold", 60, "60"),
]


class TestKnobsTarget(PostgresTarget):
    """A target over knobs defined here, to reach values the catalog's ranges exclude."""

    __test__ = False
    KNOBS: tuple[Knob, ...] = (
        IntKnob("max_connections", low=5, high=262143, default=100, restart=True),
        CategoricalKnob("synchronous_commit", choices=("on", "off", "sometimes"), default="on"),
        IntKnob("work_mem", low=64, high=2**30, default=4096, unit="kB"),
    )

    def _catalog(self) -> tuple[Knob, ...]:
        return self.KNOBS


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    """A directory the ``postgres`` OS user can enter (pytest's own tmp is 0700 for root)."""
    path = Path(tempfile.mkdtemp(prefix="tuner-pgtest-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def target(workdir: Path) -> Iterator[PostgresTarget]:
    with PostgresTarget(**SMALL, workdir=workdir) as started:
        yield started


@pytest.fixture(scope="module")
def odd(workdir: Path) -> Iterator[TestKnobsTarget]:
    with TestKnobsTarget(**SMALL, workdir=workdir) as started:
        yield started


def defaults(target: PostgresTarget, **changes: Any) -> Config:
    config = target.default_config()
    assert config is not None
    return {**config, **changes}


def settle(target: PostgresTarget) -> int:
    """Bring the server to the defaults (restarting if a trial left other values); its pid."""
    target.apply(defaults(target))
    target.restore()
    assert target.server_pid is not None
    return target.server_pid


def family(pid: int) -> list[int]:
    """``pid`` and its child processes (the postmaster and its backends and helpers)."""
    children = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(entry.name))
    return [pid, *children]


def dead(pid: int) -> bool:
    """Gone, or a zombie (an orphan waits for init to reap it; it runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def assert_gone(processes: list[int], directory: Path) -> None:
    assert [pid for pid in processes if not dead(pid)] == []
    assert not directory.exists()


def clusters(workdir: Path) -> set[Path]:
    return set(workdir.glob(DIR_PREFIX + "*"))


# -- on a real cluster ----------------------------------------------------------------------
@needs_postgres
def test_setup_makes_a_private_cluster_with_pgbench_data(target: PostgresTarget) -> None:
    assert target.directory is not None and target.directory.name.startswith(DIR_PREFIX)
    assert target.server_pid is not None
    assert target.sql("select count(*) from pgbench_accounts") == [["100000"]]
    settings = dict(
        target.sql(
            "select name, setting from pg_settings where name in "
            "('listen_addresses', 'unix_socket_directories')"
        )
    )
    assert settings == {"listen_addresses": "", "unix_socket_directories": str(target.directory)}
    assert list(target.directory.glob(".s.PGSQL.*"))


@needs_postgres
def test_catalog_matches_this_server(target: PostgresTarget) -> None:
    """Every catalog knob exists with the catalog's unit, restart flag, type and range."""
    settings = target.current_settings()
    types = {"int": "integer", "float": "real", "bool": "bool", "categorical": "enum"}
    for knob in load_catalog("postgres"):
        row = settings[knob.name]
        assert (knob.unit, knob.restart) == (row.unit, row.context == "postmaster"), knob.name
        assert types[knob.kind] == row.vartype, knob.name
        if isinstance(knob, IntKnob):
            assert float(row.min_val) <= knob.low < knob.high <= float(row.max_val), knob.name
        if isinstance(knob, CategoricalKnob):
            assert set(knob.choices) <= set(row.enumvals), knob.name


@needs_postgres
def test_defaults_are_the_fresh_clusters_and_read_back(target: PostgresTarget) -> None:
    knobs = {k.name: k for k in target.describe_knobs()}
    assert len(knobs) == len(load_catalog("postgres"))
    assert (knobs["shared_buffers"].default, knobs["max_connections"].default) == (16384, 100)
    assert knobs["wal_buffers"].default == -1  # shown as 512, recognised as "auto"
    config = defaults(target)
    target.apply(config)
    try:
        settings = target.current_settings()
        assert all(same(name, value, settings) for name, value in config.items())
    finally:
        target.restore()


@needs_postgres
def test_every_knob_at_its_low_end_takes_effect(target: PostgresTarget) -> None:
    config = {
        k.name: k.choices[0] if isinstance(k, CategoricalKnob) else getattr(k, "low", k.default)
        for k in target.describe_knobs()
    }
    config = {k: v for k, v in config.items() if v is not None}
    target.apply(defaults(target, **config))
    try:
        settings = target.current_settings()
        assert all(same(name, value, settings) for name, value in config.items())
        assert not any(settings[name].pending_restart for name in config)
    finally:
        target.restore()


@needs_postgres
@pytest.mark.parametrize(("name", "value", "shown"), ROUND_TRIPS)
def test_values_take_effect_in_pg_settings(
    target: PostgresTarget, name: str, value: Any, shown: str
) -> None:
    target.apply(defaults(target, **{name: value}))
    try:
        row = target.current_settings()[name]
        assert (row.setting, row.pending_restart) == (shown, False)
        if (name, value) != ("wal_buffers", -1):  # the server overrides "auto" with its size
            assert row.sourcefile.endswith("tuner.conf")
    finally:
        target.restore()


@needs_postgres
def test_a_reload_knob_keeps_the_server_and_a_restart_knob_restarts_it(
    target: PostgresTarget,
) -> None:
    pid = settle(target)
    target.apply(defaults(target, work_mem=8192, random_page_cost=1.5))
    try:
        assert target.server_pid == pid
        assert target.sql("show work_mem") == [["8MB"]]
    finally:
        target.restore()
    target.apply(defaults(target, shared_buffers=20000))
    try:
        assert target.server_pid not in (None, pid)
        assert target.sql("show shared_buffers") == [["160000kB"]]
    finally:
        target.restore()
    restarted = target.server_pid
    target.apply(defaults(target, shared_buffers=20000))  # still running with that value
    target.restore()
    assert target.server_pid == restarted


@needs_postgres
def test_a_trial_measures_tps_and_latency(target: PostgresTarget) -> None:
    outcome = target.run_trial(defaults(target))
    assert outcome.status is TrialStatus.COMPLETED, outcome.reason
    metrics = outcome.metrics
    assert set(metrics) == set(target.describe_metrics())
    assert all(math.isfinite(v) and v > 0 for v in metrics.values()), metrics
    assert metrics["p50_ms"] <= metrics["p95_ms"] <= metrics["p99_ms"]
    assert target.directory is not None
    assert not list(target.directory.glob("pgbench_log*"))
    assert target.sql("select count(*) from pgbench_history") == [["0"]]


@needs_postgres
def test_a_watched_trial_reports_pgbench_progress_and_stops_when_told(
    target: PostgresTarget,
) -> None:
    """``--progress`` lines are the measurement's windows; told to stop after two, pgbench
    is interrupted and the trial keeps the windows' means and the logged percentiles."""
    heard: list[dict[str, float]] = []
    told: list[float] = []

    def listen(window: dict[str, float]) -> str:
        heard.append(window)
        if len(heard) == 2:
            told.append(time.monotonic())
            return "enough"
        return ""

    target.measure_s = 4  # four one-second windows (the module's target measures 1 s)
    try:
        stopped = target.run_trial(defaults(target), listen)
        after = time.monotonic() - told[0]  # uninterrupted, pgbench runs 2 s more
        heard_stopped = list(heard)
        heard.clear()
        whole = target.run_trial(defaults(target), lambda window: heard.append(window) or "")
    finally:
        target.measure_s = SMALL["measure_s"]
    assert stopped.status is TrialStatus.EARLY_STOPPED and stopped.reason == "enough"
    assert len(heard_stopped) == 2
    assert all(w["tps"] > 0 and w["latency_avg_ms"] > 0 for w in heard_stopped)
    assert stopped.metrics["tps"] == pytest.approx(sum(w["tps"] for w in heard_stopped) / 2)
    # interrupted after two of four seconds: it returned well before pgbench's -T 4 would
    # have ended (timed from the stop, so a slow reload on a loaded machine does not count)
    assert after < 1.5
    assert target.directory is not None and not list(target.directory.glob("pgbench_log*"))
    assert whole.status is TrialStatus.COMPLETED
    assert set(whole.metrics) == set(target.describe_metrics())
    assert len(heard) >= 3  # a progress line a second


@needs_postgres
def test_a_server_that_will_not_start_is_infeasible_and_the_next_trial_runs(
    odd: TestKnobsTarget,
) -> None:
    outcome = odd.run_trial(defaults(odd, max_connections=262143))
    assert outcome.status is TrialStatus.INFEASIBLE
    assert "PostgreSQL did not start" in outcome.reason
    assert 'invalid value for parameter "max_connections": 262143' in outcome.reason
    assert odd.server_pid is not None, "restore() started the server again"
    again = odd.run_trial(defaults(odd, max_connections=50))
    assert again.status is TrialStatus.COMPLETED, again.reason


@needs_postgres
def test_a_value_the_server_refuses_on_reload_is_infeasible(odd: TestKnobsTarget) -> None:
    pid = settle(odd)
    outcome = odd.run_trial(defaults(odd, synchronous_commit="sometimes", work_mem=2048))
    assert outcome.status is TrialStatus.INFEASIBLE
    assert "synchronous_commit: requested 'sometimes', the server shows on" in outcome.reason
    assert 'invalid value for parameter "synchronous_commit"' in outcome.reason
    assert "Available values" in outcome.reason  # the HINT line goes with it
    assert odd.server_pid == pid
    assert odd.run_trial(defaults(odd, synchronous_commit="off")).status is TrialStatus.COMPLETED


@needs_postgres
def test_calls_out_of_order_are_state_errors(odd: TestKnobsTarget, workdir: Path) -> None:
    with pytest.raises(StateError, match="measure"):
        odd.measure()
    odd.apply(defaults(odd))
    try:
        with pytest.raises(StateError, match="again before restore"):
            odd.apply(defaults(odd))
    finally:
        odd.restore()
    odd.restore()  # repeatable
    with pytest.raises(StateError, match="with block"):
        TestKnobsTarget(**SMALL, workdir=workdir).apply({})


@needs_postgres
def test_bad_configs_name_the_knob(odd: TestKnobsTarget) -> None:
    with pytest.raises(ValidationError, match=r"config\.work_mem"):
        odd.apply(defaults(odd, work_mem=1))
    with pytest.raises(ValidationError, match=r"config\.fsync"):
        odd.apply(defaults(odd, fsync=False))


@needs_postgres
def test_close_stops_the_server_and_removes_the_directory(workdir: Path) -> None:
    before = clusters(workdir)
    target = PostgresTarget(**SMALL, workdir=workdir, knobs=FEW)
    with target:
        assert target.run_trial(defaults(target, shared_buffers=32768)).status.is_final
        pid, directory = target.server_pid, target.directory
        assert pid is not None and directory is not None
        processes = family(pid)
        assert len(processes) > 3  # the postmaster, checkpointer, walwriter, ...
    assert_gone(processes, directory)
    assert target.directory is None and target.server_pid is None
    target.close()  # idempotent
    assert clusters(workdir) == before


class CrashingTarget(PostgresTarget):
    def measure(self) -> dict[str, float]:
        super().measure()
        raise RuntimeError("crash after measuring")


@needs_postgres
def test_an_exception_in_a_trial_still_cleans_up(workdir: Path) -> None:
    target = CrashingTarget(**SMALL, workdir=workdir, knobs=FEW)
    with pytest.raises(RuntimeError, match="crash after measuring"), target:
        assert target.server_pid is not None and target.directory is not None
        processes, directory = family(target.server_pid), target.directory
        target.run_trial(defaults(target))
    assert_gone(processes, directory)


@needs_postgres
def test_knobs_described_before_setup_leave_nothing_behind(workdir: Path) -> None:
    before = clusters(workdir)
    target = PostgresTarget(**SMALL, workdir=workdir, knobs=FEW)
    assert [k.name for k in target.describe_knobs()] == FEW
    assert clusters(workdir) == before
    assert target.default_config() == {
        "shared_buffers": 16384,
        "work_mem": 4096,
        "random_page_cost": 4.0,
        "enable_seqscan": True,
    }


@needs_postgres
@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the cluster to another user")
def test_a_workdir_the_postgres_user_cannot_enter_is_refused(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(ValidationError, match=r"target\.workdir") as info:
        PostgresTarget(**SMALL, workdir=private, knobs=FEW).setup()
    assert "cannot enter" in str(info.value)
    assert not list(private.iterdir())


ORPHAN_SCRIPT = """
import sys, time
from pathlib import Path
from targets.db.postgres.cluster import Cluster
from targets.db.postgres.tools import find_tools

cluster = Cluster(find_tools(), Path(sys.argv[1]))
cluster.create()
cluster.start()
print(cluster.root, cluster.pid, flush=True)
time.sleep(600)
"""


@needs_postgres
def test_the_cluster_of_a_killed_session_is_reaped_by_the_next(workdir: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_SCRIPT, str(workdir)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        root, pid = proc.stdout.readline().split()
        proc.kill()  # SIGKILL: nothing of the owner's runs, the server lives on
        proc.wait()
        proc.stdout.close()
        os.kill(int(pid), 0)
        assert reap_orphans(workdir) == [Path(root)]
        assert_gone([int(pid)], Path(root))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- everywhere -----------------------------------------------------------------------------
def test_missing_postgres_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres_tools, "_candidate_bindirs", lambda: [])
    with pytest.raises(TargetError, match="apt-get install postgresql"):
        find_tools()
    with pytest.raises(TargetError, match="PostgreSQL is not installed"), PostgresTarget(knobs=FEW):
        pass


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"scale": 0}, "target.scale"),
        ({"workload": "tpcc"}, "target.workload"),
        ({"clients": 2, "threads": 3}, "target.threads"),
        ({"measure_s": 0}, "target.measure_s"),
        ({"measure_s": 1.5}, "target.measure_s"),
        ({"warmup_s": -1}, "target.warmup_s"),
        ({"seed": -1}, "target.seed"),
        ({"workdir": "/nonexistent/dir"}, "target.workdir"),
        ({"knobs": ["shared_buffers", "fsync"]}, "target.knobs[1]"),
        ({"knobs": "shared_buffers"}, "target.knobs"),
    ],
)
def test_bad_options_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        PostgresTarget.from_options(options)
    assert info.value.field == field


def test_workload_option_lists_the_scripts() -> None:
    with pytest.raises(ValidationError, match="'tpcb-like', 'simple-update', 'select-only'"):
        PostgresTarget(workload="tpcc")


def test_threads_default_to_at_most_the_clients() -> None:
    target = PostgresTarget(clients=1, knobs=FEW)
    assert (target.clients, target.threads) == (1, 1)


def setting(name: str, value: str, unit: str = "", vartype: str = "integer", **kw: Any) -> Setting:
    fields: dict[str, Any] = {
        "context": "user",
        "min_val": "",
        "max_val": "",
        "enumvals": (),
        "pending_restart": False,
        "sourcefile": "",
    }
    fields.update(kw)
    return Setting(name=name, setting=value, unit=unit, vartype=vartype, **fields)


GIB = 1 << 30
SETTINGS = {
    s.name: s
    for s in [
        setting("shared_buffers", "16384", "8kB", min_val="16", max_val="1073741823"),
        setting("effective_cache_size", "524288", "8kB", min_val="1", max_val="2147483647"),
        setting("work_mem", "4096", "kB", min_val="64", max_val="2147483647"),
        setting("max_connections", "100", min_val="1", max_val="262143"),
        setting("max_stack_depth", "2048", "kB", min_val="100", max_val="2147483647"),
        setting("wal_buffers", "512", "8kB", min_val="-1", max_val="262143"),
        setting("wal_segment_size", "16777216", "B"),
        setting("wal_block_size", "8192"),
        setting("random_page_cost", "4", vartype="real"),
        setting("enable_seqscan", "on", vartype="bool"),
    ]
}


def test_memory_knobs_are_clamped_to_the_host_with_priors() -> None:
    catalog = {k.name: k for k in load_catalog("postgres")}
    names = ["shared_buffers", "effective_cache_size", "work_mem", "max_connections"]
    names += ["max_stack_depth", "wal_buffers", "random_page_cost"]
    host = Host(ram_bytes=8 * GIB, stack_kb=4096, clients=16)
    knobs = {k.name: k for k in resolve_knobs([catalog[n] for n in names], SETTINGS, host, True)}
    shared = knobs["shared_buffers"]
    assert isinstance(shared, IntKnob)
    assert (shared.high, shared.default) == (int(0.4 * 8 * GIB) // 8192, 16384)
    assert shared.recommended == (2 * GIB // 8192, int(0.4 * 8 * GIB) // 8192)
    assert "25%" in shared.recommended_source
    cache = knobs["effective_cache_size"]
    assert isinstance(cache, IntKnob) and cache.high == 6 * GIB // 8192
    assert cache.recommended == (4 * GIB // 8192, 6 * GIB // 8192)
    assert getattr(knobs["work_mem"], "high", None) == 8 * GIB // (4 * 16) // 1024
    assert getattr(knobs["wal_buffers"], "high", None) == 8 * GIB // 32 // 8192
    assert getattr(knobs["max_connections"], "low", None) == 17
    assert getattr(knobs["max_stack_depth"], "high", None) == 4096 - 512
    assert knobs["wal_buffers"].default == -1 and -1 in knobs["wal_buffers"].special_values
    assert knobs["random_page_cost"] == catalog["random_page_cost"]


def test_a_tiny_host_keeps_the_default_inside_the_range() -> None:
    knob = IntKnob("shared_buffers", low=16, high=1048576, default=16384, unit="8kB")
    host = Host(ram_bytes=64 << 20, stack_kb=None, clients=4)
    [narrowed] = resolve_knobs([knob], SETTINGS, host, True)
    assert isinstance(narrowed, IntKnob)
    assert (narrowed.high, narrowed.default) == (16384, 16384)
    assert narrowed.recommended == ((16 << 20) // 8192, int(0.4 * (64 << 20)) // 8192)


def test_knobs_the_server_lacks_are_dropped_or_refused() -> None:
    knobs = (IntKnob("no_such_knob", low=0, high=10, default=1), load_catalog("postgres")[1])
    host = Host(None, None, 4)
    assert [k.name for k in resolve_knobs(knobs, SETTINGS, host, False)] == ["work_mem"]
    with pytest.raises(ValidationError, match="no setting 'no_such_knob'"):
        resolve_knobs(knobs, SETTINGS, host, True)


@pytest.mark.parametrize(
    ("name", "value", "vartype", "line"),
    [
        ("enable_seqscan", False, "bool", "enable_seqscan = 'off'"),
        ("enable_seqscan", "on", "bool", "enable_seqscan = 'on'"),
        ("work_mem", 65536, "integer", "work_mem = '65536'"),
        ("work_mem", 65536.0, "integer", "work_mem = '65536'"),
        ("cpu_operator_cost", 1e-05, "real", "cpu_operator_cost = '1e-05'"),
        ("vacuum_cost_delay", 2, "real", "vacuum_cost_delay = '2'"),
        ("wal_compression", "lz4", "enum", "wal_compression = 'lz4'"),
        ("wal_compression", False, "enum", "wal_compression = 'off'"),
        ("application_name", "it's", "string", "application_name = 'it''s'"),
    ],
)
def test_conf_lines_are_quoted_in_base_units(
    name: str, value: Any, vartype: str, line: str
) -> None:
    assert conf_line(name, value, setting(name, "", vartype=vartype)) == line


def test_same_compares_in_the_servers_terms() -> None:
    assert same("random_page_cost", 4.0, SETTINGS)
    assert same("random_page_cost", 4.000001, SETTINGS)  # pg_settings shows 6 digits
    assert not same("random_page_cost", 4.1, SETTINGS)
    assert same("enable_seqscan", True, SETTINGS) and not same("enable_seqscan", "off", SETTINGS)
    assert same("wal_buffers", -1, SETTINGS) and same("wal_buffers", 512, SETTINGS)
    bigger = {**SETTINGS, "shared_buffers": replace(SETTINGS["shared_buffers"], setting="1048576")}
    assert not same("wal_buffers", -1, bigger)  # auto would now be one 16 MB segment


PGBENCH_OUTPUT = """\
pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: <builtin: TPC-B (sort of)>
scaling factor: 1
number of clients: 2
number of threads: 1
duration: 1 s
number of transactions actually processed: 1234
number of failed transactions: 0 (0.000%)
latency average = 1.617 ms
initial connection time = 3.123 ms
tps = 1236.901727 (without initial connection time)
"""


def test_pgbench_summary_and_logs_are_parsed(tmp_path: Path) -> None:
    assert parse_summary(PGBENCH_OUTPUT) == (1236.901727, 1.617)
    with pytest.raises(WorkloadResultError, match="tps"):
        parse_summary("pgbench: error: connection failed")
    prefix = tmp_path / "pgbench_log"
    Path(f"{prefix}.77").write_text(
        "".join(f"0 {i} {(i + 1) * 100} 0 1700000000 {i}\n" for i in range(100))
    )
    Path(f"{prefix}.77.1").write_text("1 0 failed 0 1700000000 5\n1 1 50 0 1700000000 6\n")
    latencies = read_latencies(prefix)
    assert len(latencies) == 101 and not list(tmp_path.iterdir())
    metrics = summarize(1236.9, 1.617, latencies)
    assert metrics["p50_ms"] == 5.0 and metrics["p95_ms"] == 9.5 and metrics["p99_ms"] == 9.9
    with pytest.raises(WorkloadResultError, match="no transaction"):
        summarize(0.0, 1.0, [])


def test_pgbench_arguments() -> None:
    workload = Workload("select-only", clients=8, threads=2, seed=3)
    assert workload.run_args(10) == [
        *("-n", "-b", "select-only", "-c", "8", "-j", "2", "-T", "10"),
        "--random-seed=3",
    ]
    assert workload.run_args(5, Path("/x/log"))[-2:] == ["-l", "--log-prefix=/x/log"]
    assert workload.init_args(10) == ["-i", "-s", "10", "-q"]
