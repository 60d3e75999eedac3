#!/usr/bin/env bash
# Every check CI runs, in order: the system packages the tests need (installed where this
# user can; scripts/system_packages.sh), generated gRPC code up to date, lint, format, types,
# tests. Run inside the project's virtual environment (see the README's test command).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/system_packages.sh
bash scripts/check_generated.sh
ruff check .
ruff format --check .
mypy
# The tests on up to 4 processes (pytest-xdist; most tests wait on subprocesses, servers and
# sessions): 17 min on one, 10 on two, on a 2-CPU machine. TUNER_TEST_WORKERS=0 runs them in one.
workers=${TUNER_TEST_WORKERS:-$(python -c 'import os; print(min(4, os.cpu_count() or 1))')}
if [ "$workers" -gt 0 ]; then
    python -m pytest -n "$workers" --dist worksteal "$@"
else
    python -m pytest "$@"
fi
