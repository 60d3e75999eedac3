"""The latency benchmark's peers, each in a child process that times its own steps.

A peer step can take minutes (scikit-optimize refits its GP from scratch on every point; Ax
refits and optimizes with many restarts), and a step already running in this process cannot
be stopped. So every peer runs in a child process, and the parent kills the child when a step
runs past its limit; that peer's cell then reads "capped" instead of holding up the run. The
child times each step itself with ``time.perf_counter`` around the library calls only; the
parent waits for the reply before timing our next step, so the two sides still take turns
on the machine.

This file is both halves of a JSON-lines bridge over the child's stdin/stdout (the pattern of
``bench/mlos_peer.py``):

* ``init`` (peer name, knobs, the first ``n - 1`` configurations and values, seed,
  threads, and for a constrained space the ``constraint``: metric, bound and the first
  ``n - 1`` values) -> versions and setup seconds: the child tells the peer those points,
  untimed;
* ``warmup`` -> seconds: one untimed suggestion at ``n - 1`` where the peer keeps state
  between steps, as our side's ``FitCache`` is warmed;
* ``step`` (configuration ``m``, its value and its constraint metric) -> seconds and the kind
  of suggestion;
* ``close``.

What a step times, per peer (each with its library defaults otherwise):

* ``skopt``: ``Optimizer(dimensions, base_estimator="GP", acq_func="EI",
  n_initial_points=10, random_state=seed)``; timed: ``tell(x_m, y_m)`` (refits the GP and
  optimizes EI) + ``ask()``. No warm-up: nothing carries over between its steps.
* ``optuna``: ``create_study(sampler=GPSampler(seed=seed))``; the point is added untimed
  (``add_trial``), then ``study.ask(fixed_distributions)`` is timed, which samples every
  knob (GPSampler fits its GP, warm-started from the previous fit's kernel parameters, and
  optimizes logEI there; a bare ``ask()`` defers all of that to the first ``suggest_*``);
  the asked trial is told FAIL, so it never enters the history.
* ``ax``: ``Client(random_seed=seed)`` with the default generation strategy (Ax picks it:
  center point, Sobol, then ``MBM``, BoTorch); the point is attached and completed untimed
  (``attach_trial``, ``complete_trial``), then ``get_next_trials(1)`` is timed; the new
  trial is marked failed (Ax neither trains on a failed trial nor counts it as pending).
  Warm-up: suggestions at ``n - 1`` until one comes from ``MBM`` (the first is the center
  of the box, which Ax always proposes first).

On a constrained space (``c <= bound``) Optuna's trials carry ``constraints={"c": c - bound}``
(GPSampler then fits a GP to the constraint and uses constrained logEI) and Ax's experiment has
the outcome constraint ``c <= bound`` with ``c`` in every trial's data (its default strategy
then uses qLogNEI with the constraint, as ours does). scikit-optimize has no outcome
constraints, so it does not run there (``CONSTRAINED_PEERS``).

Every child imports only the standard library at module level; the peer's library is
imported inside, so a peer can live in another environment (``--ax-python``).
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

if __name__ == "__main__":  # the child, run as a script: bench.bridge is a sibling file
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import bridge

CHILD = Path(__file__).resolve()
PEERS = ("skopt", "optuna", "ax")
PACKAGES = {
    "skopt": ("scikit-optimize", "scikit-learn", "numpy"),
    "optuna": ("optuna", "torch", "scipy", "numpy"),
    "ax": ("ax-platform", "botorch", "gpytorch", "torch"),
}
INSTALL = {
    "skopt": "pip install scikit-optimize",
    "optuna": "pip install -e '.[dev]' (optuna>=4 with torch)",
    "ax": "pip install -e '.[dev]' (ax-platform 1.3.1, which pins botorch 0.18.1)",
}
CONSTRAINED_PEERS = ("optuna", "ax")  # peers that take an outcome constraint
SKOPT_INITIAL = 10
_STDERR_TAIL = 2000


class PeerUnavailable(RuntimeError):
    """The peer's library cannot be imported (the message says how to install it)."""


