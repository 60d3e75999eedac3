"""Test-wide settings, made as the ``tuner`` command makes them at start-up
(``tuner.runtime.configure``: one torch thread), and the designer runs in strict mode.

In strict mode a numerical error inside a model-based step (``NotPSDError``, ``NanError``,
...) propagates instead of falling back to quasi-random points, so numerical trouble in a
test is a failure, not a silent fallback. The tests of the fallback itself turn it off
(``monkeypatch.setattr(runtime, "STRICT", False)``). It is not set through the environment,
which the target tests' child processes inspect.

``postgres_cluster`` is a real PostgreSQL server for the whole session (the PostgreSQL
storage backend's tests, bench.load's replicas), and ``postgres_url`` a new, empty schema in
it for each test. Skipped where PostgreSQL is not installed, unless
``REQUIRE_POSTGRES_TESTS=1`` (``.ci/run`` sets it, so on CI a missing server fails instead).

A test that needs a system package skips with the reason ``system package NAME is not
installed (...)``; the run then ends with one line naming the packages, how many tests each
cost, and the command that installs them (``scripts/check.sh`` installs them first where it
can: ``scripts/system_packages.sh``).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from targets.db.postgres.cluster import Cluster
from targets.db.postgres.tools import find_tools
from tuner import runtime
from tuner.errors import TargetError

runtime.configure(warnings_to_log=False, strict=True)  # pytest keeps its own warning filters

_MISSING_PACKAGE = re.compile(r"system package (\S+) is not installed")


def missing_packages_line(reasons: list[str]) -> str | None:
    """One line for the skips whose reason names a missing system package, or None."""
    counts: dict[str, int] = {}
    for reason in reasons:
        for package in dict.fromkeys(_MISSING_PACKAGE.findall(reason)):
            counts[package] = counts.get(package, 0) + 1
    if not counts:
        return None
    names = sorted(counts)
    skipped = ", ".join(f"{n} ({counts[n]} test{'s' if counts[n] > 1 else ''})" for n in names)
    return (
        f"skipped for want of system packages: {skipped}; install them with "
        f"`sudo apt-get install {' '.join(names)}` (Debian/Ubuntu; or "
        "`bash scripts/system_packages.sh`) and run again"
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    """After the summary: the one line naming the system packages whose tests were skipped."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput"):  # an xdist worker reports nothing
        return
    reasons = []
    for report in reporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reasons.append(str(longrepr[2] if isinstance(longrepr, tuple) else longrepr))
    line = missing_packages_line(reasons)
    if line is not None:
        reporter.write_line(line, yellow=True, bold=True)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL server on a Unix socket, for the whole test session."""
    try:
        tools = find_tools()
    except TargetError as exc:
        if os.environ.get("REQUIRE_POSTGRES_TESTS") == "1":
            pytest.fail(f"REQUIRE_POSTGRES_TESTS=1 but PostgreSQL is not installed: {exc}")
        pytest.skip(f"system package postgresql is not installed ({exc})")
    parent = Path(tempfile.mkdtemp(prefix="tuner-pgstore-"))
    parent.chmod(0o755)  # the postgres user must reach its socket directory
    cluster = Cluster(tools, parent)
    try:
        cluster.create()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server_url(postgres_cluster: Cluster) -> str:
    """The cluster's ``postgres`` database as a libpq URL over its Unix socket."""
    return (
        f"postgresql://postgres@/postgres?host={postgres_cluster.root}&port={postgres_cluster.port}"
    )


@pytest.fixture
def postgres_url(postgres_server_url: str) -> str:
    """A storage URL whose tables go to a new, empty schema (its own search_path)."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{postgres_server_url}&options=-csearch_path%3D{schema}"
