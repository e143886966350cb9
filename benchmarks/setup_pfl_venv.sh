#!/usr/bin/env bash
# Create the isolated virtual environment for the pfl-research side of the benchmark.
#
#   benchmarks/setup_pfl_venv.sh [VENV_DIR]
#
# VENV_DIR defaults to benchmarks/.pfl-venv (kept out of git). It is not raylf's own .venv:
# the pfl side must not import raylf, and pfl's pins must not touch raylf's environment.
# Afterwards run the pfl side with:
#   VENV_DIR/bin/python benchmarks/pfl_side.py --workload W.npz --out R.json
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-$here/.pfl-venv}"
python="${PYTHON:-python3.11}"

if ! command -v "$python" >/dev/null 2>&1; then
    echo "error: $python not found (set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi
case "$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" in
    3.11) ;;
    *) echo "error: $python is not Python 3.11" >&2; exit 1 ;;
esac

start=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$here/pfl-requirements.txt"
end=$(date +%s)

"$venv/bin/python" - <<'PY'
from importlib.metadata import version

import numpy, torch
import pfl.model.pytorch  # noqa: F401  (fails here if the [pytorch] extra is incomplete)
print(f"pfl {version('pfl')}  torch {torch.__version__}  numpy {numpy.__version__}")
PY
echo "pfl venv ready at $venv (install took $((end - start)) s)"
