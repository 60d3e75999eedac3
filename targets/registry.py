"""Target kinds by name, and building a target from its options.

Each kind maps to ``"module:Class"``; the module is imported only when that kind is built,
so a kind whose adapter needs an optional dependency (a database driver, NVML) costs
nothing until it is used. Adding a kind is one line in ``_ADAPTERS``::

    with build_target("sqlite", {"db_mb": 32, "knobs": ["journal_mode", "synchronous"]}) as t:
        outcome = t.run_trial(t.default_config())

Option validation belongs to the adapter (``Target.from_options``); every error names the
field (``target.kind``, ``target.<option>``) and what is allowed.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from targets.base import Target, option_names
from tuner.errors import TargetError, ValidationError
from tuner.extras import install_hint

_ADAPTERS: dict[str, str] = {
    "sqlite": "targets.db.sqlite.target:SqliteTarget",
    "postgres": "targets.db.postgres.target:PostgresTarget",
    "command": "targets.command.target:CommandTarget",
    "cpufreq": "targets.hardware.cpufreq:CpuFreqTarget",
    "nvgpu": "targets.hardware.nvgpu:NvidiaGpuTarget",
    "jetson": "targets.hardware.jetson:JetsonTarget",
    "replay": "targets.replay:ReplayTarget",
    "gpusched": "targets.scheduler.gpusched:GpuSchedTarget",
    "cloud_replay": "targets.cloud.target:CloudReplayTarget",
    "cloud_launch": "targets.cloud.target:CloudLaunchTarget",
}
TARGET_KINDS: tuple[str, ...] = tuple(_ADAPTERS)


def target_class(kind: str) -> type[Target]:
    """The adapter class for ``kind``, importing its module on first use.

    Raises:
        ValidationError: ``kind`` is unknown (the message lists ``TARGET_KINDS``).
        TargetError: The adapter's module could not be imported (a missing dependency).
    """
    if not isinstance(kind, str) or kind not in _ADAPTERS:
        raise ValidationError("target.kind", f"unknown target kind {kind!r}", TARGET_KINDS)
    module_name, _, class_name = _ADAPTERS[kind].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = install_hint(exc.name) if isinstance(exc, ModuleNotFoundError) and exc.name else None
        raise TargetError(
            f"the {kind} target cannot be loaded: {exc}; "
            + (f"it needs {hint}" if hint else "install the package it names")
        ) from exc
    cls = getattr(module, class_name)
    if not (isinstance(cls, type) and issubclass(cls, Target)):
        raise TypeError(f"{_ADAPTERS[kind]} is not a Target subclass")
    return cls


def build_target(kind: str, options: Mapping[str, Any] | None = None) -> Target:
    """An unstarted target of ``kind`` built from ``options`` (use it in a ``with`` block).

    Raises:
        ValidationError: Unknown kind, unknown option, or an option value not allowed.
    """
    cls = target_class(kind)
    return cls.from_options({} if options is None else options)


def target_options(kind: str) -> tuple[str, ...]:
    """The option names a target of ``kind`` accepts."""
    return option_names(target_class(kind))
