"""A configuration's identity: when two configurations of a space count as the same one.

The designer never suggests a configuration whose key is taken (``tuner.designer.base``),
and storage refuses a new trial whose key another writer stored after the history it was
suggested from (``server.storage``: two server replicas, or two sessions on one file, that
read the same trials at once). Both use ``config_key``, so they agree on what "the same"
means:

* discrete values (integers, choices, bools) compare exactly (``True`` is not ``1``);
* float values compare on a grid of 1e-9 of the knob's range (of its logarithm, for a
  log-scaled knob), so values that differ only by rounding noise coincide.

This module is plain Python (no torch): storage and a base install compute keys too.
``UnitBoxEncoder.key`` (``tuner.encoding``) is this function.
"""

from __future__ import annotations

import hashlib
import json
import math

from tuner.space import BoolKnob, Config, FloatKnob, IntKnob, Knob, SearchSpace, _ChoiceKnob
from tuner.space import value_key as _value_key

#: Float values closer than 1 / KEY_GRID of the knob's range are the same value.
KEY_GRID = 1e9
#: Identity of a configuration for de-duplication (``config_key``).
ConfigKey = tuple[object, ...]


def config_key(space: SearchSpace, config: Config) -> ConfigKey:
    """The identity of ``config`` (a valid configuration of ``space``), one part per knob in
    the space's order: a float knob's value on the 1e-9 grid of its unit coordinate, any
    other knob's value as ``tuner.space.value_key`` gives it."""
    return tuple(
        round(unit_value(knob, config[knob.name]) * KEY_GRID)
        if isinstance(knob, FloatKnob)
        else _value_key(config[knob.name])
        for knob in space.knobs
    )


def key_text(key: ConfigKey) -> str:
    """``key`` as a short text (a hash), as storage keeps it with a trial."""
    text = json.dumps(key, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def unit_value(knob: Knob, value: object) -> float:
    """``value``'s coordinate in ``[0, 1]`` (the unit-box encoding of ``tuner.encoding``):
    affine in the range (or its logarithm), a choice's index over the last index."""
    if isinstance(knob, FloatKnob | IntKnob):
        v = float(value)  # type: ignore[arg-type]
        if knob.log:
            return (math.log(v) - math.log(knob.low)) / (math.log(knob.high) - math.log(knob.low))
        return (v - knob.low) / (knob.high - knob.low)
    assert isinstance(knob, _ChoiceKnob)
    if isinstance(knob, BoolKnob):
        return 1.0 if value else 0.0
    return knob.index(value) / (len(knob.choices) - 1)  # type: ignore[arg-type]
