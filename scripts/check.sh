#!/usr/bin/env bash
# Every check CI runs, in order: generated gRPC code up to date, lint, format, types, tests.
# Run inside the project's virtual environment (see the README's test command).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/check_generated.sh
ruff check .
ruff format --check .
mypy
python -m pytest "$@"