class PeerError(RuntimeError):
    """The peer failed while running (its message and stderr tail attached)."""


class PeerCapped(RuntimeError):
    """A call ran past its time limit; the child was killed."""


class PeerProcess:
    """One peer in a child process: ``init`` at construction, then ``step`` per point.

    Args:
        peer: One of ``PEERS``.
        python: The interpreter whose environment has the peer's library.
        setup: ``knobs``, ``configs``, ``values`` (the first ``n - 1`` points), ``seed``.
        threads: Threads for the child's torch and BLAS (None: their defaults).
        limit: Seconds the child may take for ``init`` (telling the points).

    Raises:
        PeerCapped: ``init`` ran past ``limit``.
    """

    def __init__(
        self,
        peer: str,
        python: str,
        setup: dict[str, Any],
        threads: int | None,
        limit: float,
    ) -> None:
        env = bridge.thread_env(threads)
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115  (closed in close)
        self._proc = subprocess.Popen(
            [python, str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
        )
        self.peer = peer
        try:
            self.info = self._call({"op": "init", "peer": peer, "threads": threads, **setup}, limit)
        except BaseException:
            self.close()
            raise

    def warm_up(self, limit: float) -> float:
        """The untimed suggestion at ``n - 1`` (its seconds; 0 for a stateless peer)."""
        return float(self._call({"op": "warmup"}, limit)["seconds"])

    def step(
        self,
        config: dict[str, Any],
        value: float,
        limit: float,
        constraint: float | None = None,
    ) -> tuple[float, str]:
        """Tell the peer one more point (with its constraint metric on a constrained space)
        and time its next suggestion: ``(seconds, kind)``.

        Raises:
            PeerCapped: the step ran past ``limit`` (the child is gone afterwards).
        """
        message = {"op": "step", "config": config, "value": value, "constraint": constraint}
        reply = self._call(message, limit)
        return float(reply["seconds"]), str(reply["kind"])

    def close(self) -> None:
        """Stop the child (idempotent)."""
        if self._proc.poll() is None:
            with contextlib.suppress(PeerError, PeerCapped):
                self._call({"op": "close"}, 30.0)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
        for pipe in (self._proc.stdin, self._proc.stdout, self._stderr):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):  # a dead child's stdin: broken pipe
                    pipe.close()

    def __enter__(self) -> PeerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, message: dict[str, Any], limit: float) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the child is gone; readline below reports it
        ready, _, _ = select.select([self._proc.stdout], [], [], limit)
        if not ready:
            self._kill()
            raise PeerCapped(f"{self.peer}: {message['op']} ran past {limit:.0f} s")
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait(timeout=10)
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            raise PeerError(
                f"{self.peer} {how} on {message['op']!r}; stderr:\n{self._stderr_tail()}"
            )
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise PeerError(f"{self.peer} failed on {message['op']!r}: {reply['error']}")
        return reply

    def _kill(self) -> None:
        self._proc.kill()
        self._proc.wait()

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-_STDERR_TAIL:]


