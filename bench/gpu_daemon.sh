#!/usr/bin/env bash
# Issue 30's ten-minute daemon run on a lent NVIDIA GPU, in two device calls (a call is at
# most ten minutes): examples/daemon_gpu.toml under a load that rises half-way.
#
#   bash bench/gpu_daemon.sh start OUTDIR    # ~5 min: calibrate, start the driver, watch
#   bash bench/gpu_daemon.sh finish OUTDIR   # ~6 min: wait for the driver, collect
#
# run as root in the repository root, with .whl carried (bench/gpu_wheels.sh). `start`
# measures the encoder's closed-loop capacity C at the default clocks (batch 64), then starts
# a detached driver (this script's `drive`) that writes the load 0.15 C requests/s, runs
# `tuner daemon` on a copy of the example whose files live in /tmp/gpu-daemon, raises the
# load to 0.6 C at CHANGE_S (300 s: the clocks tuned for the low load break the SLO, so the
# daemon rolls back and re-tunes), lowers it to 0.15 C again at BACK_S (470 s: the served
# rate falls by three quarters, a drift, so it re-tunes again), sends SIGTERM at TOTAL_S
# (620 s), reads the power limit and the SM clock under load without resetting anything
# (the daemon must have restored them), and writes summary.txt. `finish` waits for the driver and copies its files to
# OUTDIR: events.log, driver.log, summary.txt, daemon.toml, state.json, tuner.db.
set -u
cmd=${1:?usage: bash bench/gpu_daemon.sh start|finish|drive OUTDIR}
out=${2:?usage: bash bench/gpu_daemon.sh start|finish|drive OUTDIR}
run=/tmp/gpu-daemon
export PYTHONUNBUFFERED=1
if [ -d .whl ] && [ ! -d /tmp/site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PWD
say() { echo "=== $(date +%T) $*"; }

case "$cmd" in
start)
    mkdir -p "$out"
    exec > >(tee -a "$out/start-log.txt") 2>&1
    rm -rf "$run" && mkdir -p "$run"
    say "machine"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv
    say "capacity at the default clocks (closed loop, batch 64)"
    capacity=$(python3 -m targets.workloads.inference --model encoder --batch 64 --seconds 3 \
        --warmup-s 1 --device cuda | python3 -c 'import json,sys; print(json.loads(sys.stdin.readlines()[-1])["requests_per_s"])') || exit 1
    low=$(python3 -c "print(round(0.15 * $capacity))")
    high=$(python3 -c "print(round(0.6 * $capacity))")
    say "capacity $capacity requests/s: load $low, $high at ${CHANGE_S:-300} s, $low at ${BACK_S:-470} s"
    python3 - "$run" <<'PY' || exit 1
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
text = Path("examples/daemon_gpu.toml").read_text(encoding="utf-8")
for old, new in {
    '"runs/gpu-load.txt"': json.dumps(str(run / "load.txt")),
    '"runs/tuner.db"': json.dumps(str(run / "tuner.db")),
    '"runs/daemon-gpu.daemon.json"': json.dumps(str(run / "state.json")),
    '"runs/daemon-gpu.log"': json.dumps(str(run / "events.log")),
}.items():
    assert old in text, old
    text = text.replace(old, new)
(run / "daemon.toml").write_text(text, encoding="utf-8")
PY
    echo "$low" > "$run/low" && echo "$high" > "$run/high"
    setsid nohup bash bench/gpu_daemon.sh drive "$run" > "$run/driver.log" 2>&1 < /dev/null &
    say "driver started; events as they come"
    for second in $(seq "${WATCH_S:-270}"); do
        sleep 1
        [ -f "$run/done" ] && break
        if [ $((second % 15)) -eq 0 ]; then  # what is under OUT comes back even if killed
            cp "$run"/events.log "$run"/driver.log "$out"/ 2>/dev/null
        fi
    done
    tail -n 5 "$run/driver.log"
    [ -f "$run/events.log" ] && python3 -m bench.gpu_daemon_summary "$run/events.log" | tail -n 25
    cp "$run"/events.log "$run"/driver.log "$out"/ 2>/dev/null
    say "start done; the daemon goes on: run finish"
    ;;
drive)
    cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
    begin=$(date +%s)
    cp "$out/low" "$out/load.txt"
    say "load $(cat "$out/load.txt")"
    python3 -m cli.main daemon "$out/daemon.toml" > "$out/daemon-stdout.log" 2> "$out/daemon-stderr.log" &
    daemon=$!
    sleep "${CHANGE_S:-300}"
    cp "$out/high" "$out/load.txt"
    say "load $(cat "$out/load.txt")"
    while [ $(( $(date +%s) - begin )) -lt "${BACK_S:-470}" ] && kill -0 "$daemon" 2>/dev/null; do
        sleep 1
    done
    cp "$out/low" "$out/load.txt"
    say "load $(cat "$out/load.txt")"
    while [ $(( $(date +%s) - begin )) -lt "${TOTAL_S:-620}" ] && kill -0 "$daemon" 2>/dev/null; do
        sleep 1
    done
    say "SIGTERM to the daemon after $(( $(date +%s) - begin )) s"
    kill -TERM "$daemon" 2>/dev/null
    wait "$daemon"
    say "daemon exited $?"
    tail -n 20 "$out/daemon-stderr.log"
    say "the GPU as the daemon left it"
    python3 -m bench.gpu_device restore-check --no-reset
    python3 -m bench.gpu_daemon_summary "$out/events.log" > "$out/summary.txt"
    cat "$out/summary.txt"
    touch "$out/done"
    ;;
finish)
    mkdir -p "$out"
    exec > >(tee -a "$out/finish-log.txt") 2>&1
    if [ ! -d "$run" ]; then
        say "no $run here: the machine is not the one start ran on"
        exit 1
    fi
    for _ in $(seq "${WAIT_S:-560}"); do
        [ -f "$run/done" ] && break
        sleep 1
    done
    [ -f "$run/done" ] || say "the driver has not finished; copying what there is"
    cat "$run/driver.log"
    cp "$run"/events.log "$run"/driver.log "$run"/summary.txt "$run"/daemon.toml \
        "$run"/state.json "$run"/tuner.db "$out"/ 2>/dev/null
    say "finish done"
    ;;
*)
    echo "unknown command $cmd: start, finish or drive" >&2
    exit 2
    ;;
esac
