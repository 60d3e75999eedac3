"""Helpers the acquisition tests share: an acquisition's value and gradient, and a spy that
records whether a fast path answered (returned something) or handed over (returned None)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
from botorch.acquisition import AcquisitionFunction

from tuner.designer.fast.shared_rows import shared_rows

ValueAndGradient = Callable[[AcquisitionFunction, torch.Tensor, bool], tuple[torch.Tensor, ...]]
PathTaken = Callable[[ModuleType, str], list[bool]]


def _value_and_gradient(
    acquisition: AcquisitionFunction, X: torch.Tensor, shared: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The acquisition's values at ``X`` and the gradient of their sum, inside
    ``shared_rows`` when ``shared``."""
    inputs = X.clone().requires_grad_(True)
    if shared:
        with shared_rows(acquisition):
            value = acquisition(inputs)
    else:
        value = acquisition(inputs)
    (gradient,) = torch.autograd.grad(value.sum(), inputs)
    return value.detach(), gradient


@pytest.fixture
def value_and_gradient() -> ValueAndGradient:
    return _value_and_gradient


@pytest.fixture
def path_taken(monkeypatch: pytest.MonkeyPatch) -> PathTaken:
    """``path_taken(module, name)`` wraps ``module.name`` for the test and returns the list
    it appends to on every call: True where the function answered, False where it gave None."""

    def spy(module: ModuleType, name: str) -> list[bool]:
        original = getattr(module, name)
        taken: list[bool] = []

        def wrapper(*args: Any) -> Any:
            result = original(*args)
            taken.append(result is not None)
            return result

        monkeypatch.setattr(module, name, wrapper)
        return taken

    return spy
