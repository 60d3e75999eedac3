"""Reading and writing sysfs (and debugfs) attribute files, with errors a user can act on."""

from __future__ import annotations

from pathlib import Path

from tuner.errors import TargetError


def read_text(path: Path) -> str:
    return path.read_text().strip()


def read_int(path: Path) -> int:
    return int(read_text(path))


def write(path: Path, text: str, what: str) -> None:
    """Write ``text`` to the attribute ``path``; ``what`` names the control for the message.

    Raises:
        TargetError: Permission denied (says that ``what`` needs root) or any other OS error.
    """
    try:
        path.write_text(text)
    except PermissionError as exc:
        raise TargetError(f"cannot write {path}: permission denied ({what} needs root)") from exc
    except OSError as exc:
        raise TargetError(f"cannot write {text!r} to {path}: {exc.strerror or exc}") from exc
