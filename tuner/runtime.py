"""Process-wide settings of the optimizer, made once at start-up.

A suggestion reads no process-wide state and changes none (``tuner/designer/steps/bo.py``), so the
few settings torch keeps per process are made here, by whoever starts the process (the
``tuner`` command, the server, a benchmark), and never during a suggestion:

* the number of torch intra-op threads, and of numpy's BLAS threads (SciPy's optimizers
  use them), through ``threadpoolctl``. One by default: a GP of a few hundred observations
  is small linear algebra, where more threads add overhead and oversubscribe a shared CPU
  (measured 11 ms against 38-120 ms per likelihood evaluation at n = 17 on 2 busy cores),
  and a server suggests for many studies at once. More help past about a thousand
  observations on idle cores (``--threads``).
* GPyTorch's and linear_operator's settings that BoTorch switches around every posterior
  (``debug`` off, ``fast_pred_var`` on, ``_fast_covar_root_decomposition`` off): they are
  class attributes of the process, not of a thread, so while one study computes a posterior
  another one's could see them switched back half-way. Set here to the values BoTorch
  would switch them to, BoTorch leaves them alone (it switches only settings at their
  defaults), and a posterior computes the same alone and next to others.
* strict mode (``strict=True``, or the environment variable ``TUNER_STRICT=1``): numerical
  errors in a model-based step propagate instead of falling back to quasi-random points
  (``tuner/designer/steps/bo.py``). The test suite runs strict.
* BoTorch's fused C++ kernel for qLogNEHVI (several objectives). BoTorch 0.18 compiles it
  with the system's C++ compiler (``-O3 -march=native``) the first time a process builds
  such an acquisition, inside that suggestion: 45-100 s on this project's 2-core VM, again
  for every virtual environment (the build directory is shared, its hash is not), and a
  warning plus the plain-torch path where no compiler exists. A two-objective study's first
  suggestion then took a minute, long past a client's deadline. So the plain-torch path is
  the default and nothing is compiled; ``fused_kernels=True`` (``tuner --fused-kernels``)
  builds or loads the kernel here, at start-up, where the wait is visible and happens once.
  Both paths compute the same criterion; measured with the kernel loaded, a two-objective
  step at n = 40 took 0.70 s against 1.1-1.2 s without (``bench/NOTES.md``, "BoTorch's
  fused hypervolume kernel"). The choice is made once per process, so a study's suggestions
  never change path half-way.
* where the numerical libraries' warnings go (jitter added to a covariance, a fit that
  stopped early): into the ``py.warnings`` logger, and GPyTorch's ``NumericalWarning``
  only when debug logging is on (``tuner -v``). They are expected in normal operation;
  what matters reaches the trial as its warning.

``configure`` itself imports nothing heavy: while torch is not loaded it only records the
torch settings, and ``apply_pending`` makes them when the designer package is first
imported, so commands that never suggest start without torch (``tuner studies``, ``show``,
``ask --server``, the client).

``warm_up()`` is for long-running processes (``tuner serve``, ``tuner daemon``): it pays at
start-up what the process's first model-based suggestion would otherwise pay on top of its
own work. torch's first ``broadcast_shapes`` call (GPyTorch's means make it) imports torch's
symbolic-shapes code with sympy and mpmath, about 500 modules: 0.9-1.0 s on this project's
2-core VM, inside a client's SuggestTrials call. Short commands do not call it.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

DEFAULT_THREADS = 1
#: Numerical errors propagate instead of falling back (module doc).
STRICT = os.environ.get("TUNER_STRICT") == "1"
_blas_limit: Any = None  # kept alive for the process: the limit lasts while it exists
# torch's settings ``configure`` asked for while torch was not loaded yet: made by
# ``apply_pending`` when the designer is first imported (``tuner/designer/__init__.py``),
# so a command that never suggests (``tuner studies``, the client) never imports torch
_pending: dict[str, Any] | None = None


def configure(
    threads: int | None = DEFAULT_THREADS,
    warnings_to_log: bool = True,
    strict: bool = False,
    fused_kernels: bool = False,
) -> None:
    """Set torch's intra-op threads (None: leave torch's choice), route warnings to logging
    (a test runner keeps its own) and choose the qLogNEHVI path (``fused_kernels``: build
    or load BoTorch's C++ kernel now; module doc). Call once, before any suggestion.

    Results depend on the thread count in the last digits (reductions split differently),
    and with more than one thread also on what runs beside a suggestion: with one thread a
    suggestion is the same alone and next to others.
    """
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ValueError(f"threads: got {threads!r}; allowed: an integer >= 1")
    global STRICT, _pending
    STRICT = STRICT or strict
    if warnings_to_log:
        logging.captureWarnings(True)
        noted = logging.getLogger("py.warnings")
        if not any(isinstance(f, _ExpectedNotes) for f in noted.filters):
            noted.addFilter(_ExpectedNotes())
    _pending = {"threads": threads, "fused_kernels": fused_kernels}
    if sys.modules.get("torch") is not None:  # already loaded: nothing to save by waiting
        apply_pending()


def apply_pending() -> None:
    """Make the torch settings ``configure`` asked for, if it did and they are not made yet
    (importing torch). The designer package calls it when it is first imported."""
    global _pending, _blas_limit
    if _pending is None:
        return
    settings, _pending = _pending, None
    import gpytorch.settings
    import linear_operator.settings
    import scipy.linalg  # noqa: F401  (loads SciPy's own BLAS, so the limit below reaches it)
    import torch
    from threadpoolctl import threadpool_limits

    if settings["threads"] is not None:
        torch.set_num_threads(settings["threads"])
        _blas_limit = threadpool_limits(limits=settings["threads"])
    gpytorch.settings.debug._set_state(False)
    gpytorch.settings.fast_pred_var._set_state(True)
    linear_operator.settings._fast_covar_root_decomposition._set_state(False)
    _hypervolume_kernel(settings["fused_kernels"])


class _ExpectedNotes(logging.Filter):
    """Lets the numerical libraries' expected notes (module doc) through only when debug
    logging is on: a jitter added to a covariance is their designed fallback, and a trial
    measured several times trains equal rows, whose joint posterior often needs one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "NumericalWarning" in record.getMessage():
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def current() -> dict[str, Any]:
    """The settings ``configure`` made in this process, as its keyword arguments: what a
    worker process of the server applies so that it suggests as this process would."""
    import torch
    from botorch.acquisition.multi_objective import logei

    apply_pending()
    return {
        "threads": torch.get_num_threads(),
        "strict": STRICT,
        "fused_kernels": getattr(logei, "_C", None) is not None,
    }


def warm_up() -> None:
    """Import now what a process's first model-based suggestion would (module doc)."""
    import torch

    apply_pending()
    torch.broadcast_shapes((1,), (1,))


def _hypervolume_kernel(fused: bool) -> None:
    """Load (compiling if needed) BoTorch's fused qLogNEHVI kernel, or make sure BoTorch
    never tries: it attempts the load once per process and keeps the outcome in two module
    globals (``_load_attempted``, ``_C``), which is all this sets."""
    from botorch.acquisition.multi_objective import logei

    if not hasattr(logei, "_try_load_fused_kernel"):
        return  # a BoTorch without the kernel: nothing to choose
    if fused:
        if logei._C is None:
            logging.getLogger(__name__).warning(
                "loading BoTorch's fused qLogNEHVI kernel (the first time: a C++ build of "
                "about a minute)"
            )
            logei._load_attempted = False
            logei._try_load_fused_kernel()
    else:
        logei._C = None
        logei._load_attempted = True
