"""Measurements on a lent NVIDIA GPU: a probe, the inference sweep table, the pipeline clock sweep.

Device time is short (minutes), so each phase keeps its model loaded in this process and
changes the clocks between measurements through the ``nvgpu`` target's own NVML code
(``set_device``, its energy meter, ``reset_device``), instead of starting a workload process
per cell as ``python -m runner.sweep`` does (seconds of torch import and CUDA start-up each)::

    python -m bench.gpu_device probe --out DIR     # what NVML allows; do the setters work
    python -m bench.gpu_device sweep --out DIR --budget-s 200
    python -m bench.gpu_device pipeline --out DIR --budget-s 45
    python -m bench.gpu_device live-config --table DIR/gpu-inference.csv --out live.toml \
        --results DIR

``sweep`` measures ``targets.workloads.inference``'s encoder over SM clock x power limit x
batch size (x memory clock where the GPU lists several): six SM clocks from 35 % to 100 % of the top
one, three power limits from the lowest allowed to the default, batches 8, 64, 256 and 1024.
Each pass measures the default cell first and then every cell in a new seeded order, and the
default cell again every ``--control-every`` cells (an interleaved control that shows drift);
passes repeat while ``--budget-s`` lasts, so a cut run keeps whole earlier passes. Every
measurement is a row of ``DIR/gpu-inference.csv``, a replay table (``targets/replay.py``) whose
knob columns are ``sm_mhz, power_w, batch`` (and ``mem_mhz``), and a line of
``DIR/sweep-log.jsonl`` with its pass and start time. Energy is the GPU's total-energy counter
over the timed part only.

``pipeline`` runs ``targets.workloads.pipeline``'s GPipe training job with its four stages on
the one GPU (``--layers 8,8,4,2``) at eight SM clocks, two interleaved passes: the single-GPU
form of EnvPipe's question, how much energy a lower clock saves within 1 % of the top
throughput.
One GPU has one clock, so the per-stage clocks EnvPipe sets on separate GPUs do not apply.

``stages`` is issue 60's item 3, the clock set per stage *in time* on one GPU
(``targets.hardware.stage_clocks``): a pipeline whose stages differ in character
(``--kinds gemm,memory,gemm,memory``: matrix products, and LayerNorm + GELU work bound by
memory bandwidth) first measures what switching costs, in interleaved rounds of the same
job without hooks, with hooks that only wait at every stage boundary, and with hooks that
switch between the top two clock levels (``stage-switch.json``: NVML call latency, step
times, each stage's share of a step); then cells ``(sm_mhz, sm_mhz_memory)``, the clock of
the gemm stages and of the memory stages, in interleaved passes with the unlocked default
as control (``stages.csv``, ``stages-log.jsonl``). Cells with both clocks equal are one
fixed clock, run without hooks. ``python -m bench.gpu_report --stages DIR`` chooses, on the
first pass, the best fixed clock and the best per-stage schedule within 1 % of the
default's throughput, and gives their energy saved on the later passes.

``live-config`` writes a ``tuner tune`` config for the same study on the live GPU (the real
product path, a workload process per trial) with the SLO fixed by a rule chosen before any
measurement: p99 <= 2 x the default cell's median p99 in the sweep table.

Clocks and the power limit go back to their defaults at the end of every phase, on SIGTERM too.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from targets import grid
from targets.hardware.device import metered
from targets.hardware.nvgpu import NvidiaGpuTarget
from targets.hardware.stage_clocks import StageClocks
from targets.host.signals import terminate_on_sigterm
from tuner.errors import ConfigRejected, TargetError

BATCHES = (8, 64, 256, 1024)
DEFAULT_BATCH = 64
SM_SHARES = (1.0, 0.85, 0.7, 0.55, 0.45, 0.35)
PIPELINE_SHARES = (1.0, 0.92, 0.84, 0.76, 0.68, 0.6, 0.5, 0.4)
#: The gemm stages' clocks in the ``stages`` grid (the memory stages' are PIPELINE_SHARES).
COMPUTE_SHARES = (1.0, 0.92, 0.84)
SLO_FACTOR = 2.0
METRICS = (
    "requests",
    "requests_per_s",
    "p50_ms",
    "p99_ms",
    "gpu_energy_j",
    "gpu_power_w",
    "gpu_energy_j_per_request",
    "sm_mhz_seen",
)
PIPELINE_METRICS = (
    "samples_per_s",
    "step_ms_p50",
    "step_ms_p99",
    "gpu_energy_j",
    "gpu_power_w",
    "gpu_energy_j_per_request",
    "sm_mhz_seen",
)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def gpu_target(nvml: str) -> NvidiaGpuTarget:
    """The nvgpu target for its NVML part only (its workload command is never run here)."""
    target = NvidiaGpuTarget(
        command=[sys.executable, "-c", "pass"], metrics=["requests"], settle_s=0, nvml=nvml
    )
    return target


def nearest(levels: Sequence[int], want: float) -> int:
    return min(levels, key=lambda level: abs(level - want))


def sm_clocks(target: NvidiaGpuTarget) -> Sequence[int]:
    """The SM clock levels the target's ``sm_mhz`` knob offers, lowest first."""
    knob = next(k for k in target.describe_knobs() if k.name == "sm_mhz")
    return knob.choices  # type: ignore[attr-defined,no-any-return]


