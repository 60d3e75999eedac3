"""The user guide under docs/: built strictly, its generated reference up to date, and its
examples true to the code (configs that parse, a Python example that runs)."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from runner.config import _SESSION_KEYS, _TABLES, parse_config
from runner.daemon import DAEMON_KEYS
from server.app import build_server, stop_server
from server.service import TuningService
from server.storage import SQLiteStorage
from targets.registry import TARGET_KINDS, target_options
from tuner.study import _SPEC_FIELDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
# the kinds a config can be built for here, without hardware or data files
BUILT_HERE = ("sqlite", "command")


def blocks(language: str) -> list[tuple[Path, str]]:
    return [
        (page, block)
        for page in PAGES
        for block in re.findall(rf"```{language}\n(.*?)```", page.read_text(), re.S)
    ]


def test_the_reference_pages_are_generated_from_the_current_code() -> None:
    run = subprocess.run([sys.executable, "scripts/gen_reference.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr


def test_the_guide_builds_without_a_warning(tmp_path: Path) -> None:
    """mkdocs --strict: every link and anchor resolves, every page is in the navigation."""
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "WARNING" not in run.stderr, run.stderr[-3000:]
    assert (tmp_path / "reference" / "config" / "index.html").is_file()


def test_every_target_kind_has_a_page_and_its_options_a_row() -> None:
    config = (DOCS / "reference" / "config.md").read_text()
    for kind in TARGET_KINDS:
        page = {"cloud_replay": "cloud", "cloud_launch": "cloud"}.get(kind, kind)
        assert (DOCS / "targets" / f"{page}.md").is_file(), kind
        section = config.split(f'### `kind = "{kind}"`')[1].split("### ")[0]
        for option in target_options(kind):
            assert f"| `{option}` |" in section, (kind, option)


@pytest.mark.parametrize("page, block", blocks("toml"), ids=lambda v: getattr(v, "name", "toml"))
def test_every_config_in_the_guide_uses_keys_the_code_knows(page: Path, block: str) -> None:
    data = tomllib.loads(block)
    assert set(data) <= set(_TABLES), (page, set(data) - set(_TABLES))
    assert set(data.get("study", {})) <= set(_SPEC_FIELDS), page
    assert set(data.get("session", {})) <= set(_SESSION_KEYS), page
    assert set(data.get("daemon", {})) <= set(DAEMON_KEYS), page
    target = dict(data.get("target", {}))
    kind = target.pop("kind", None)
    if kind is None:
        return
    assert kind in TARGET_KINDS, (page, kind)
    assert set(target) <= set(target_options(kind)), (page, set(target) - set(target_options(kind)))
    if kind in BUILT_HERE and "study" in data:
        parse_config(data, {})  # the whole config validates as `tuner tune` would


def test_the_python_example_runs_against_a_real_server(tmp_path: Path) -> None:
    [(_, code)] = [(p, b) for p, b in blocks("python") if p.name == "python.md"][:1]
    with SQLiteStorage(tmp_path / "t.db") as storage:
        service = TuningService(storage)
        server, port = build_server(service, "127.0.0.1", 0)
        server.start()
        try:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(code.replace("127.0.0.1:50051", f"127.0.0.1:{port}"), {})
        finally:
            stop_server(server, 1).wait()
        trials = service.list_trials("demo")
    best_id, _ = printed.getvalue().split(" ", 1)
    assert len(trials) == 3 and int(best_id) in {t.id for t in trials}
