"""Expert priors: search the region that manuals recommend first, then the whole space.

GPTuner (Lao et al., VLDB 2024) showed that knowledge from manuals and tuning guides (for
example ``shared_buffers`` at 25-40 % of RAM) lets BO converge in far fewer trials. A knob may
carry a ``recommended`` region with its source (``tuner.space.Knob``). With
``designer.expert_priors = true`` the BO designer searches coarse-to-fine:

1. the initial design is drawn inside the *prior region* (the box of the recommended ranges,
   and only the recommended choices of choice knobs; knobs without a recommendation keep
   their whole domain);
2. the first model-based suggestions, as many as the initial design, maximize the acquisition
   over the prior region only;
3. after that the acquisition is maximized over the whole space, with everything learned so
   far in the model. A wrong recommendation therefore costs a bounded number of trials.

The region lives on the unit box of ``tuner.encoding``: a range knob's recommended
``[low, high]`` becomes ``[encode(low), encode(high)]`` (log-scaled knobs in log space), and a
choice knob's recommended choices become their encoded levels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tuner.encoding import UnitBoxEncoder, _encode_value
from tuner.space import Config, FloatKnob, IntKnob


@dataclass(frozen=True)
class PriorRegion:
    """The recommended region of a space, in unit-box coordinates.

    Attributes:
        lows, highs: Per coordinate, the recommended interval of a range knob (``0, 1``
            where there is none).
        levels: Per coordinate of a choice knob with recommended choices, their encoded
            levels, sorted.
    """

    lows: tuple[float, ...]
    highs: tuple[float, ...]
    levels: dict[int, tuple[float, ...]]

    @classmethod
    def of(cls, encoder: UnitBoxEncoder) -> PriorRegion | None:
        """The region of ``encoder``'s space, or None when no knob recommends anything."""
        lows, highs = [0.0] * encoder.d, [1.0] * encoder.d
        levels: dict[int, tuple[float, ...]] = {}
        for i, dim in enumerate(encoder.dims):
            knob = dim.knob
            if not knob.recommended:
                continue
            if isinstance(knob, FloatKnob | IntKnob):
                low, high = knob.recommended
                lows[i], highs[i] = _encode_value(knob, low), _encode_value(knob, high)
            else:
                levels[i] = tuple(sorted(_encode_value(knob, v) for v in knob.recommended))
        if lows == [0.0] * encoder.d and highs == [1.0] * encoder.d and not levels:
            return None
        return cls(tuple(lows), tuple(highs), levels)

    @property
    def d(self) -> int:
        return len(self.lows)

    def squeeze(self, points: torch.Tensor) -> torch.Tensor:
        """Map ``n x d`` points of the unit box into the region, keeping their spread.

        Range coordinates are mapped affinely onto their interval; a choice coordinate picks
        one of the recommended levels by which of ``m`` equal parts of ``[0, 1]`` it is in.
        """
        low = torch.tensor(self.lows, dtype=points.dtype)
        high = torch.tensor(self.highs, dtype=points.dtype)
        out = low + points * (high - low)
        for i, allowed in self.levels.items():
            m = len(allowed)
            index = (points[:, i] * m).long().clamp(0, m - 1)
            out[:, i] = torch.tensor(allowed, dtype=points.dtype)[index]
        return out

    def bounds(self) -> torch.Tensor:
        """``2 x d`` box of the region (choice coordinates span their recommended levels)."""
        lows, highs = list(self.lows), list(self.highs)
        for i, allowed in self.levels.items():
            lows[i], highs[i] = allowed[0], allowed[-1]
        return torch.tensor([lows, highs], dtype=torch.float64)

    def contains(self, encoder: UnitBoxEncoder, config: Config) -> bool:
        """Whether ``config`` lies in the region (up to float rounding at the edges)."""
        point = encoder.encode(config)
        for i, u in enumerate(point):
            if i in self.levels:
                if not any(abs(u - v) < 1e-9 for v in self.levels[i]):
                    return False
            elif not self.lows[i] - 1e-9 <= u <= self.highs[i] + 1e-9:
                return False
        return True
