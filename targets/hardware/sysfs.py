"""Reading and writing sysfs (and debugfs) attribute files, with errors a user can act on."""

from __future__ import annotations

from collections.abc import Callable
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


def write_range(
    low_file: Path, high_file: Path, low: int, high: int, write_fn: Callable[[Path, str], None]
) -> None:
    """Set a [low, high] pair of limit files so that low <= high holds after every write.

    Raising: high first, then low; lowering: low first, then high (the kernel refuses a
    write that would leave its minimum above its maximum).
    """
    order = [(high_file, high), (low_file, low)]
    if high < read_int(high_file):
        order.reverse()
    for path, value in order:
        write_fn(path, str(value))


def restore_range(
    low_file: Path,
    high_file: Path,
    low: int,
    high: int,
    ceiling: int,
    write_fn: Callable[[Path, str], None],
) -> None:
    """Put a [low, high] pair back from any state: the high limit to ``ceiling`` first."""
    write_fn(high_file, str(ceiling))
    write_fn(low_file, str(low))
    write_fn(high_file, str(high))
