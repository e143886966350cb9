#!/usr/bin/env bash
# Create the isolated virtual environment for the Flower side of the benchmark.
#
#   benchmarks/setup_flower_venv.sh [VENV_DIR]
#
# VENV_DIR defaults to benchmarks/.flower-venv (kept out of git). The venv must
# not be raylf's own .venv: flwr[simulation] pins a different Ray version.
# Afterwards run the Flower side with:
#   VENV_DIR/bin/python benchmarks/flower_side.py --workload W.npz --out R.json
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-$here/.flower-venv}"
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
"$venv/bin/python" -m pip install --quiet -r "$here/flower-requirements.txt"
end=$(date +%s)

"$venv/bin/python" - <<'PY'
import flwr, ray, torch, numpy, sklearn
print(f"flwr {flwr.__version__}  ray {ray.__version__}  torch {torch.__version__}  "
      f"numpy {numpy.__version__}  scikit-learn {sklearn.__version__}")
PY
echo "Flower venv ready at $venv (install took $((end - start)) s)"
