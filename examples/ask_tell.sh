#!/usr/bin/env bash
# Drive a study from a shell loop with `tuner ask` / `tuner tell` against a running server.
#
#   bash examples/ask_tell.sh            # 15 trials; TRIALS=N and PORT=P change them
#
# It starts `tuner serve` on 127.0.0.1:$PORT (stopped again on exit), creates the study of
# examples/ask_tell.toml (the compressor's knobs, no [target]: this script is the target),
# then loops: ask for a configuration (knobs as TUNER_<KNOB> variables), run the program,
# and tell the server its metrics, or why there are none.
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS=${TRIALS:-15}
PORT=${PORT:-50061}
DB=${DB:-runs/ask-tell.db}
SERVER=127.0.0.1:$PORT
mkdir -p runs/ask-tell

tuner serve --db "$DB" --port "$PORT" > runs/ask-tell/server.log 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true' EXIT
for _ in $(seq 50); do   # wait until it answers
    tuner studies --server "$SERVER" > /dev/null 2>&1 && break
    sleep 0.2
done

tuner create examples/ask_tell.toml --server "$SERVER"
[ -f runs/ask-tell/data.bin ] || python3 examples/compress_bench.py --make-data runs/ask-tell/data.bin --mb 8 > /dev/null

for i in $(seq "$TRIALS"); do
    # TUNER_STUDY, TUNER_TRIAL_ID and one TUNER_<KNOB> per knob, shell-quoted for eval.
    # --client-id makes a retried ask (after a crash of this loop) return the same trial,
    # and only the client a trial was handed to may tell its result.
    client="loop-$i"
    eval "$(tuner ask compress-shell --server "$SERVER" --format env --client-id "$client")"
    status=0
    output=$(timeout 30 python3 examples/compress_bench.py --data runs/ask-tell/data.bin \
        --codec "$TUNER_CODEC" --level "$TUNER_LEVEL" --threads "$TUNER_THREADS" \
        --block-kb "$TUNER_BLOCK_KB" 2> runs/ask-tell/stderr.txt) || status=$?
    if [ "$status" -eq 0 ]; then
        mbps=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["mb_per_s"])' "$output")
        ratio=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["ratio"])' "$output")
        tuner tell "$TUNER_STUDY" "$TUNER_TRIAL_ID" --metric mb_per_s="$mbps" \
            --metric ratio="$ratio" --server "$SERVER" --client-id "$client"
    elif [ "$status" -eq 124 ]; then
        tuner tell "$TUNER_STUDY" "$TUNER_TRIAL_ID" --timed-out "over 30 s" --server "$SERVER" --client-id "$client"
    elif [ "$status" -eq 3 ]; then
        tuner tell "$TUNER_STUDY" "$TUNER_TRIAL_ID" --infeasible "$(tail -c 300 runs/ask-tell/stderr.txt)" --server "$SERVER" --client-id "$client"
    else
        tuner tell "$TUNER_STUDY" "$TUNER_TRIAL_ID" --failed "exit $status: $(tail -c 300 runs/ask-tell/stderr.txt)" --server "$SERVER" --client-id "$client"
    fi
done

tuner best compress-shell --server "$SERVER" || echo "no feasible configuration yet: run more trials"
