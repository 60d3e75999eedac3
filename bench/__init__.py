"""Side-by-side benchmarks of the tuner's designer against peer optimizers.

Each benchmark runs our code and a peer on the same problems and seeds in one process and
prints a ratio table (``python -m bench.latency``, ``python -m bench.synthetic``); results are
written under ``bench/results/``. See ``bench/README.md``.
"""
