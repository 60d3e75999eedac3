"""A pipeline-parallel training workload: one model split into stages, one device per stage.

Run it as a program (the workload command of the ``nvgpu`` target with ``devices``)::

    python -m targets.workloads.pipeline --devices cuda:0,cuda:1,cuda:2,cuda:3 --layers 6,6,4,2
    {"samples": 24576, "samples_per_s": 4915.2, "step_ms_p50": 104.1, "steps": 48, ...}

The model is built in code with seeded weights (nothing is downloaded): stage ``i`` is
``layers[i]`` blocks of ``Linear(width, width)`` + GELU on device ``devices[i]``, and the last
stage ends in a 10-class head with cross-entropy on a fixed synthetic batch (labels from a
fixed random linear teacher, so the loss really falls). Each training
step is GPipe-style (Huang et al., NeurIPS 2019): the batch is cut into ``--microbatches``
micro-batches; each goes forward stage by stage, its activations copied to the next
stage's device, and backward through all stages; the gradients of all micro-batches are
accumulated and every stage takes one SGD step. On GPUs the kernels are queued
asynchronously, so the stages of different micro-batches overlap, and the slowest stage sets
the pace. Uneven ``--layers`` give the other stages slack, which is what EnvPipe (Choi et al.,
USENIX ATC 2023) turns into energy savings by lowering those GPUs' SM clocks. After
``--warmup-s`` of untimed steps it trains for ``--seconds`` and prints one JSON line:
``samples`` (as ``requests`` too, so a metering target reports energy per sample),
``samples_per_s``, ``step_ms_p50``, ``step_ms_p99``, ``steps``, ``loss``, ``seconds`` and
the timed window (``window_start_s``, ``window_end_s``, as ``targets.workloads.inference``
reports it).
Devices may repeat (``cpu,cpu``), so the workload also runs, slowly, on one CPU.
``--kinds gemm,memory,...`` gives stages of two characters (``KINDS``): on one GPU their
work runs in turn, and a memory-bound stage loses little time at a lower SM clock, which
is what switching the clock per stage in time (``targets.hardware.stage_clocks``) exploits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn

from targets.workloads.inference import percentile

CLASSES = 10


#: What a stage's blocks are (``--kinds``): ``gemm``, ``Linear(width, width)`` + GELU,
#: bound by the SM clock at large widths; ``memory``, LayerNorm + GELU, elementwise work
#: bound by memory bandwidth, whose time hardly follows the SM clock.
KINDS = ("gemm", "memory")


def build_stages(
    layers: list[int],
    width: int,
    devices: list[torch.device],
    seed: int = 0,
    kinds: list[str] | None = None,
) -> list[nn.Module]:
    """The stages, each on its device, of ``kinds`` (default all ``gemm``); the last one
    ends in the classifier head."""
    torch.manual_seed(seed)
    kinds = kinds or ["gemm"] * len(layers)
    stages: list[nn.Module] = []
    for i, (count, device, kind) in enumerate(zip(layers, devices, kinds, strict=True)):
        if kind not in KINDS:
            raise ValueError(f"stage {i}: kind {kind!r} (allowed: {', '.join(KINDS)})")
        blocks: list[nn.Module] = []
        for _ in range(count):
            first = nn.Linear(width, width) if kind == "gemm" else nn.LayerNorm(width)
            blocks += [first, nn.GELU()]
        if i == len(layers) - 1:
            blocks.append(nn.Linear(width, CLASSES))
        stages.append(nn.Sequential(*blocks).to(device))
    return stages


def train(
    stages: list[nn.Module],
    devices: list[torch.device],
    width: int,
    batch: int,
    microbatches: int,
    seconds: float,
    warmup_s: float,
    lr: float = 1e-3,
) -> dict[str, float]:
    """Train for ``warmup_s`` untimed, then ``seconds`` timed; the metrics."""
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(batch, width, generator=generator)
    teacher = torch.randn(width, CLASSES, generator=generator)  # a learnable labelling
    labels = (inputs @ teacher).argmax(dim=1).to(devices[-1])
    inputs = inputs.to(devices[0])
    optimizers = [torch.optim.SGD(stage.parameters(), lr=lr) for stage in stages]
    loss_fn = nn.CrossEntropyLoss()
    chunks = list(zip(inputs.chunk(microbatches), labels.chunk(microbatches), strict=True))

    def step() -> tuple[float, float]:
        started = time.perf_counter()
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=devices[-1])
        for x, y in chunks:
            for stage, device in zip(stages, devices, strict=True):
                x = stage(x.to(device, non_blocking=True))
            loss = loss_fn(x, y) * (len(y) / batch)
            loss.backward()
            total += loss.detach()
        for optimizer in optimizers:
            optimizer.step()
        value = float(total)  # waits for every stage's queued work
        for device in {d for d in devices if d.type == "cuda"}:
            torch.cuda.synchronize(device)
        return time.perf_counter() - started, value

    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        step()
    times: list[float] = []
    loss = 0.0
    window_start = time.monotonic()
    started = time.perf_counter()
    while not times or time.perf_counter() - started < seconds:
        elapsed, loss = step()
        times.append(elapsed)
    elapsed = time.perf_counter() - started
    window_end = time.monotonic()
    samples = float(batch * len(times))
    return {
        "window_start_s": window_start,
        "window_end_s": window_end,
        "samples": samples,
        "requests": samples,
        "samples_per_s": samples / elapsed,
        "step_ms_p50": 1000 * percentile(times, 50),
        "step_ms_p99": 1000 * percentile(times, 99),
        "steps": float(len(times)),
        "loss": loss,
        "seconds": elapsed,
    }


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m targets.workloads.pipeline", description=__doc__
    )
    parser.add_argument("--devices", default="cpu,cpu", help="one device per stage")
    parser.add_argument("--layers", default="2,1", help="blocks per stage, comma-separated")
    parser.add_argument(
        "--kinds", help=f"each stage's blocks, comma-separated, of {', '.join(KINDS)} (all gemm)"
    )
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        layers = _ints(args.layers)
    except ValueError:
        print(f"--layers: not a list of integers: {args.layers!r}", file=sys.stderr)
        return 2
    names = args.devices.split(",")
    problems = []
    if len(names) != len(layers):
        problems.append(f"{len(names)} devices for {len(layers)} stages (--layers)")
    kinds = args.kinds.split(",") if args.kinds else ["gemm"] * len(layers)
    if len(kinds) != len(layers) or any(k not in KINDS for k in kinds):
        problems.append(f"--kinds: one of {', '.join(KINDS)} per stage, got {args.kinds!r}")
    if any(n < 1 for n in layers) or args.width < 1 or args.threads < 1:
        problems.append("layers, width and threads must be >= 1")
    if not 1 <= args.microbatches <= args.batch:
        problems.append("microbatches must be in [1, batch]")
    if args.seconds <= 0 or args.warmup_s < 0:
        problems.append("seconds must be > 0 and warmup-s >= 0")
    try:
        devices = [torch.device(n) for n in names]
    except RuntimeError as exc:
        problems.append(f"--devices: {exc}")
        devices = []
    if any(d.type == "cuda" for d in devices) and not torch.cuda.is_available():
        problems.append("a cuda device was asked for but torch sees no GPU")
    if problems:
        print("; ".join(problems), file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    stages = build_stages(layers, args.width, devices, args.seed, kinds)
    metrics = train(
        stages, devices, args.width, args.batch, args.microbatches, args.seconds, args.warmup_s
    )
    print(json.dumps({**metrics, "devices": names, "layers": layers, "kinds": kinds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
