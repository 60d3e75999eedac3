"""Running studies on targets: the session loop and the measurement protocol.

The layer between the targets and the service: it drives a target through any object with
the service's methods (``runner.session.TuningAPI``: the in-process ``TuningService``, a
``TunerClient``, or ``runner.memory.MemoryAPI`` for benchmarks), and measures every trial
through one protocol (``runner.measurement``). It imports ``tuner``, ``knobs`` and
``targets``, never ``server``; benchmarks may import it.
"""
