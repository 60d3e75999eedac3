"""Running studies on targets: the one trial loop and the measurement protocol.

The layer between the targets and the service: one trial loop (``runner.loop``) drives a
target through any object with the service's methods (``runner.loop.TuningAPI``: the
in-process ``TuningService``, a ``TunerClient``, or ``runner.memory.MemoryAPI`` for
benchmarks and tests), for sessions and the daemon alike, and measures every trial through
one protocol (``runner.measurement``; the closing confirmation is ``runner.confirm``). It
imports ``tuner``, ``knobs`` and ``targets``, never ``server``; benchmarks may import it.
"""
