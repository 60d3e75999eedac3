"""Without the full install (no torch), the commands that need it say what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_command_that_needs_torch_names_the_full_install(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text(
        '[study]\nname = "s"\n[[study.knobs]]\nname = "x"\nkind = "float"\nlow = 0.0\n'
        'high = 1.0\n[[study.objectives]]\nname = "y"\n',
        encoding="utf-8",
    )
    db = str(tmp_path / "t.db")
    probe = (
        "import sys\n"
        "sys.modules['torch'] = None  # as in an install without the full extra\n"
        "from cli.main import main\n"
        f"assert main(['create', {str(config)!r}, '--db', {db!r}]) == 0\n"
        f"sys.exit(main(['ask', 's', '--db', {db!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr
    text = " ".join(done.stderr.split())
    assert "`tuner ask` needs torch" in text and "pip install -e '.[full]'" in text  # checkout
