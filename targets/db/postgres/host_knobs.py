"""PostgreSQL knobs on this host: ranges, defaults and priors at start; values in and out.

Catalog ranges (``knobs/catalogs/postgres.toml``) are PostgreSQL's documented ones, in
``pg_settings`` base units (8 kB pages, kB, MB, ms, s, min). ``resolve_knobs`` narrows them
for this host and this server once, when the target starts:

* **Defaults** become what a fresh ``initdb`` cluster of these binaries reports in
  ``pg_settings`` (``shared_buffers`` 128 MB, not the 8 MB boot value), so the first trial
  measures an untuned install. ``wal_buffers``'s automatic ``-1`` is recognised although
  the server shows the size it chose.
* **Memory-sized knobs** get an upper end relative to the host's RAM (``MemTotal``, or the
  cgroup's memory limit when lower), never below the default; ``C`` is the workload's
  number of pgbench clients:

  ====================================================  ===============================
  knob                                                  upper end
  ====================================================  ===============================
  shared_buffers                                        40 % of RAM
  effective_cache_size                                  75 % of RAM
  work_mem, temp_buffers (per connection)               RAM / (4 C)
  maintenance_work_mem, autovacuum_work_mem,            RAM / 8
  logical_decoding_work_mem
  wal_buffers                                           RAM / 32
  max_stack_depth                                       ``ulimit -s`` - 512 kB (the
                                                        server refuses more)
  ====================================================  ===============================

  ``max_connections`` starts at ``C + 1``: fewer connections than the workload opens can
  only fail. Ranges are also kept inside ``pg_settings.min_val .. max_val``.
* **Expert priors** (``Knob.recommended``, clipped to the narrowed range):
  ``shared_buffers`` 25-40 % of RAM (PostgreSQL documentation, "Resource Consumption /
  Memory": "a reasonable starting value for shared_buffers is 25% of the memory in your
  system", and "unlikely that an allocation of more than 40% of RAM ... will work better")
  and ``effective_cache_size`` 50-75 % of RAM (PostgreSQL wiki, "Tuning Your PostgreSQL
  Server": 1/2 of memory "a normal conservative setting", 3/4 "more aggressive but still
  reasonable").

``conf_line`` writes a value for the configuration file: always single-quoted (the file's
lexer would read ``1e-05`` as the number 1 with unit ``e``), booleans as ``on``/``off``,
numbers without a unit suffix, which PostgreSQL reads in the base unit. ``same`` compares a
requested value with the ``pg_settings`` row it should have produced.
"""

from __future__ import annotations

import math
import resource
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from targets.db.postgres.cluster import Setting
from targets.host.facts import ram_bytes as host_ram_bytes
from tuner.errors import ValidationError
from tuner.space import FloatKnob, IntKnob, Knob, OrdinalKnob, Scalar

UNIT_BYTES = {"B": 1, "kB": 1024, "8kB": 8192, "MB": 1 << 20, "16MB": 16 << 20, "GB": 1 << 30}
SHARED_BUFFERS_SOURCE = (
    "PostgreSQL documentation, Server Configuration > Resource Consumption > Memory: "
    "'a reasonable starting value for shared_buffers is 25% of the memory in your system'; "
    "more than 40% is unlikely to work better"
)
EFFECTIVE_CACHE_SOURCE = (
    "PostgreSQL wiki, Tuning Your PostgreSQL Server: 1/2 of memory is a normal conservative "
    "setting for effective_cache_size, 3/4 more aggressive but still reasonable"
)
_STACK_SLOP_KB = 512  # PostgreSQL's STACK_DEPTH_SLOP
_TRUE = ("on", "true", "yes", "1")


@dataclass(frozen=True)
class Host:
    """What bounds the knobs on this machine.

    Attributes:
        ram_bytes: Usable memory (``MemTotal`` or the cgroup limit), None if unknown.
        stack_kb: The stack size limit the server inherits, None if unlimited or unknown.
        clients: Concurrent pgbench connections of the workload.
    """

    ram_bytes: int | None
    stack_kb: int | None
    clients: int


def host_facts(clients: int) -> Host:
    return Host(host_ram_bytes(), _stack_kb(), clients)


