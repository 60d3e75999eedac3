#!/usr/bin/env bash
# Fetch into .whl/ the wheels of what the lent GPU machines' image lacks for bench/gpu_device.sh
# and bench/gpu_daemon.sh (its Python is 3.12 with torch, botorch, gpytorch, numpy, scipy,
# matplotlib, rich, click, prometheus-client and nvidia-ml-py already: ../.library/device/
# KINDS.md). Run here, once, from anywhere; then name .whl in the device call's carry. The
# device scripts install them into /tmp/site. Versions are this project's venv's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    grpcio==1.85.3 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 \
    grpcio-status==1.85.3 googleapis-common-protos==1.76.0 protobuf==7.36.2 \
    sqlite-utils==4.2.1 sqlite-fts4==1.0.3 click-default-group==1.2.4 \
    scikit-optimize==0.10.2 pyaml==26.7.0
du -sh .whl && ls .whl