def clock_levels(sm: Sequence[int], shares: Sequence[float]) -> list[int]:
    """The levels of ``sm`` nearest each share of the top one, highest first, once each."""
    return sorted({nearest(sm, share * sm[-1]) for share in shares}, reverse=True)


def sweep_levels(target: NvidiaGpuTarget) -> dict[str, list[int]]:
    """The grid: SM clocks, power limits and memory clocks from the device, and batches."""
    knobs = {k.name: k for k in target.describe_knobs()}
    levels = {"sm_mhz": clock_levels(sm_clocks(target), SM_SHARES)}
    # No memory clocks: the H200 lists two (2201, 3201 MHz) but its NVML answers "Not
    # Supported" to SetMemoryLockedClocks (seen 2026-11-26, driver 580.159.04).
    if "power_w" in knobs:
        power: Sequence[int] = knobs["power_w"].choices  # type: ignore[attr-defined]
        default = int(knobs["power_w"].default)  # type: ignore[arg-type]
        middle = nearest(power, (power[0] + default) / 2)
        levels["power_w"] = sorted({default, middle, power[0]}, reverse=True)
    levels["batch"] = list(BATCHES)
    return levels


def default_cell(target: NvidiaGpuTarget, names: Sequence[str]) -> dict[str, int]:
    knobs = {k.name: k for k in target.describe_knobs()}
    return {n: (DEFAULT_BATCH if n == "batch" else int(knobs[n].default)) for n in names}  # type: ignore[arg-type]


def measured(
    target: NvidiaGpuTarget,
    cell: dict[str, int],
    settle_s: float,
    run: Callable[[dict[str, int]], dict[str, float]],
) -> dict[str, Any]:
    """One measurement of ``cell``: set the device, settle, run metered; a row."""
    started = time.monotonic()
    row: dict[str, Any] = dict(cell)
    try:
        target.set_device({k: v for k, v in cell.items() if k != "batch"})
        time.sleep(settle_s)
        row.update(metered(target.energy_meter(), lambda: run(cell), target.energy_prefix))
        row.update(target.device_measurements())
        row["status"], row["reason"] = "COMPLETED", ""
    except ConfigRejected as exc:
        row["status"], row["reason"] = "INFEASIBLE", str(exc)[:200]
    except TargetError as exc:
        row["status"], row["reason"] = "FAILED", str(exc)[:200]
    row["trial_s"] = round(time.monotonic() - started, 3)
    return row


