"""Which install extra brings which optional module, and the command that installs it here.

``EXTRAS`` is the one table: each extra of ``pyproject.toml`` that a missing import can
call for, what it brings, and the top-level modules it adds to the base install (the
client and the commands that read results). ``tests/tuner/test_extras.py`` checks it
against ``pyproject.toml``. A module several extras bring is listed under the smallest
(``plotly``: ``dashboard``, which ``full`` includes).

``install_hint(module)`` is the sentence a command prints when an import fails, with the
pip command for *this* install: in a source checkout (the project's ``pyproject.toml``
beside the packages: ``pip install -e .``, or a run from the tree) the editable form,
``pip install -e '.[dashboard]'`` (``.`` is the checkout's path when the working directory
is elsewhere); otherwise ``pip install 'tuner[dashboard]'``. In a checkout::

    f"`tuner dashboard` needs {install_hint('plotly')}"
    # `tuner dashboard` needs plotly, which comes with the dashboard extra (Plotly.js, for
    # the page): pip install -e '.[dashboard]'

The text holds ``[...]``: print it through rich with ``markup=False`` or ``escape`` it.
"""

from __future__ import annotations

import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

#: The folder holding the project's packages (``tuner/``, ``cli/``, ...).
PACKAGES_DIR = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Extra:
    """One install extra: ``brings`` (for people) and the ``modules`` it adds."""

    brings: str
    modules: frozenset[str]


EXTRAS: dict[str, Extra] = {
    "dashboard": Extra("the dashboard extra (Plotly.js, for the page)", frozenset({"plotly"})),
    "ray": Extra("the ray extra (Ray Tune)", frozenset({"ray"})),
    "full": Extra(
        "the full install (the optimizer, the server and the targets; the base install "
        "is the client and the commands that read and plot results)",
        frozenset({
            "torch", "botorch", "gpytorch", "linear_operator", "scipy", "skopt", "psycopg",
            "prometheus_client", "pynvml",
        }),
    ),
}  # fmt: skip


def extra_for(module: str) -> str | None:
    """The extra that brings the top-level module of ``module`` (``torch.nn``: ``full``),
    None when no extra does (not an optional dependency of this project)."""
    top = module.split(".")[0]
    return next((name for name, extra in EXTRAS.items() if top in extra.modules), None)


def install_hint(module: str) -> str | None:
    """``MODULE, which comes with EXTRA: COMMAND`` for a missing ``module`` (what follows
    "``tuner dashboard`` needs"), None when no extra brings it."""
    name = extra_for(module)
    if name is None:
        return None
    command = install_command(name, checkout(), Path.cwd())
    return f"{module.split('.')[0]}, which comes with {EXTRAS[name].brings}: {command}"


def install_command(extra: str, root: Path | None, cwd: Path) -> str:
    """The pip command, run in ``cwd``, that adds ``extra`` (a key of ``EXTRAS``) to an
    install from the source checkout ``root``, or (None) to the released package."""
    if root is None:
        return f"pip install {shlex.quote(f'tuner[{extra}]')}"
    where = "." if cwd.resolve() == root.resolve() else str(root)
    return f"pip install -e {shlex.quote(f'{where}[{extra}]')}"


def checkout(packages_dir: Path = PACKAGES_DIR) -> Path | None:
    """The source checkout the packages run from (its ``pyproject.toml`` names this
    project), None for an installed copy (site-packages has no ``pyproject.toml``)."""
    pyproject = packages_dir / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    return packages_dir if project.get("name") == "tuner" else None