# knob -> its upper end in bytes on ``host`` (None: no bound)
MEMORY_CAPS: dict[str, Callable[[Host], float | None]] = {
    "shared_buffers": lambda h: _ram(h, 0.40),
    "effective_cache_size": lambda h: _ram(h, 0.75),
    "work_mem": lambda h: _ram(h, 1 / (4 * h.clients)),
    "temp_buffers": lambda h: _ram(h, 1 / (4 * h.clients)),
    "maintenance_work_mem": lambda h: _ram(h, 1 / 8),
    "autovacuum_work_mem": lambda h: _ram(h, 1 / 8),
    "logical_decoding_work_mem": lambda h: _ram(h, 1 / 8),
    "wal_buffers": lambda h: _ram(h, 1 / 32),
    "max_stack_depth": lambda h: (
        None if h.stack_kb is None else (h.stack_kb - _STACK_SLOP_KB) * 1024.0
    ),
}
# knob -> (low, high) share of RAM, source
PRIORS: dict[str, tuple[float, float, str]] = {
    "shared_buffers": (0.25, 0.40, SHARED_BUFFERS_SOURCE),
    "effective_cache_size": (0.50, 0.75, EFFECTIVE_CACHE_SOURCE),
}
# knobs whose special value the server replaces by what it computed: name -> (value, rule)
AUTO_VALUES: dict[str, tuple[Scalar, Callable[[Mapping[str, Setting]], str]]] = {
    "wal_buffers": (-1, lambda s: str(_auto_wal_buffers(s))),
}


def resolve_knobs(
    selected: Sequence[Knob], settings: Mapping[str, Setting], host: Host, explicit: bool
) -> tuple[Knob, ...]:
    """The selected knobs with this server's defaults and this host's ranges and priors.

    Raises:
        ValidationError: A knob named in ``target.knobs`` does not exist in this server.
    """
    out: list[Knob] = []
    for knob in selected:
        row = settings.get(knob.name)
        if row is None:
            if explicit:
                raise ValidationError(
                    "target.knobs",
                    f"this PostgreSQL has no setting {knob.name!r}",
                    [k.name for k in selected if k.name in settings],
                )
            continue
        knob = _with_default(knob, decode(knob, settings))
        knob = _narrow(knob, row, host)
        out.append(_with_prior(knob, row, host))
    return tuple(out)


def conf_line(name: str, value: Scalar, row: Setting) -> str:
    """``name = 'value'`` for the configuration file, in ``row``'s base unit."""
    if row.vartype == "bool" or isinstance(value, bool):
        text = "on" if _truth(value) else "off"
    elif isinstance(value, float) and value.is_integer() and row.vartype == "integer":
        text = str(int(value))
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = str(value)
    return f"{name} = '{text.replace(chr(39), chr(39) * 2)}'"


def decode(knob: Knob, settings: Mapping[str, Setting]) -> Scalar | None:
    """The server's current value of ``knob`` in the knob's terms, None if not expressible."""
    row = settings[knob.name]
    candidates: list[Scalar] = []
    if knob.name in AUTO_VALUES:
        value, rule = AUTO_VALUES[knob.name]
        if row.setting == rule(settings):
            candidates.append(value)
    if row.vartype == "bool":
        candidates += [row.setting == "on", row.setting]
    elif row.vartype in ("integer", "real"):
        try:
            candidates.append(int(row.setting) if row.vartype == "integer" else float(row.setting))
        except ValueError:
            return None
    else:
        candidates.append(row.setting)
    for candidate in candidates:
        try:
            return knob.validate(candidate)
        except ValidationError:
            continue
    return None


def same(name: str, value: Scalar, settings: Mapping[str, Setting]) -> bool:
    """Whether the server's ``name`` shows ``value`` in effect."""
    row = settings[name]
    if name in AUTO_VALUES and AUTO_VALUES[name][0] == value:
        return row.setting == AUTO_VALUES[name][1](settings)
    if row.vartype == "bool":
        return _truth(value) == (row.setting == "on")
    if row.vartype in ("integer", "real"):
        try:
            shown = float(row.setting)
            wanted = float(value)
        except ValueError:
            return False
        if row.vartype == "integer":
            return shown == wanted
        return math.isclose(shown, wanted, rel_tol=1e-5, abs_tol=1e-12)
    if isinstance(value, bool):
        return row.setting.lower() == ("on" if value else "off")
    return str(value).lower() == row.setting.lower()


