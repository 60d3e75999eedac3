"""An inference workload to tune: a model built in code, served in batches, timed per batch.

Run it as a program (the workload command of the ``cpufreq`` or ``command`` targets)::

    python -m targets.workloads.inference --model encoder --batch 8 --threads 2 --seconds 5
    {"requests": 1184, "requests_per_s": 236.5, "p50_ms": 33.6, "p99_ms": 41.2, ...}

The model is built in code with seeded random weights (nothing is downloaded): ``encoder``,
a 4-layer Transformer encoder (d_model 256, 4 heads, sequence 64; BERT-small-like work per
request), or ``cnn``, a small ResNet-style network on 3x64x64 images. Each batch carries
``--batch`` requests; a request's latency is its batch's (the requests of a batch arrive
together and finish together), so larger batches trade latency for throughput, and
``--threads`` sets torch's intra-op threads. After ``--warmup-s`` of untimed batches it runs
for ``--seconds`` and prints one JSON line: ``requests``, ``requests_per_s``, ``p50_ms``,
``p99_ms`` (per-request latency percentiles), ``batches``, ``seconds``, and the timed
window as ``window_start_s`` / ``window_end_s`` (``time.monotonic()``), which a metering
target uses to leave start-up and warm-up out of the energy. ``--device``
``auto`` (default) uses CUDA when torch sees a GPU, else the CPU.

**Progress** (``--progress-every N``, closed loop): after every ``N`` timed batches a line
``progress: requests_per_s=... p99_ms=...`` for that group of batches, before the JSON
line: a command target with ``progress = 'requests_per_s=(?P<requests_per_s>[0-9.e+]+)
p99_ms=(?P<p99_ms>[0-9.e+]+)'`` reports them as the measurement's windows (and the study
may stop a losing trial early).

**Open loop** (``--rate R`` requests per second, or ``--rate-file PATH`` holding that number,
read at start: a daemon's load that another process changes): requests arrive as a seeded
Poisson process instead of back to back. The server takes every request that has arrived,
up to ``--batch`` of them, as one batch, and idles until the next arrival when none is
waiting; a request's latency runs from its arrival to its batch's end, so it includes
queueing. At a rate the device serves, ``requests_per_s`` is about the rate and the clocks
decide latency and energy; above it the queue grows and p99 with it (PolyThrottle's
setting: the least energy per request that still meets the SLO at the current load).
``offered_per_s`` is the rate asked for (in closed loop: absent).

Energy per request is added by the target that meters the run: ``energy_j / requests``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
from torch import nn

MODELS = ("encoder", "cnn")
MAX_ARRIVALS = 10_000_000  # requests in one open-loop window (their times are held in memory)


def build_model(name: str, seed: int = 0) -> tuple[nn.Module, tuple[int, ...]]:
    """The model and the shape of one request's input."""
    torch.manual_seed(seed)
    if name == "encoder":
        layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
        return nn.TransformerEncoder(layer, 4, enable_nested_tensor=False), (64, 256)
    if name == "cnn":

        def block(channels_in: int, channels_out: int) -> nn.Module:
            return nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 3, stride=2, padding=1),
                nn.BatchNorm2d(channels_out),
                nn.ReLU(),
                nn.Conv2d(channels_out, channels_out, 3, padding=1),
                nn.BatchNorm2d(channels_out),
                nn.ReLU(),
            )

        model = nn.Sequential(
            block(3, 32),
            block(32, 64),
            block(64, 128),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(128, 10),
        )
        return model, (3, 64, 64)
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def serve(
    model: nn.Module,
    shape: tuple[int, ...],
    batch: int,
    seconds: float,
    warmup_s: float,
    device: torch.device,
    progress_every: int = 0,
) -> dict[str, float]:
    """Run batches for ``warmup_s`` untimed, then ``seconds`` timed; the metrics. With
    ``progress_every``, a progress line after every that many timed batches (module doc)."""
    model = model.to(device).eval()
    inputs = torch.randn(batch, *shape, device=device)
    latencies: list[float] = []

    def one() -> float:
        started = time.perf_counter()
        with torch.inference_mode():
            model(inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        one()
    window_start = time.monotonic()
    started = group = time.perf_counter()
    while not latencies or time.perf_counter() - started < seconds:
        latencies.append(one())
        if progress_every and len(latencies) % progress_every == 0:
            now = time.perf_counter()
            last = latencies[-progress_every:]
            print(f"progress: requests_per_s={batch * len(last) / (now - group):.6g} "
                  f"p99_ms={1000 * percentile(last, 99):.6g}", flush=True)  # fmt: skip
            group = now
    elapsed = time.perf_counter() - started
    window_end = time.monotonic()
    requests = batch * len(latencies)
    return _window(window_start, window_end, requests, elapsed, latencies, len(latencies))


def _window(
    start: float, end: float, requests: int, elapsed: float, latencies: list[float], batches: int
) -> dict[str, float]:
    """The metrics of a timed window (module doc), latencies in seconds."""
    return {
        "window_start_s": start,
        "window_end_s": end,
        "requests": float(requests),
        "requests_per_s": requests / elapsed,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99),
        "batches": float(batches),
        "seconds": elapsed,
    }


