"""Cloud instance catalogs: the deployments a cloud job can run on, as knobs and candidates.

A catalog lives at ``knobs/instances/<name>.toml``: instance types (family, size, vCPUs,
memory, hourly price per node), the node counts allowed for each size, and the default
deployment. It becomes three knobs (the search space of CherryPick and Scout):

* ``family``: categorical (``c4``, ``m4``, ``r4``): compute-, general- or memory-optimized;
* ``size``: ordinal, sizes in the order of their vCPUs (each step doubles the machine);
* ``nodes``: int, log-scaled (a job's runtime falls roughly with the node count's inverse);

and the candidate list of every (instance type, allowed node count), because the node counts
differ per size: no box of knob ranges describes them.
"""

from __future__ import annotations

import functools
import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tuner.errors import ValidationError
from tuner.space import CategoricalKnob, Config, IntKnob, Knob, OrdinalKnob

_DIR = "instances"
_TOP_LEVEL = ("description", "default", "node_counts", "instances")
_INSTANCE_FIELDS = ("family", "size", "vcpus", "memory_gib", "price_usd_per_hour")
KNOB_NAMES = ("family", "size", "nodes")


@dataclass(frozen=True)
class InstanceType:
    family: str
    size: str
    vcpus: int
    memory_gib: float
    price_usd_per_hour: float

    @property
    def name(self) -> str:
        """The provider's name, e.g. ``c4.xlarge``."""
        return f"{self.family}.{self.size}"


@dataclass(frozen=True)
class CloudCatalog:
    """Instance types, allowed node counts per size, and the default deployment."""

    name: str
    description: str
    instances: tuple[InstanceType, ...]
    node_counts: dict[str, tuple[int, ...]]
    default: Config

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(i.family for i in self.instances))

    @property
    def sizes(self) -> tuple[str, ...]:
        """Sizes from the smallest machine to the largest."""
        vcpus = {i.size: i.vcpus for i in self.instances}
        return tuple(sorted(vcpus, key=lambda s: vcpus[s]))

    def knobs(self) -> tuple[Knob, ...]:
        """``family``, ``size`` and ``nodes``, each only where the catalog offers two values
        or more (a catalog of one family has no family knob: its deployments all share the
        default's family)."""
        counts = sorted({n for ns in self.node_counts.values() for n in ns})
        knobs: list[Knob] = []
        if len(self.families) > 1:
            knobs.append(CategoricalKnob(
                "family", choices=self.families, default=self.default["family"],
                description="instance family: " + ", ".join(self.families),
            ))  # fmt: skip
        if len(self.sizes) > 1:
            knobs.append(OrdinalKnob(
                "size", choices=self.sizes, default=self.default["size"],
                description="instance size; each step doubles vCPUs, memory and price",
            ))  # fmt: skip
        if len(counts) > 1:
            knobs.append(IntKnob(
                "nodes", low=counts[0], high=counts[-1], log=True, default=self.default["nodes"],
                description="number of nodes in the cluster",
            ))  # fmt: skip
        return tuple(knobs)

    def candidates(self) -> tuple[Config, ...]:
        """Every deployment: each instance type with each node count of its size."""
        return tuple(
            {"family": i.family, "size": i.size, "nodes": n}
            for i in self.instances
            for n in self.node_counts[i.size]
        )

    def instance(self, config: Config) -> InstanceType:
        for instance in self.instances:
            if instance.family == config["family"] and instance.size == config["size"]:
                return instance
        raise ValidationError(
            "config", f"no instance type {config['family']}.{config['size']} in {self.name}"
        )

    def resources(self, config: Config) -> dict[str, float]:
        """A deployment's totals over its nodes: ``vcpus`` and ``memory_gib``.

        Studies of the catalog's candidates model these instead of size and node count
        (``StudySpec.candidate_features``): 8 x ``c4.2xlarge`` and 2 x ``c4.8xlarge`` both
        have 64 vCPUs and 120 GiB, and a job runs about as fast on either.
        """
        instance = self.instance(config)
        nodes = int(config["nodes"])
        return {"vcpus": float(nodes * instance.vcpus), "memory_gib": nodes * instance.memory_gib}

    def cost_usd(self, config: Config, runtime_s: float) -> float:
        """What running ``config`` for ``runtime_s`` costs: nodes x hourly price x hours."""
        price = self.instance(config).price_usd_per_hour
        return price * int(config["nodes"]) * runtime_s / 3600.0


