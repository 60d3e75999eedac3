"""Knob catalogs: declarative TOML files per system, turned into validated knobs.

A catalog lives at ``knobs/catalogs/<system>.toml`` and is read through
``importlib.resources``, so it is found in a checkout and in an installed wheel alike. It
holds an optional ``description`` and a list of ``[[knobs]]`` tables, each in exactly the
shape of ``tuner.space.knob_from_dict``::

    [[knobs]]
    name = "synchronous"
    kind = "ordinal"
    choices = ["off", "normal", "full", "extra"]
    default = "full"
    unsafe_values = ["off"]

Catalog ranges are the system's documented ones; ranges that depend on the host (RAM,
supported clocks) are narrowed by the target when it starts.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from tuner.errors import ValidationError
from tuner.space import Knob, knob_from_dict

CATALOG_PACKAGE = "knobs"
CATALOG_DIR = "catalogs"
_TOP_LEVEL = ("description", "knobs")


def catalog_systems() -> tuple[str, ...]:
    """The systems that have a catalog, sorted (the stems of ``catalogs/*.toml``)."""
    files = _catalog_dir().iterdir()
    return tuple(sorted(f.name[: -len(".toml")] for f in files if f.name.endswith(".toml")))


def load_catalog(system: str) -> tuple[Knob, ...]:
    """The knobs of ``system``'s catalog, in catalog order.

    Raises:
        ValidationError: ``system`` has no catalog (the message lists those that do), or the
            catalog file is malformed (the field names the file and the entry).
    """
    systems = catalog_systems()
    if system not in systems:
        raise ValidationError("catalog", f"no knob catalog for system {system!r}", systems)
    return _load(system)


def select_knobs(
    catalog: Sequence[Knob], names: Sequence[str] | None, field: str = "knobs"
) -> tuple[Knob, ...]:
    """The knobs of ``catalog`` called ``names``, in the order given; ``None`` means all.

    Args:
        catalog: Knobs to choose from, e.g. ``load_catalog("sqlite")``.
        names: Knob names, or ``None`` for the whole catalog.
        field: Dotted path reported in errors, e.g. ``"target.knobs"``.

    Raises:
        ValidationError: ``names`` is empty, not a list of strings, repeats a name, or names
            a knob the catalog does not have (the message lists the catalog's names).
    """
    by_name = {knob.name: knob for knob in catalog}
    allowed = tuple(by_name)
    if names is None:
        return tuple(catalog)
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ValidationError(field, f"must be a list of knob names, got {names!r}", allowed)
    if not names:
        raise ValidationError(field, "needs at least one knob name", allowed)
    chosen: dict[str, Knob] = {}
    for i, name in enumerate(names):
        if not isinstance(name, str) or name not in by_name:
            raise ValidationError(f"{field}[{i}]", f"unknown knob {name!r}", allowed)
        if name in chosen:
            raise ValidationError(f"{field}[{i}]", f"knob {name!r} is listed twice", allowed)
        chosen[name] = by_name[name]
    return tuple(chosen.values())


def _catalog_dir() -> Traversable:
    return resources.files(CATALOG_PACKAGE) / CATALOG_DIR


@functools.cache
def _load(system: str) -> tuple[Knob, ...]:
    where = f"{CATALOG_DIR}/{system}.toml"
    try:
        data = tomllib.loads((_catalog_dir() / f"{system}.toml").read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError(where, f"is not valid TOML: {exc}") from None
    return _parse_catalog(data, where)


def _parse_catalog(data: dict[str, Any], where: str) -> tuple[Knob, ...]:
    unknown = sorted(set(data) - set(_TOP_LEVEL))
    if unknown:
        raise ValidationError(f"{where}: {unknown[0]}", "unknown top-level key", _TOP_LEVEL)
    entries = data.get("knobs")
    if not isinstance(entries, list) or not entries:
        raise ValidationError(f"{where}: knobs", "needs at least one [[knobs]] table")
    knobs = tuple(knob_from_dict(entry, f"{where}: knobs[{i}]") for i, entry in enumerate(entries))
    seen: set[str] = set()
    for i, knob in enumerate(knobs):
        if knob.name in seen:
            raise ValidationError(f"{where}: knobs[{i}].name", f"duplicate knob name {knob.name!r}")
        seen.add(knob.name)
    return knobs
