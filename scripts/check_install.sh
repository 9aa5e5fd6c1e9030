#!/usr/bin/env bash
# Prove that zephon-vl installs and works outside this checkout, beside the torch a user has.
#
#   bash scripts/check_install.sh            # beside torch 2.14.1 (not the 2.13.0 CI uses)
#   bash scripts/check_install.sh --lowest   # every runtime, demo and parquet dependency
#                                            # at its lower bound in pyproject.toml
#   --keep: leave the temporary folder (dist/, the venv, logs) instead of removing it
#
# 1. `python -m build` makes the sdist and, from it, the wheel; `twine check --strict`
#    passes; the wheel holds both packages' py.typed and no `==` pin (install_smoke.py).
# 2. A fresh virtual environment (no system site-packages) gets torch first (2.14.1: a
#    CUDA build, ~5.5 GB in the venv, which pip on this machine takes from local disk),
#    then the wheel with its `[demo]` extra; torch must still be the same version.
# 3. From a folder outside the checkout, with an empty ZEPHON_CACHE (the tokenizer, text
#    corpus and demo photos are built from the installed packages): `zephon-vl demo`, the
#    text-demo digests against the recorded ones, vlm-demo's the same at D=2 and 4 (and
#    as recorded where the venv has pillow-simd), and a text-only
#    `text_loader` loop (D=1 = D=2 resumed; with --lowest also read from Parquet).
# 4. Beside it, the `[titan]` extra: torch still the same, and TorchTitan's trainer runs 3
#    steps of zephon_llama3_debug at D=2 on the CPU (not with --lowest: TorchTitan 0.3
#    wants a newer torch than 2.7).
# The venv and everything else live in one temporary folder, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd -P)
PY=${PYTHON:-python3}
mode=beside keep=0
for arg in "$@"; do
  case $arg in
    --lowest) mode=lowest ;;
    --keep) keep=1 ;;
    *) echo "usage: $0 [--lowest] [--keep]" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d "${TMPDIR:-/tmp}/zephon-check-install.XXXXXX")