def serve_open_loop(
    model: nn.Module,
    shape: tuple[int, ...],
    batch: int,
    rate: float,
    seconds: float,
    warmup_s: float,
    device: torch.device,
    seed: int = 0,
) -> dict[str, float]:
    """Serve Poisson arrivals at ``rate`` per second for ``seconds`` after ``warmup_s`` of
    untimed full batches; batches of up to ``batch`` waiting requests (module doc). Requests
    are timed from arrival to their batch's end. No batch starts after the window; a request
    still waiting then counts with the time it has waited (a lower bound: over capacity,
    p99 grows with the window) and as ``unserved``."""
    model = model.to(device).eval()
    inputs = torch.randn(batch, *shape, device=device)

    def run(size: int) -> None:
        with torch.inference_mode():
            model(inputs[:size])
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        for size in {1, batch}:  # both ends of the batch sizes the window will see
            run(size)
    generator = torch.Generator().manual_seed(seed)
    count = int(rate * seconds) + 1
    gaps = torch.empty(4 * count + 64, dtype=torch.float64).exponential_(rate, generator=generator)
    offsets = [t for t in torch.cumsum(gaps, 0).tolist() if t < seconds] or [0.0]
    window_start = time.monotonic()
    started = time.perf_counter()
    latencies: list[float] = []
    batches = 0
    next_request = 0
    while next_request < len(offsets):
        now = time.perf_counter() - started
        if now >= seconds:
            break
        if offsets[next_request] > now:
            time.sleep(offsets[next_request] - now)  # idle until the next arrival
            now = time.perf_counter() - started
        waiting = next_request
        while waiting < len(offsets) and offsets[waiting] <= now and waiting - next_request < batch:
            waiting += 1
        run(waiting - next_request)
        done = time.perf_counter() - started
        latencies.extend(done - offsets[i] for i in range(next_request, waiting))
        batches += 1
        next_request = waiting
    elapsed = max(time.perf_counter() - started, seconds)
    window_end = time.monotonic()
    served = len(latencies)
    latencies.extend(elapsed - offsets[i] for i in range(next_request, len(offsets)))
    metrics = _window(window_start, window_end, served, elapsed, latencies, batches)
    return {**metrics, "offered_per_s": rate, "unserved": float(len(offsets) - served)}


def read_rate(path: str) -> float:
    """The request rate in ``path`` (one positive number)."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read().strip()
    try:
        rate = float(text)
    except ValueError:
        raise ValueError(f"{path}: expected a request rate (a number), got {text!r}") from None
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"{path}: the request rate must be a positive number, got {text!r}")
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m targets.workloads.inference", description=__doc__
    )
    parser.add_argument("--model", choices=MODELS, default="encoder")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--progress-every", type=int, default=0,
        help="closed loop: a progress line after every N timed batches (0: none)",
    )  # fmt: skip
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="open loop: requests per second")
    load.add_argument("--rate-file", help="open loop: a file holding requests per second")
    args = parser.parse_args(argv)
    if (
        args.batch < 1 or args.threads < 1 or args.seconds <= 0 or args.warmup_s < 0
        or args.progress_every < 0
    ):  # fmt: skip
        print("batch and threads must be >= 1, seconds > 0, warmup-s and progress-every >= 0",
              file=sys.stderr)  # fmt: skip
        return 2
    rate = args.rate
    if args.rate_file is not None:
        try:
            rate = read_rate(args.rate_file)
        except (OSError, ValueError) as error:
            print(f"rate-file: {error}", file=sys.stderr)
            return 2
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        print(f"rate must be a positive number of requests per second, got {rate}", file=sys.stderr)
        return 2
    if rate is not None and rate * args.seconds > MAX_ARRIVALS:
        print(f"rate x seconds must be at most {MAX_ARRIVALS:.0e} requests", file=sys.stderr)
        return 2
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(args.threads)
    model, shape = build_model(args.model, args.seed)
    device = torch.device(name)
    if rate is None:
        metrics = serve(
            model, shape, args.batch, args.seconds, args.warmup_s, device, args.progress_every
        )
    else:
        metrics = serve_open_loop(
            model, shape, args.batch, rate, args.seconds, args.warmup_s, device, args.seed
        )
    print(json.dumps({**metrics, "device": name}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