def run_grid(
    target: NvidiaGpuTarget,
    cells: list[dict[str, int]],
    default: dict[str, int],
    columns: Sequence[str],
    out: Path,
    log: Path,
    args: argparse.Namespace,
    run: Callable[[dict[str, int]], dict[str, float]],
) -> int:
    """Measure the cells pass after pass until the budget runs out; rows as they come."""
    start = time.monotonic()
    count = failed = 0
    header = [*default, *columns, "status", "reason", "trial_s"]
    with (
        terminate_on_sigterm(),
        target,
        open(out, "w", newline="", encoding="utf-8") as table,
        open(log, "w", encoding="utf-8") as lines,
    ):
        writer = csv.DictWriter(table, fieldnames=header, extrasaction="ignore")
        writer.writeheader()
        order = (  # at most 50 passes; the time budget ends it first
            (n, cell)
            for n in range(50)
            for cell in grid.measuring_order(cells, default, n, args.control_every)
        )
        for number, cell in order:
            elapsed = time.monotonic() - start
            if elapsed > args.budget_s:
                break
            row = measured(target, cell, args.settle_s, run)
            writer.writerow(row)
            table.flush()
            failed = failed + 1 if row["status"] == "FAILED" else 0
            if failed >= 10:
                say(f"stopped: 10 measurements in a row failed ({row['reason']})")
                break
            lines.write(json.dumps({"pass": number, "t_s": round(elapsed, 2), **row}) + "\n")
            lines.flush()
            count += 1
            if count % 10 == 0 or row["status"] != "COMPLETED":
                shown = {k: row.get(k) for k in (*columns[1:3], "gpu_power_w")}
                say(f"{count} rows, pass {number}, {elapsed:.0f} s: {cell} {row['status']} {shown}")
    say(f"wrote {out}: {count} measurements of {len(cells)} cells")
    return count


def cmd_sweep(args: argparse.Namespace) -> int:
    import torch

    from targets.workloads.inference import build_model, serve

    device = torch.device(args.device)
    model, shape = build_model("encoder")
    model = model.to(device).eval()
    target = gpu_target(args.nvml)
    levels = sweep_levels(target)
    say(f"{target.name}: levels {levels}")
    default = default_cell(target, list(levels))
    serve(model, shape, DEFAULT_BATCH, 0.5, 0.5, device)  # kernels compiled, caches warm

    def run(cell: dict[str, int]) -> dict[str, float]:
        batch = cell["batch"]
        serve(model, shape, batch, args.warmup_s, 0.0, device)
        return serve(model, shape, batch, args.seconds, 0.0, device)

    args.out.mkdir(parents=True, exist_ok=True)
    run_grid(
        target,
        grid.cells(levels),
        default,
        METRICS,
        args.out / "gpu-inference.csv",
        args.out / "sweep-log.jsonl",
        args,
        run,
    )
    return 0


def cmd_pipeline(args: argparse.Namespace) -> int:
    import torch

    from targets.workloads.pipeline import build_stages, train

    device = torch.device(args.device)
    layers = [8, 8, 4, 2]
    devices = [device] * len(layers)
    width, batch, microbatches = args.width, 512, 8
    stages = build_stages(layers, width, devices)
    target = gpu_target(args.nvml)
    sm = sm_clocks(target)
    levels = {"sm_mhz": clock_levels(sm, PIPELINE_SHARES)}
    say(f"{target.name}: pipeline {layers} width {width} at SM clocks {levels['sm_mhz']}")
    train(stages, devices, width, batch, microbatches, 0.5, 0.5)

    def run(cell: dict[str, int]) -> dict[str, float]:
        return train(stages, devices, width, batch, microbatches, args.seconds, args.warmup_s)

    args.out.mkdir(parents=True, exist_ok=True)
    run_grid(
        target,
        grid.cells(levels),
        {"sm_mhz": sm[-1]},
        ("requests", *PIPELINE_METRICS),
        args.out / "pipeline.csv",
        args.out / "pipeline-log.jsonl",
        args,
        run,
    )
    return 0