def cloud_catalogs() -> tuple[str, ...]:
    files = (resources.files("knobs") / _DIR).iterdir()
    return tuple(sorted(f.name[: -len(".toml")] for f in files if f.name.endswith(".toml")))


def load_cloud_catalog(name: str = "aws_2017") -> CloudCatalog:
    """A cloud catalog: one shipped with tuner by name (``knobs/instances/<name>.toml``), or
    a user's TOML file of the same format by its path (a ``.toml`` name or one with a ``/``).

    Raises:
        ValidationError: There is no such catalog or file (the message lists the shipped
            ones), or the file is malformed (the field names the file and the entry).
    """
    names = cloud_catalogs()
    if isinstance(name, str) and (name.endswith(".toml") or "/" in name):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ValidationError(
                "target.catalog", f"{name!r} is not a file",
                f"a catalog TOML file, or a shipped catalog: {', '.join(names)}",
            )  # fmt: skip
        return _load(path.stem, str(path.resolve()), path.read_text("utf-8"))
    if not isinstance(name, str) or name not in names:
        raise ValidationError(
            "target.catalog", f"no cloud catalog {name!r}",
            f"{', '.join(repr(n) for n in names)}, or the path of a catalog TOML file",
        )  # fmt: skip
    text = (resources.files("knobs") / _DIR / f"{name}.toml").read_text("utf-8")
    return _load(name, f"{_DIR}/{name}.toml", text)


@functools.cache
def _load(name: str, where: str, text: str) -> CloudCatalog:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError("target.catalog", f"{where} is not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - set(_TOP_LEVEL))
    if unknown:
        raise ValidationError(f"{where}: {unknown[0]}", "unknown top-level key", _TOP_LEVEL)
    instances = tuple(
        _instance(entry, f"{where}: instances[{i}]")
        for i, entry in enumerate(data.get("instances", []))
    )
    if not instances:
        raise ValidationError(f"{where}: instances", "needs at least one [[instances]] table")
    if len({i.name for i in instances}) != len(instances):
        raise ValidationError(f"{where}: instances", "an instance type is listed twice")
    counts = data.get("node_counts", {})
    if not isinstance(counts, dict):
        raise ValidationError(
            f"{where}: node_counts", f"got {counts!r}", "a table: size = [node counts]"
        )
    default = data.get("default")
    if not isinstance(default, dict) or set(default) != {"family", "size", "nodes"}:
        raise ValidationError(
            f"{where}: default", f"got {default!r}",
            'a table { family = "...", size = "...", nodes = N }: one of the deployments',
        )  # fmt: skip
    node_counts: dict[str, tuple[int, ...]] = {}
    for size in dict.fromkeys(i.size for i in instances):
        listed = counts.get(size)
        if (
            not isinstance(listed, list)
            or not listed
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in listed)
            or len(set(listed)) != len(listed)
        ):
            raise ValidationError(
                f"{where}: node_counts.{size}", f"got {listed!r}", "a list of distinct counts >= 1"
            )
        node_counts[size] = tuple(listed)
    catalog = CloudCatalog(
        name, str(data.get("description", "")), instances, node_counts, dict(default)
    )
    if not catalog.knobs():
        raise ValidationError(
            f"{where}: instances",
            f"offers one deployment ({catalog.default}): nothing to choose",
            "two or more families, sizes or node counts",
        )
    if catalog.default not in catalog.candidates():
        raise ValidationError(f"{where}: default", f"{catalog.default} is not a deployment")
    return catalog


def _instance(entry: Any, where: str) -> InstanceType:
    if not isinstance(entry, dict) or set(entry) != set(_INSTANCE_FIELDS):
        raise ValidationError(where, f"got {entry!r}", _INSTANCE_FIELDS)
    vcpus, memory, price = entry["vcpus"], entry["memory_gib"], entry["price_usd_per_hour"]
    if not isinstance(vcpus, int) or vcpus < 1:
        raise ValidationError(f"{where}.vcpus", f"got {vcpus!r}", "an integer >= 1")
    for key, value in (("memory_gib", memory), ("price_usd_per_hour", price)):
        if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ValidationError(f"{where}.{key}", f"got {value!r}", "a number > 0")
    return InstanceType(
        str(entry["family"]), str(entry["size"]), vcpus, float(memory), float(price)
    )
