#!/usr/bin/env bash
# Create bench/.venv-yahpo: the pinned environment of the YAHPO Gym surrogates of bench.suite.
#
# Usage (from anywhere): bench/setup_yahpo.sh [PYTHON]   (default python3; needs >= 3.8)
# bench.suite evaluates the yahpo:* problems through one child process in this environment
# (bench/yahpo_bridge.py) and skips them with a message when it is missing. Delete the folder
# to start over.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${1:-python3}"
venv="$here/.venv-yahpo"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --upgrade --quiet pip
"$venv/bin/python" -m pip install --quiet -r "$here/yahpo_requirements.txt"
"$venv/bin/python" - <<'PY'
from importlib import metadata

for name in ("yahpo-gym", "ConfigSpace", "numpy", "onnxruntime", "pandas"):
    print(f"{name}=={metadata.version(name)}")
PY
echo "YAHPO Gym environment ready: $venv"
