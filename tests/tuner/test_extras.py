"""The install extras table against pyproject.toml, and the pip command for each install."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tuner.extras import EXTRAS, checkout, extra_for, install_command, install_hint

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def distribution(requirement: str) -> str:
    """``psycopg[binary]>=3.2`` -> ``psycopg``, normalized (PEP 503)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name.group()).lower()


def brought_by(extra: str) -> set[str]:
    """The distributions ``extra`` installs: its own and those of the extras it names."""
    found: set[str] = set()
    for requirement in PROJECT["optional-dependencies"][extra]:
        nested = re.fullmatch(r"tuner\[(\w+)\]", requirement)
        found |= brought_by(nested.group(1)) if nested else {distribution(requirement)}
    return found


def provider(module: str) -> str:
    """The installed distribution that provides the top-level ``module``."""
    [name] = importlib.metadata.packages_distributions()[module]
    return distribution(name)


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_every_module_of_an_extra_comes_with_that_extra(extra: str) -> None:
    own = brought_by(extra)
    for module in EXTRAS[extra].modules:  # the dev install has every extra
        name = provider(module)
        # directly, or as a dependency of one it names (linear_operator under gpytorch)
        beneath = {distribution(r) for d in own for r in importlib.metadata.requires(d) or ()}
        assert name in own | beneath, f"{module} ({name}) is not brought by {extra}"


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_every_package_an_extra_adds_has_a_module_in_the_table(extra: str) -> None:
    """What an extra lists itself (not what a nested ``tuner[...]`` brings) is in the table,
    so a dependency added to pyproject.toml without a row here fails."""
    listed = {provider(m) for m in EXTRAS[extra].modules}
    own = {distribution(r) for r in PROJECT["optional-dependencies"][extra]} - {"tuner"}
    assert own <= listed, f"{extra}: no module in tuner.extras.EXTRAS for {own - listed}"


def test_a_module_names_the_smallest_extra_that_brings_it() -> None:
    assert extra_for("plotly") == "dashboard"  # full brings it too, through tuner[dashboard]
    assert extra_for("torch.nn") == "full" and extra_for("pynvml") == "full"
    assert extra_for("ray.tune") == "ray"
    assert extra_for("numpy") is None and install_hint("numpy") is None  # the base install


def test_in_a_checkout_the_command_is_the_editable_install_of_that_checkout(
    tmp_path: Path,
) -> None:
    assert checkout() == ROOT  # these tests run from the source tree
    assert install_command("dashboard", ROOT, ROOT) == "pip install -e '.[dashboard]'"
    assert install_command("ray", ROOT, tmp_path) == f"pip install -e '{ROOT}[ray]'"
    spaced = tmp_path / "my checkout"
    assert install_command("full", spaced, tmp_path) == f"pip install -e '{spaced}[full]'"
    assert install_command("dashboard", None, ROOT) == "pip install 'tuner[dashboard]'"


def test_an_installed_copy_is_told_the_released_package(tmp_path: Path) -> None:
    """The package as pip installs it (site-packages: no pyproject.toml beside it)."""
    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "tuner", site / "tuner", ignore=shutil.ignore_patterns("__pycache__"))
    probe = "from tuner.extras import install_hint; print(install_hint('plotly'))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "plotly, which comes with the dashboard extra (Plotly.js, for the page): "
        "pip install 'tuner[dashboard]'"
    )