# -- helpers ------------------------------------------------------------------------------
def _narrow(knob: Knob, row: Setting, host: Host) -> Knob:
    """Clip a numeric knob to the server's limits and the host's memory."""
    cap_bytes = MEMORY_CAPS[knob.name](host) if knob.name in MEMORY_CAPS else None
    unit = UNIT_BYTES.get(row.unit)
    cap = None if cap_bytes is None or unit is None else cap_bytes / unit
    if isinstance(knob, OrdinalKnob):
        return _narrow_levels(knob, cap)
    if not isinstance(knob, IntKnob | FloatKnob):
        return knob
    low, high = float(knob.low), float(knob.high)
    server_low, server_high = _number(row.min_val), _number(row.max_val)
    if server_low is not None:
        low = max(low, server_low)
    if server_high is not None:
        high = min(high, server_high)
    if cap is not None:
        high = min(high, cap)
    if knob.name == "max_connections":
        low = max(low, float(host.clients + 1))
    if knob.default is not None:  # the untuned baseline stays inside the range
        low, high = min(low, float(knob.default)), max(high, float(knob.default))
    if isinstance(knob, IntKnob):
        low, high = math.ceil(low), math.floor(high)
    if not low < high or (knob.log and low <= 0) or (low, high) == (knob.low, knob.high):
        return knob
    recommended = _clip_pair(knob.recommended, low, high)
    return replace(
        knob,
        low=low,
        high=high,
        special_values=tuple(v for v in knob.special_values if low <= float(v) <= high),
        unsafe_values=tuple(v for v in knob.unsafe_values if low <= float(v) <= high),
        recommended=recommended,
        recommended_source=knob.recommended_source if recommended else "",
    )


def _narrow_levels(knob: OrdinalKnob, cap: float | None) -> Knob:
    if cap is None:
        return knob
    kept = tuple(
        c for c in knob.choices if not isinstance(c, int | float) or c <= cap or c == knob.default
    )
    if len(kept) < 2 or len(kept) == len(knob.choices):
        return knob
    recommended = tuple(v for v in knob.recommended if v in kept)
    return replace(
        knob,
        choices=kept,
        special_values=tuple(v for v in knob.special_values if v in kept),
        unsafe_values=tuple(v for v in knob.unsafe_values if v in kept),
        recommended=recommended,
        recommended_source=knob.recommended_source if recommended else "",
    )


def _with_prior(knob: Knob, row: Setting, host: Host) -> Knob:
    unit = UNIT_BYTES.get(row.unit)
    if knob.name not in PRIORS or host.ram_bytes is None or unit is None:
        return knob
    if not isinstance(knob, IntKnob | FloatKnob):
        return knob
    share_low, share_high, source = PRIORS[knob.name]
    low = max(float(knob.low), share_low * host.ram_bytes / unit)
    high = min(float(knob.high), share_high * host.ram_bytes / unit)
    if isinstance(knob, IntKnob):
        low, high = math.ceil(low), math.floor(high)
    if low > high:
        return knob
    return replace(knob, recommended=(low, high), recommended_source=source)


def _with_default(knob: Knob, value: Scalar | None) -> Knob:
    if value is None:
        return knob
    return replace(knob, default=value)


def _clip_pair(pair: tuple[Scalar, ...], low: float, high: float) -> tuple[Scalar, ...]:
    if len(pair) != 2:
        return ()
    a, b = max(float(pair[0]), low), min(float(pair[1]), high)
    if a > b:
        return ()
    return (type(pair[0])(a), type(pair[1])(b))


def _auto_wal_buffers(settings: Mapping[str, Setting]) -> int:
    """What ``wal_buffers = -1`` resolves to: 1/32 of shared_buffers, in [8, one segment]."""
    try:
        buffers = int(settings["shared_buffers"].setting)
        segment = int(settings["wal_segment_size"].setting) * UNIT_BYTES.get(
            settings["wal_segment_size"].unit or "B", 1
        )
        block = int(settings["wal_block_size"].setting)
    except (KeyError, ValueError):
        return -1
    return max(8, min(buffers // 32, segment // block))


def _truth(value: Scalar) -> bool:
    if isinstance(value, str):
        return value.lower() in _TRUE
    return bool(value)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _ram(host: Host, share: float) -> float | None:
    return None if host.ram_bytes is None else host.ram_bytes * share


def _stack_kb() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else soft // 1024