def probe(peer: str, python: str) -> dict[str, str | None]:
    """The peer's package versions; raises ``PeerUnavailable`` with the reason."""
    if peer not in PEERS:
        raise ValueError(f"peer must be one of {PEERS}, got {peer!r}")
    if not Path(python).exists():
        raise PeerUnavailable(f"{python} not found")
    try:
        done = subprocess.run(
            [python, str(CHILD), "--probe", peer], capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise PeerUnavailable(f"{python} does not run: {err}") from err
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PeerUnavailable(f"cannot import {peer} ({last}): {INSTALL[peer]}")
    versions: dict[str, str | None] = json.loads(done.stdout)
    return versions


# -- child side --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Serve the protocol on stdin/stdout (``--probe PEER``: print versions and exit)."""
    args = sys.argv[1:] if argv is None else argv
    protocol = sys.stdout
    sys.stdout = sys.stderr  # library output must not corrupt the protocol
    if len(args) == 2 and args[0] == "--probe":
        _import(args[1])
        protocol.write(json.dumps(_versions(args[1])) + "\n")
        return 0
    peer: Any = None
    for line in sys.stdin:
        message = json.loads(line)
        op = message.get("op")
        try:
            if op == "init":
                start = time.perf_counter()
                peer = _PEER_CLASSES[message["peer"]](message)
                reply = {
                    "versions": _versions(message["peer"]),
                    "setup_s": time.perf_counter() - start,
                }
            elif op == "warmup":
                reply = {"seconds": peer.warm_up()}
            elif op == "step":
                seconds, kind = peer.step(
                    message["config"], float(message["value"]), message.get("constraint")
                )
                reply = {"seconds": seconds, "kind": kind}
            elif op == "close":
                reply = {"ok": True}
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as err:  # reported to the parent, which raises PeerError
            reply = {"error": f"{type(err).__name__}: {err}"}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()
        if op == "close":
            break
    return 0


class _Skopt:
    def __init__(self, message: dict[str, Any]) -> None:
        import warnings

        from skopt import Optimizer
        from skopt.space import Categorical, Integer, Real

        _limit_threads(message.get("threads"))
        dims: list[Any] = []
        for knob in message["knobs"]:
            if knob["kind"] == "float":
                dims.append(Real(knob["low"], knob["high"], name=knob["name"]))
            elif knob["kind"] == "int":
                dims.append(Integer(knob["low"], knob["high"], name=knob["name"]))
            else:
                dims.append(Categorical(knob["choices"], name=knob["name"]))
        self.names = [k["name"] for k in message["knobs"]]
        self.optimizer = Optimizer(
            dimensions=dims,
            base_estimator="GP",
            acq_func="EI",
            n_initial_points=SKOPT_INITIAL,
            random_state=message["seed"],
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sklearn convergence notes on the GP fit
            points = [self._point(c) for c in message["configs"]]
            self.optimizer.tell(points, list(message["values"]))

    def warm_up(self) -> float:
        return 0.0  # refits from scratch on every tell: nothing to warm

    def step(
        self, config: dict[str, Any], value: float, constraint: float | None
    ) -> tuple[float, str]:
        import warnings

        if constraint is not None:
            raise ValueError("scikit-optimize has no outcome constraints")
        point = self._point(config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            self.optimizer.tell(point, value)
            self.optimizer.ask()
            return time.perf_counter() - start, "gp"

    def _point(self, config: dict[str, Any]) -> list[Any]:
        return [config[name] for name in self.names]


class _Optuna:
    def __init__(self, message: dict[str, Any]) -> None:
        import optuna
        from optuna.distributions import (
            BaseDistribution,
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        _limit_threads(message.get("threads"))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.distributions: dict[str, BaseDistribution] = {}
        for knob in message["knobs"]:
            name = knob["name"]
            if knob["kind"] == "float":
                self.distributions[name] = FloatDistribution(knob["low"], knob["high"])
            elif knob["kind"] == "int":
                self.distributions[name] = IntDistribution(knob["low"], knob["high"])
            else:
                self.distributions[name] = CategoricalDistribution(knob["choices"])
        sampler = optuna.samplers.GPSampler(seed=message["seed"])
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self.constraint = message.get("constraint")
        self.study.add_trials([self._trial(c, v, b) for c, v, b in _told(message)])

    def warm_up(self) -> float:
        return self._suggest()  # GPSampler keeps its last kernel parameters

    def step(
        self, config: dict[str, Any], value: float, constraint: float | None
    ) -> tuple[float, str]:
        self.study.add_trial(self._trial(config, value, constraint))
        return self._suggest(), "gp"

    def _suggest(self) -> float:
        start = time.perf_counter()
        trial = self.study.ask(fixed_distributions=self.distributions)  # samples every knob
        seconds = time.perf_counter() - start
        self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        return seconds

    def _trial(self, config: dict[str, Any], value: float, constraint: float | None) -> Any:
        constraints = None
        if self.constraint is not None:  # Optuna: feasible when <= 0
            assert constraint is not None
            constraints = {self.constraint["metric"]: constraint - self.constraint["bound"]}
        return self.optuna.trial.create_trial(
            params=dict(config),
            distributions=self.distributions,
            value=value,
            constraints=constraints,
        )


class _Ax:
    _WARMUP_CALLS = 3

    def __init__(self, message: dict[str, Any]) -> None:
        import logging

        from ax.api.client import Client
        from ax.api.configs import ChoiceParameterConfig, RangeParameterConfig

        _limit_threads(message.get("threads"))
        logging.getLogger("ax").setLevel(logging.WARNING)
        parameters: list[Any] = []
        for knob in message["knobs"]:
            if knob["kind"] in ("float", "int"):
                parameters.append(
                    RangeParameterConfig(
                        name=knob["name"],
                        bounds=(knob["low"], knob["high"]),
                        parameter_type=knob["kind"],
                    )
                )
            else:
                parameters.append(
                    ChoiceParameterConfig(
                        name=knob["name"],
                        values=list(knob["choices"]),
                        parameter_type="str",
                        is_ordered=False,
                    )
                )
        self.client = Client(random_seed=message["seed"])
        self.client.configure_experiment(parameters=parameters)
        self.constraint = message.get("constraint")
        if self.constraint is None:
            self.client.configure_optimization(objective="-f")
        else:
            bound = f"{self.constraint['metric']} <= {self.constraint['bound']}"
            self.client.configure_optimization(objective="-f", outcome_constraints=[bound])
        for config, value, constraint in _told(message):
            self._add(config, value, constraint)

    def warm_up(self) -> float:
        start = time.perf_counter()
        for _ in range(self._WARMUP_CALLS):  # the center point first, then a model fit
            if self._suggest()[1] == "MBM":
                break
        return time.perf_counter() - start

    def step(
        self, config: dict[str, Any], value: float, constraint: float | None
    ) -> tuple[float, str]:
        self._add(config, value, constraint)
        return self._suggest()

    def _add(self, config: dict[str, Any], value: float, constraint: float | None) -> None:
        index = self.client.attach_trial(parameters=dict(config))
        data = {"f": value}
        if self.constraint is not None:
            assert constraint is not None
            data[self.constraint["metric"]] = constraint
        self.client.complete_trial(index, raw_data=data)

    def _suggest(self) -> tuple[float, str]:
        start = time.perf_counter()
        trials = self.client.get_next_trials(max_trials=1)
        seconds = time.perf_counter() - start
        (index,) = trials
        trial = self.client._experiment.trials[index]  # the node that generated it
        node = str(getattr(trial.generator_runs[0], "_generation_node_name", "?"))
        self.client.mark_trial_failed(index)
        return seconds, node


def _told(message: dict[str, Any]) -> Any:
    """The ``init`` message's points: ``(configuration, value, constraint metric or None)``."""
    constraint = message.get("constraint")
    told = constraint["values"] if constraint else [None] * len(message["values"])
    return zip(message["configs"], message["values"], told, strict=True)


_PEER_CLASSES: dict[str, Any] = {"skopt": _Skopt, "optuna": _Optuna, "ax": _Ax}


def _import(peer: str) -> None:
    """Import the peer's library (fails when the environment lacks it)."""
    if peer == "skopt":
        import skopt  # noqa: F401
    elif peer == "optuna":
        import torch  # noqa: F401  (GPSampler needs it)
        from optuna.samplers import GPSampler  # noqa: F401
    elif peer == "ax":
        from ax.api.client import Client  # noqa: F401
    else:
        raise ValueError(f"unknown peer {peer!r}")


def _limit_threads(threads: int | None) -> None:
    if threads is None:
        return
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(int(threads))
    globals()["_thread_limiter"] = threadpool_limits(limits=int(threads))


def _versions(peer: str) -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in PACKAGES[peer]:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


if __name__ == "__main__":
    raise SystemExit(main())
