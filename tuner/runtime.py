"""Process-wide settings of the optimizer, made once at start-up.

A suggestion reads no process-wide state and changes none (``tuner/designer/bo.py``), so the
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
  (``tuner/designer/bo.py``). The test suite runs strict.
* where the numerical libraries' warnings go (jitter added to a covariance, a fit that
  stopped early): into the ``py.warnings`` logger, not the terminal. They are expected in
  normal operation; what matters reaches the trial as its warning.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import gpytorch.settings
import linear_operator.settings
import scipy.linalg  # noqa: F401  (loads SciPy's own BLAS, so the limit below reaches it)
import torch
from threadpoolctl import threadpool_limits

DEFAULT_THREADS = 1
#: Numerical errors propagate instead of falling back (module doc).
STRICT = os.environ.get("TUNER_STRICT") == "1"
_blas_limit: Any = None  # kept alive for the process: the limit lasts while it exists


def configure(
    threads: int | None = DEFAULT_THREADS, warnings_to_log: bool = True, strict: bool = False
) -> None:
    """Set torch's intra-op threads (None: leave torch's choice) and route warnings to
    logging (a test runner keeps its own). Call once, before any suggestion.

    Results depend on the thread count in the last digits (reductions split differently),
    and with more than one thread also on what runs beside a suggestion: with one thread a
    suggestion is the same alone and next to others.
    """
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads: got {threads!r}; allowed: an integer >= 1")
        torch.set_num_threads(threads)
        global _blas_limit
        _blas_limit = threadpool_limits(limits=threads)
    global STRICT
    STRICT = STRICT or strict
    gpytorch.settings.debug._set_state(False)
    gpytorch.settings.fast_pred_var._set_state(True)
    linear_operator.settings._fast_covar_root_decomposition._set_state(False)
    if warnings_to_log:
        logging.captureWarnings(True)
