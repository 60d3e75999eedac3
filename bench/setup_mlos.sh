#!/usr/bin/env bash
# Create bench/.venv-mlos: the pinned environment of the mlos-core peer of bench/llamatune.py.
#
# Usage (from anywhere): bench/setup_mlos.sh [PYTHON]   (default python3; needs >= 3.10)
# The benchmark drives this environment through a subprocess (bench/mlos_peer.py) and skips
# the peer with a message when it is missing. Delete the folder to start over.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${1:-python3}"
venv="$here/.venv-mlos"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --upgrade --quiet pip
"$venv/bin/python" -m pip install --quiet -r "$here/mlos_requirements.txt"
"$venv/bin/python" - <<'PY'
from importlib import metadata

for name in ("mlos-core", "smac", "ConfigSpace", "numpy", "pandas", "scikit-learn", "scipy"):
    print(f"{name}=={metadata.version(name)}")
PY
echo "mlos-core peer environment ready: $venv"
