#!/usr/bin/env bash
# Everything issue 30 measures on a lent NVIDIA GPU, in one run of about nine minutes:
#
#   bash bench/gpu_device.sh OUTDIR
#
# run as root in the repository root (the device tool runs it with OUTDIR=$OUT). Wheels of
# the packages the GPU machine's image lacks travel in .whl/ (bench/README.md, "GPU"). Each
# phase has its own time limit and gets SIGTERM at it, so clocks and power limit are reset
# by the phase itself; the last step checks them. At most eleven files land in OUTDIR:
# log.txt, probe.json, gpu-inference.csv, sweep-log.jsonl, pipeline.csv, pipeline-log.jsonl,
# stage-switch.json, stages.csv, stages-log.jsonl (issue 60's clock per stage, SKIP_STAGES=1
# leaves it out: about 2.5 minutes), live.db, live.png. SKIP_PROBE, SKIP_PIPELINE and
# SKIP_LIVE leave out those phases: a device call runs at most 10 minutes, so issue 60's
# first call is `SKIP_PIPELINE=1 SKIP_LIVE=1 SWEEP_S=165 SWEEP_BUDGET_S=150` (about 9).
set -u
out=${1:?usage: bash bench/gpu_device.sh OUTDIR}
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
phase() { echo "=== $(date +%T) $1"; }
phase "machine"
nvidia-smi
nvidia-smi -q -d CLOCK,POWER | head -80
python3 -c "import torch, botorch; print('torch', torch.__version__, 'botorch', botorch.__version__)"

phase "probe"
[ -n "${SKIP_PROBE:-}" ] || timeout -s TERM 60 python3 -m bench.gpu_device probe --out "$out"

phase "gpu-marked tests"
timeout -s TERM 150 python3 -m pytest -p no:cacheprovider -m gpu -q -rs -s \
    tests/targets/test_nvgpu_real_gpu.py

phase "inference sweep"
timeout -s TERM "${SWEEP_S:-200}" python3 -m bench.gpu_device sweep --out "$out" \
    --budget-s "${SWEEP_BUDGET_S:-180}" --seconds 0.8 --warmup-s 0.2 --settle-s 0.2

phase "pipeline clock sweep"
[ -n "${SKIP_PIPELINE:-}" ] || timeout -s TERM 70 python3 -m bench.gpu_device pipeline --out "$out" --budget-s 40 \
    --seconds 1.2 --warmup-s 0.2 --settle-s 0.2

phase "clock per stage in time (issue 60, item 3)"
[ -n "${SKIP_STAGES:-}" ] || timeout -s TERM 170 python3 -m bench.gpu_device stages --out "$out" \
    --budget-s "${STAGES_BUDGET_S:-110}" --seconds 1.2 --warmup-s 0.2 --settle-s 0.2
[ -n "${SKIP_STAGES:-}" ] || python3 -m bench.gpu_report --stages "$out" --markdown

phase "live tuning session (tuner tune on the GPU)"
[ -n "${SKIP_LIVE:-}" ] || {
    python3 -m bench.gpu_device live-config --table "$out/gpu-inference.csv" --out /tmp/live.toml \
        --results "$out" --trials "${LIVE_TRIALS:-10}" --seconds 1.0 &&
        timeout -s TERM 240 python3 -m cli.main tune /tmp/live.toml &&
        python3 -m cli.main show gpu-inference-live --db "$out/live.db"
}

phase "restored?"
python3 -m bench.gpu_device restore-check
phase "done"