cleanup() {
  if [ "$keep" = 1 ]; then echo "check_install: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
t0=$SECONDS
say() { echo "check_install [$((SECONDS - t0))s]: $*"; }
fail() { echo "check_install: FAILED: $*" >&2; exit 1; }

# The per-step digests (first 12 hex) of `zephon-vl digest --recipe R --dp 2 --steps 6`,
# as recorded for this release (the same at every D and in every install).
TEXT_DEMO="d6a288f01144 b61709c6df7d f935cd6c73b6 82785c744171 1bdc39ecdd19 5ab70c8e78d9"
VLM_DEMO="fad81967c200 00569754a941 fb9cceca8821 6caa7a4aec6e 6c9d3590325c bad38f9ac819"

say "python -m build (sdist, then the wheel from the sdist) from a copy of the files git tracks"
# A copy: what a clone would hold (uncommitted edits included, ignored files not), and the
# build's zephon_vl.egg-info lands there, not in this checkout.
mkdir "$work/src"
git ls-files -z -co --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null |
  tar -xf - -C "$work/src"
(cd "$work/src" && $PY -m build --outdir "$work/dist" . >"$work/build.log" 2>&1) ||
  { tail -30 "$work/build.log"; fail "build"; }
$PY -m twine check --strict "$work"/dist/* || fail "twine check"
$PY scripts/install_smoke.py wheel "$work/dist"
wheel=$(ls "$work"/dist/*.whl)

venv=$work/venv
vpy=$venv/bin/python
$PY -m venv "$venv"
pip_v() { "$vpy" -m pip install --disable-pip-version-check "$@" >>"$work/pip.log" 2>&1 || { tail -30 "$work/pip.log"; fail "pip install $*"; }; }
torch_version() { "$vpy" -c 'import importlib.metadata as md; print(md.version("torch"))'; }
extras=demo
if [ "$mode" = lowest ]; then
  extras=demo,parquet
  $PY scripts/install_smoke.py lowest pyproject.toml demo parquet >"$work/lowest.txt"
  want=$(sed -n 's/^torch==//p' "$work/lowest.txt")
  say "fresh venv: torch $want, then the wheel[$extras] with every dependency at its lower bound:" \
    "$(tr '\n' ' ' <"$work/lowest.txt")"
  pip_v "torch==$want"
  pip_v -c "$work/lowest.txt" "$wheel[$extras]"
else
  want=2.14.1
  say "fresh venv: torch $want first"
  pip_v "torch==$want"
  say "pip install $(basename "$wheel")[$extras] beside it"
  pip_v "$wheel[$extras]"
fi
have=$(torch_version)
[ "$have" = "$want" ] || fail "torch is $have after installing the wheel, not $want"
grep -q "Uninstalling torch-" "$work/pip.log" && fail "pip uninstalled a torch: $(grep 'Uninstalling torch-' "$work/pip.log")"
say "torch $have kept; $("$vpy" scripts/install_smoke.py versions)"

# From outside the checkout, the venv's own commands, a cache of their own.
run_v() { (cd "$work" && env -u PYTHONPATH ZEPHON_CACHE="$work/cache" PATH="$venv/bin:$PATH" "$@"); }
where=$(run_v python -c 'import zephon_vl; print(zephon_vl.__file__)')
case $where in "$venv"/*) ;; *) fail "zephon_vl imports from $where, not from the venv" ;; esac
say "zephon-vl demo"
start=$SECONDS
run_v zephon-vl demo >"$work/demo.log" 2>&1 || { tail -30 "$work/demo.log"; fail "zephon-vl demo"; }
tail -n 4 "$work/demo.log"
say "zephon-vl demo passed in $((SECONDS - start))s (digests equal at D=2, resumed at D=1, 4, 8)"
digests() {  # first 12 hex of each step's digest of `zephon-vl digest --recipe $1 --dp $2`
  run_v zephon-vl digest --recipe "$1" --dp "$2" --steps 6 2>>"$work/digest.log" |
    "$vpy" -c 'import json, sys; print(" ".join(json.loads(l)["sha256"][:12] for l in sys.stdin))'
}
got=$(digests text-demo 2)
[ "$got" = "$TEXT_DEMO" ] || fail "text-demo digests $got, recorded $TEXT_DEMO"
say "text-demo digests at D=2 as recorded: $got"
# Images decode and resize through the installed Pillow: the recorded vlm-demo digests are
# pillow-simd's (scripts/setup.sh); plain Pillow gives others (docs/reliability.md, "What a
# digest depends on"), the same at every D.
got=$(digests vlm-demo 2)
[ "$got" = "$(digests vlm-demo 4)" ] || fail "vlm-demo digests differ between D=2 and D=4"
pil=$(run_v python -c 'import PIL; print(PIL.__version__)')
if [[ $pil == *.post* ]]; then  # pillow-simd's versions, as setup.sh tells them
  [ "$got" = "$VLM_DEMO" ] || fail "vlm-demo digests $got, recorded $VLM_DEMO"
  say "vlm-demo digests at D=2 and 4 as recorded: $got"
else
  say "vlm-demo digests the same at D=2 and 4: $got" \
    "(Pillow $pil, not the pillow-simd of the record:" \
    "$([ "$got" = "$VLM_DEMO" ] && echo 'equal to it' || echo 'other digests, as documented'))"
fi
parquet=""; [ "$mode" = lowest ] && parquet=--parquet
start=$SECONDS
run_v python "$root/scripts/install_smoke.py" text $parquet || fail "text_loader loop"
say "text_loader loop passed in $((SECONDS - start))s"

if [ "$mode" = beside ]; then
  say "pip install $(basename "$wheel")[titan] beside it"
  pip_v "$wheel[titan]"
  have=$(torch_version)
  [ "$have" = "$want" ] || fail "torch is $have after the [titan] extra, not $want"
  run_v python -c 'import torchtitan, importlib.metadata as md
print("check_install: torchtitan", md.version("torchtitan"), "and torchdata", md.version("torchdata"))' ||
    fail "import torchtitan beside torch $want"
  say "TorchTitan trains 3 steps of zephon_llama3_debug on zephon-vl batches at D=2 (CPU launcher)"
  run_v torchrun --nproc_per_node=2 -m zephon_vl.testing.titan_cpu --module zephon_vl.titan \
    --config zephon_llama3_debug --training.steps 3 >"$work/titan.log" 2>&1 ||
    { tail -30 "$work/titan.log"; fail "TorchTitan beside torch $want"; }
  grep -q "step: *3 " "$work/titan.log" || { tail -30 "$work/titan.log"; fail "TorchTitan did not log step 3"; }
  have=$(torch_version)
  say "torch $have kept after [titan]"
fi
say "all passed ($mode; venv $(du -sh "$venv" | cut -f1))"
