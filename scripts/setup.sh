#!/usr/bin/env bash
# Install zephon-vl and everything it needs on a fresh machine (idempotent, fast when done).
# torch is pinned to the CPU build that this kind of machine keeps on disk; pillow-simd
# (built with AVX2) is installed last and over Pillow, so that later installs that ask
# for Pillow find it satisfied and leave the SIMD build in place.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.cache/setup.$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
# Done already when the stamp matches and, from outside this folder, zephon_vl imports from here.
here=$(pwd -P)
if [ -f "$stamp" ] && (cd / && $PY -c 'import sys, zephon_vl, torch, transformers, av, grain, torchtitan
assert zephon_vl.__file__.startswith(sys.argv[1] + "/")' "$here") 2>/dev/null; then
  exit 0
fi
$PY -m pip install -q --disable-pip-version-check torch==2.13.0
$PY -m pip install -q --disable-pip-version-check -e ".[all]"
# TorchTitan's qwen3_5 model imports fla (flash-linear-attention) and triton at module level.
# On CPU zephon_vl.testing.titan_cpu replaces their kernels, so install them without their (CUDA) deps.
if ! $PY -c 'import fla, triton' 2>/dev/null; then
  $PY -m pip install -q --disable-pip-version-check --no-deps \
    triton==3.8.0 fla-core==0.5.2 flash-linear-attention==0.5.2
fi
if [ "$($PY -c 'import PIL; print(".post" in PIL.__version__)')" != "True" ]; then
  echo "setup: building pillow-simd with AVX2 (about a minute, once)"
  CC="cc -mavx2" $PY -m pip install -q --disable-pip-version-check --no-deps \
    --force-reinstall --no-binary pillow-simd pillow-simd
fi
$PY -c 'import PIL; print("setup: PIL", PIL.__version__, "(pillow-simd)" if ".post" in PIL.__version__ else "(plain Pillow: slower resize)")'
mkdir -p .cache && touch "$stamp"