def schedule(kinds: Sequence[str], compute: int, memory: int) -> list[int]:
    """Each stage's clock: ``compute`` for gemm stages, ``memory`` for memory stages."""
    return [compute if kind == "gemm" else memory for kind in kinds]


def switch_cost(
    target: NvidiaGpuTarget,
    sm: Sequence[int],
    stages: Sequence[Any],
    kinds: Sequence[str],
    sync: Callable[[], None],
    job: Callable[[], dict[str, float]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """What switching the clock per stage costs (module doc): NVML's lock call alternating
    between the top two of the ``sm`` levels, then interleaved rounds of the job without
    hooks, waiting at every stage boundary, and switching between the two levels at every
    boundary."""
    top, near = sm[-1], sm[-2]
    calls = []
    for i in range(args.switch_calls):
        started = time.perf_counter()
        target.lock_sm(near if i % 2 == 0 else top)
        calls.append(1000 * (time.perf_counter() - started))
    target.lock_sm(top)
    distinct = list(range(1, len(kinds) + 1))  # every boundary "switches", nothing is set
    arms: dict[str, Callable[[], StageClocks | None]] = {
        "none": lambda: None,
        "wait": lambda: StageClocks(lambda mhz: None, distinct, sync),
        "switch": lambda: StageClocks(
            target.lock_sm, [top if i % 2 == 0 else near for i in range(len(kinds))], sync, top
        ),
    }
    rounds: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for r in range(args.switch_rounds):
        for arm in arms if r % 2 == 0 else list(arms)[::-1]:
            clocks = arms[arm]()
            got: dict[str, Any]
            if clocks is None:
                got = job()
            else:
                with clocks.installed(stages):
                    got = job()
                got = {**got, "switches": clocks.switches, "switch_s": clocks.switch_s,
                       "stage_s": clocks.stage_s}  # fmt: skip
            rounds[arm].append(got)
            target.lock_sm(top)
    step = {arm: statistics.median(g["step_ms_p50"] for g in got) for arm, got in rounds.items()}
    waits = [g["stage_s"] for g in rounds["wait"]]
    shares = [statistics.fmean(w[i] / sum(w) for w in waits) for i in range(len(kinds))]
    return {
        "levels_mhz": [top, near],
        "nvml_lock_ms": {"median": statistics.median(calls), "max": max(calls), "n": len(calls)},
        "step_ms_median": step,
        "wait_overhead": step["wait"] / step["none"] - 1,
        "switch_overhead": step["switch"] / step["none"] - 1,
        "stage_share": dict(zip([f"{i}:{k}" for i, k in enumerate(kinds)], shares, strict=True)),
        "rounds": rounds,
    }


def cmd_stages(args: argparse.Namespace) -> int:
    import torch

    from targets.workloads.pipeline import build_stages, train

    device = torch.device(args.device)
    layers = [int(n) for n in args.layers.split(",")]
    kinds = args.kinds.split(",")
    devices = [device] * len(layers)
    stages = build_stages(layers, args.width, devices, kinds=kinds)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def job() -> dict[str, float]:
        return train(stages, devices, args.width, args.batch, args.microbatches, args.seconds,
                     args.warmup_s)  # fmt: skip

    target = gpu_target(args.nvml)
    sm = sm_clocks(target)
    say(f"{target.name}: stages {layers} {kinds}, width {args.width}, batch {args.batch}")
    train(stages, devices, args.width, args.batch, args.microbatches, 0.5, 0.5)
    args.out.mkdir(parents=True, exist_ok=True)
    with terminate_on_sigterm(), target:
        cost = switch_cost(target, sm, stages, kinds, sync, job, args)
    (args.out / "stage-switch.json").write_text(json.dumps(cost, indent=1) + "\n")
    say(f"switching: NVML lock {cost['nvml_lock_ms']['median']:.2f} ms, step "
        f"{cost['step_ms_median']}, stage shares {cost['stage_share']}")  # fmt: skip
    memory, compute = clock_levels(sm, PIPELINE_SHARES), clock_levels(sm, COMPUTE_SHARES)
    cells = [{"sm_mhz": a, "sm_mhz_memory": b} for a in compute for b in memory if b <= a]
    cells += [{"sm_mhz": b, "sm_mhz_memory": b} for b in memory if b not in compute]

    def run(cell: dict[str, int]) -> dict[str, float]:
        a, b = cell["sm_mhz"], cell["sm_mhz_memory"]
        if a == b:
            return job()
        clocks = StageClocks(target.lock_sm, schedule(kinds, a, b), sync, current=a)
        with clocks.installed(stages):
            got = job()
        return {**got, "switches": clocks.switches, "switch_s": clocks.switch_s}

    run_grid(
        target,
        cells,
        {"sm_mhz": sm[-1], "sm_mhz_memory": sm[-1]},
        ("requests", *PIPELINE_METRICS, "switches", "switch_s"),
        args.out / "stages.csv",
        args.out / "stages-log.jsonl",
        args,
        run,
    )
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """What NVML reports and allows, each setter tried once and undone; ``probe.json``."""
    target = gpu_target(args.nvml)
    nvml, handle = target.nvml, target.handle
    report: dict[str, Any] = {
        "name": target.name,
        "driver": _try(lambda: str(nvml.nvmlSystemGetDriverVersion())),
        "mem_clocks": list(target.mem_clocks),
        "sm_clocks": [target.sm_clocks[0], target.sm_clocks[-1], len(target.sm_clocks)],
        "power_range_w": list(target.gpus[0].power_range_w),
        "default_power_w": target.gpus[0].default_power_w,
        "power_limit_mw": target.gpus[0].original_power_mw,
        "energy_counter_mj": _try(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
        "knobs": {k.name: list(k.choices) for k in target.describe_knobs()},  # type: ignore[attr-defined]
    }
    sm = target.sm_clocks
    low = sm[len(sm) // 3]
    power_low = target.gpus[0].power_range_w[0]
    with terminate_on_sigterm(), target:
        for name, config in (
            ("lock_sm", {"sm_mhz": low}),
            ("power_limit", {"power_w": power_low}),
        ):
            try:
                target.set_device(config)
                report[name] = "ok"
            except TargetError as exc:
                report[name] = f"{type(exc).__name__}: {exc}"
            try:
                target.reset_device()
                report[f"{name}_reset"] = "ok"
            except TargetError as exc:
                report[f"{name}_reset"] = f"{type(exc).__name__}: {exc}"
    if args.device.startswith("cuda"):
        from targets.hardware.nvgpu_probe import sm_clock_under_load

        report["sm_under_load_unlocked"] = sm_clock_under_load(nvml, handle)
        with target:
            if report["lock_sm"] == "ok":
                target.set_device({"sm_mhz": low})
                report["sm_under_load_locked"] = [low, sm_clock_under_load(nvml, handle)]
        report["sm_under_load_after_reset"] = sm_clock_under_load(nvml, handle)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    say(json.dumps({k: v for k, v in report.items() if k != "knobs"}))
    return 0


def _try(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def cmd_live_config(args: argparse.Namespace) -> int:
    """A ``tuner tune`` config for the live study, its SLO from the sweep's default cell."""
    with open(args.table, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    first = rows[0]
    knobs = [k for k in ("sm_mhz", "mem_mhz", "power_w", "batch") if k in first]
    default = [
        float(r["p99_ms"])
        for r in rows
        if r["status"] == "COMPLETED" and all(r[k] == first[k] for k in knobs)
    ]
    slo = round(SLO_FACTOR * statistics.median(default), 3)
    batches = ", ".join(map(str, BATCHES))
    knob_lines = '    { name = "sm_mhz" },\n' + (
        '    { name = "power_w" },\n' if "power_w" in first else ""
    )
    batch_line = (
        f'{{ name = "batch", kind = "ordinal", choices = [{batches}], default = {DEFAULT_BATCH} }}'
    )
    text = f"""# Written by python -m bench.gpu_device live-config from {args.table.name}:
# SLO = {SLO_FACTOR:g} x the default cell's median p99 ({statistics.median(default):.3f} ms).
[study]
name = "gpu-inference-live"
objectives = [{{ name = "gpu_energy_j_per_request", goal = "minimize" }}]
outcome_constraints = ["p99_ms <= {slo}"]
knobs = [
{knob_lines}    {batch_line},
]

[study.designer]
seed = 0
initial_trials = 5

[target]
kind = "nvgpu"
device = 0
sm_levels = 12
settle_s = 0.5
timeout_s = 60
command = [
    "{sys.executable}", "-m", "targets.workloads.inference", "--model", "encoder",
    "--batch", "{{batch}}",
    "--seconds", "{args.seconds}", "--warmup-s", "0.5", "--device", "cuda",
]
metrics = ["requests", "requests_per_s", "p50_ms", "p99_ms"]

[session]
trials = {args.trials}
confirm = {args.confirm}
db = "{args.results / "live.db"}"
plot = "{args.results / "live.png"}"
"""
    args.out.write_text(text, encoding="utf-8")
    say(f"wrote {args.out}: SLO p99 <= {slo} ms")
    return 0


def cmd_restore_check(args: argparse.Namespace) -> int:
    """Reset the GPU and print its power limit and SM clock under load (the last check);
    with ``--no-reset`` read them as something else left them (the daemon's check)."""
    target = gpu_target(args.nvml)
    if not args.no_reset:
        target.reset_device()
    from targets.hardware.nvgpu_probe import sm_clock_under_load

    clock = sm_clock_under_load(target.nvml, target.handle)
    limit = target.nvml.nvmlDeviceGetPowerManagementLimit(target.handle) / 1000
    default = target.gpus[0].default_power_w
    say(f"after everything: power limit {limit:g} W (default {default}), SM {clock:.0f} MHz")
    smi = subprocess.run(["nvidia-smi", "-q", "-d", "CLOCK"], capture_output=True, text=True)
    print(smi.stdout[-1500:], flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_device", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, default_budget, seconds in (("probe", 0, 1.0), ("sweep", 200, 1.0)):
        p = sub.add_parser(name)
        p.add_argument("--budget-s", type=float, default=default_budget)
        p.add_argument("--seconds", type=float, default=seconds, help="timed part of a cell")
    p = sub.add_parser("pipeline")
    p.add_argument("--budget-s", type=float, default=45)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--width", type=int, default=4096)
    p = sub.add_parser("stages")
    p.add_argument("--budget-s", type=float, default=120)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", default="4,48,4,48", help="blocks per stage")
    p.add_argument("--kinds", default="gemm,memory,gemm,memory", help="each stage's blocks")
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--switch-calls", type=int, default=40, help="NVML lock calls timed")
    p.add_argument("--switch-rounds", type=int, default=4, help="interleaved rounds")
    p = sub.add_parser("live-config")
    p.add_argument("--table", type=Path, required=True)
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--results", type=Path, required=True, help="folder for the db and PNG")
    p.add_argument("--confirm", type=int, default=3, help="re-measurements of the top few")
    p = sub.add_parser("restore-check")
    p.add_argument("--no-reset", action="store_true", help="read the state without resetting")
    for p in sub.choices.values():
        p.add_argument("--out", type=Path, default=Path("."))
        p.add_argument("--nvml", default="pynvml")
        p.add_argument("--device", default="cuda")
        p.add_argument("--settle-s", type=float, default=0.25)
        p.add_argument("--warmup-s", type=float, default=0.25)
        p.add_argument("--control-every", type=int, default=20)
    args = parser.parse_args(argv)
    command = {
        "probe": cmd_probe,
        "sweep": cmd_sweep,
        "pipeline": cmd_pipeline,
        "stages": cmd_stages,
        "live-config": cmd_live_config,
        "restore-check": cmd_restore_check,
    }[args.command]
    return command(args)


if __name__ == "__main__":
    sys.exit(main())
