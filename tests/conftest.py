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
``REQUIRE_POSTGRES_TESTS=1`` (``.ci/run`` installs Debian's package and sets it, so on CI a
missing server fails instead).
"""

from __future__ import annotations

import os
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


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL server on a Unix socket, for the whole test session."""
    try:
        tools = find_tools()
    except TargetError as exc:
        if os.environ.get("REQUIRE_POSTGRES_TESTS") == "1":
            pytest.fail(f"REQUIRE_POSTGRES_TESTS=1 but PostgreSQL is not installed: {exc}")
        pytest.skip(f"PostgreSQL is not installed ({exc}); .ci/run installs it on CI")
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
