"""The suite's methods, one runner module per method: ``RUNNERS[name].run(problem, seed, budget)``.

Every module exposes ``NAME``, ``available() -> str | None`` (None when usable, else the
reason: a missing library or environment) and ``run(problem, seed, budget, on_eval=None) ->
MethodRun`` (``bench.contract``). The peers:

======================  =============================================================
``random``              uniform over each knob's scale, or the candidates shuffled
``skopt``               scikit-optimize ``Optimizer`` (GP), ask/tell
``optuna-tpe``          Optuna ``TPESampler``, ask/tell, ``constraints_func``
``optuna-gp``           Optuna ``GPSampler``, ask/tell, ``constraints_func``
``ax``                  Ax ``Client`` with its default generation strategy
``mlos``                mlos-core SMAC (LlamaTune adapter when the problem embeds), own venv
``ours``                our designer (``bench/peers/ours.py``), listed when that file exists
``ours-portfolio``      ours with ``designer.portfolio = true`` (the forest, EXPLORE)
``ours-full``           ours without the LlamaTune embedding (the product's default)
``ours-protocol``       ours through the session's measurement protocol (repeats, race,
                        posterior ranking, confirmation) on the same measurement budget
``ours-stop``           ours with early stopping on a simulated progression of windows,
                        at equal measured time (a stopped trial costs what it ran)
``ours-screen``         ``ours-stop`` with the short-window screen
======================  =============================================================

Modules are imported on first use, so listing the names costs nothing; each module imports
its library only inside ``run``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

_MODULES = {
    "random": "random",
    "skopt": "skopt",
    "optuna-tpe": "optuna_tpe",
    "optuna-gp": "optuna_gp",
    "ax": "ax",
    "mlos": "mlos",
    "ours": "ours",
    "ours-portfolio": "ours_portfolio",
    "ours-full": "ours_full",
    "ours-protocol": "ours_protocol",
    "ours-stop": "ours_stop",
    "ours-screen": "ours_screen",
}


class _Registry(Mapping[str, ModuleType]):
    """Name -> runner module, imported on first access; ``ours`` only when its file exists."""

    def __init__(self) -> None:
        here = Path(__file__).resolve().parent
        self._names = tuple(n for n, m in _MODULES.items() if (here / f"{m}.py").exists())
        self._loaded: dict[str, ModuleType] = {}

    def __getitem__(self, name: str) -> ModuleType:
        if name not in self._names:
            raise KeyError(f"unknown method {name!r}; known: {', '.join(self._names)}")
        if name not in self._loaded:
            self._loaded[name] = importlib.import_module(f"{__name__}.{_MODULES[name]}")
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


RUNNERS: Mapping[str, ModuleType] = _Registry()
