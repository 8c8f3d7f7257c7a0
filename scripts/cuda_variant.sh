#!/usr/bin/env bash
# The CUDA variant end to end, as CI does the CPU one: a fresh clone of this checkout's HEAD,
# `build --variant cuda` (the base wheel from PyPI, ~530 MB, checked against patches/BASE),
# a second `build --force` that must give the same wheel byte for byte, a .venv with the
# wheel and its nvidia-*/cuda-toolkit dependencies (~6 GB), then the test suite's CPU-side
# tests and scripts/gpu_smoke.py (which skips without a GPU). CI keeps to the CPU variant:
# this adds ~0.5 GB of download and ~6 GB of dependencies.
#
#   scripts/cuda_variant.sh [DIR] [pytest args...]   (default DIR: build/cuda-variant;
#   CACHE_DIR=... shares a cache; default pytest args: test, the whole suite)
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$src/build/cuda-variant}"
shift || true
cache=(${CACHE_DIR:+--cache-dir "$CACHE_DIR"})
rm -rf "$dir"
git clone --quiet "$src" "$dir"
cd "$dir"
echo "cuda_variant: $(git rev-parse HEAD) in $dir"
time python3 scripts/dynapatch.py "${cache[@]}" build --variant cuda
first=$(cut -d' ' -f3 build/wheel.stamp)
python3 scripts/dynapatch.py "${cache[@]}" build --variant cuda --force --no-venv
second=$(cut -d' ' -f3 build/wheel.stamp)
echo "cuda_variant: wheel sha256 $first (first build), $second (second build)"
[ "$first" = "$second" ] || { echo "cuda_variant: the two builds differ" >&2; exit 1; }
.venv/bin/python -c 'import torch; print("cuda_variant: import torch", torch.__version__, "CUDA", torch.version.cuda, "GPU", torch.cuda.is_available())'
.venv/bin/python -m torch._dynamo.dynapatch
.venv/bin/python scripts/gpu_smoke.py
time python3 scripts/dynapatch.py "${cache[@]}" test "$@"
