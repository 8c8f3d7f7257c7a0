#!/usr/bin/env bash
# The CUDA variant end to end for one Python: a fresh clone of this checkout's HEAD,
# `build --variant cuda` (the base wheel from PyPI, ~540 MB, checked against patches/BASE),
# a second `build --force` that must give the same wheel byte for byte, a venv with the
# wheel and its nvidia-*/cuda-toolkit dependencies (~5.4 GB), then the test suite's
# CPU-side tests and scripts/gpu_smoke.py (which skips without a GPU). CI runs the
# default Python (3.11) only; this script covers 3.12 and 3.13 (PYTHON=...).
#
#   scripts/cuda_variant.sh [DIR] [pytest args...]   (default DIR: build/cuda-variant;
#   CACHE_DIR=... shares a cache; PYTHON=python3.12 builds and tests the wheel for that
#   interpreter (.venv-cp312; patches/BASE pins the cuda wheels of cp311, cp312 and cp313);
#   default pytest args: test, the whole suite)
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$src/build/cuda-variant}"
shift || true
cache=(${CACHE_DIR:+--cache-dir "$CACHE_DIR"})
py=(${PYTHON:+--python "$PYTHON"})
rm -rf "$dir"
git clone --quiet "$src" "$dir"
cd "$dir"
# The stamp and venv of that Python (build/wheel.stamp and .venv for patches/BASE's first block's).
read -r stamp venv < <(python3 - "${PYTHON:-}" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "scripts")
from dplib.base import default_python_tag
from dplib.common import Project
from dplib.interp import resolve_interpreter
tag = resolve_interpreter(sys.argv[1] or None).tag
if tag == default_python_tag(Project.at(Path("."))):
    print("build/wheel.stamp .venv")
else:
    print(f"build/wheel-{tag}.stamp .venv-{tag}")
PY
)
echo "cuda_variant: $(git rev-parse HEAD) in $dir (${PYTHON:-python3}: $stamp, $venv)"
time python3 scripts/dynapatch.py "${cache[@]}" build --variant cuda "${py[@]}"
first=$(cut -d' ' -f3 "$stamp")
python3 scripts/dynapatch.py "${cache[@]}" build --variant cuda "${py[@]}" --force --no-venv
second=$(cut -d' ' -f3 "$stamp")
echo "cuda_variant: wheel sha256 $first (first build), $second (second build)"
[ "$first" = "$second" ] || { echo "cuda_variant: the two builds differ" >&2; exit 1; }
"$venv/bin/python" -c 'import sys, torch; print("cuda_variant: import torch", torch.__version__, "Python", sys.version.split()[0], "CUDA", torch.version.cuda, "GPU", torch.cuda.is_available())'
"$venv/bin/python" -m torch._dynamo.dynapatch
"$venv/bin/python" scripts/gpu_smoke.py
time python3 scripts/dynapatch.py "${cache[@]}" test "${py[@]}" "$@"
