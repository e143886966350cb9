#!/usr/bin/env bash
# Create the isolated virtual environment of one peer framework of the benchmark.
#
#   benchmarks/setup_peer_venv.sh flower|pfl [VENV_DIR]
#
# VENV_DIR defaults to benchmarks/.NAME-venv (kept out of git), installed from
# benchmarks/NAME-requirements.txt. It is never raylf's own .venv: a peer side must not import
# raylf, and the peers pin other versions (flwr[simulation] pins Ray 2.55.1; raylf uses 2.60).
# Afterwards run that side with:
#   VENV_DIR/bin/python benchmarks/NAME_side.py --workload W.npz --out R.json
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name="${1:-}"
case "$name" in
    flower|pfl) ;;
    *) echo "usage: $0 flower|pfl [VENV_DIR]" >&2; exit 2 ;;
esac
venv="${2:-$here/.$name-venv}"
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
"$venv/bin/python" -m pip install --quiet -r "$here/$name-requirements.txt"
end=$(date +%s)

# what was installed, imported as the side imports it (fails here on an incomplete install)
case "$name" in
    flower) check='import flwr, ray, torch, numpy, sklearn
print(f"flwr {flwr.__version__}  ray {ray.__version__}  torch {torch.__version__}  "
      f"numpy {numpy.__version__}  scikit-learn {sklearn.__version__}")' ;;
    pfl) check='from importlib.metadata import version
import numpy, torch
import pfl.model.pytorch
v = version("pfl")
print(f"pfl {v}  torch {torch.__version__}  numpy {numpy.__version__}")' ;;
esac
"$venv/bin/python" -c "$check"
echo "$name venv ready at $venv (install took $((end - start)) s)"
