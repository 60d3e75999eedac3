"""The system packages the tests need: ``scripts/system_packages.sh`` finds what is missing
(and installs it where it can), and a test run that skipped tests for a missing package ends
with one line naming the packages and the command that installs them (``tests/conftest.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SKIPPING = """
import pytest

def test_needs_postgres():
    pytest.skip("system package postgresql is not installed (no initdb)")

@pytest.mark.skipif(True, reason="system package postgresql is not installed (no pgbench)")
def test_needs_pgbench():
    pass

@pytest.mark.skipif(True, reason="system package chromium is not installed (no browser)")
def test_needs_a_browser():
    pass

@pytest.mark.skipif(True, reason="needs a GPU")
def test_needs_a_gpu():
    pass

def test_runs():
    pass
"""


def run_pytest(folder: Path, *args: str) -> list[str]:
    (folder / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (folder / "test_some.py").write_text(SKIPPING)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # .ci/run's junit
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(folder)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if line.strip()]


def test_a_run_ends_with_one_line_naming_the_missing_packages_and_their_install(
    tmp_path: Path,
) -> None:
    for args in ((), ("-n", "2")):  # alone and on xdist workers alike
        lines = run_pytest(tmp_path, *args)
        assert "4 skipped" in lines[-2]
        assert lines[-1] == (
            "skipped for want of system packages: chromium (1 test), postgresql (2 tests); "
            "install them with `sudo apt-get install chromium postgresql` (Debian/Ubuntu; or "
            "`bash scripts/system_packages.sh`) and run again"
        )
        assert sum("system packages" in line for line in lines) == 1


def test_a_run_without_such_skips_prints_no_such_line(tmp_path: Path) -> None:
    lines = run_pytest(tmp_path, "-k", "gpu or runs")
    assert "1 passed" in lines[-1] and not any("system packages" in line for line in lines)


def test_the_script_names_what_is_missing_and_installs_nothing_when_told(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # a PATH with python and the shell's basics, no browser
    bin_dir.mkdir()
    for tool in ("dirname", "id", "cat"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    (bin_dir / "python").symlink_to(sys.executable)
    env = {"PATH": str(bin_dir), "SKIP_SYSTEM_PACKAGES": "1", "HOME": str(tmp_path)}
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run(
        [bash, str(ROOT / "scripts" / "system_packages.sh")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "chromium" in done.stderr and "openssl" in done.stderr
    assert "not installing them (SKIP_SYSTEM_PACKAGES=1)" in done.stderr
