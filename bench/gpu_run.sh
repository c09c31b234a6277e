#!/usr/bin/env bash
# bench/gpu_compare.py on a GPU machine that has nothing but this checkout and a folder of wheels
# (docs/speed.md, "Measuring on a GPU").
#
#   PYTHON=.venv/bin/python bash bench/gpu_run.sh --prepare
#       here, with PyPI at hand: download bench/gpu_wheels.txt for CPython 3.12 on manylinux x86_64
#       into .whl/, save SmolLM2's tokenizer (from the GGUF of `make smollm2`) beside them, and check
#       that the checkout and .whl/ together stay well under what travels (64 MiB).
#   bash bench/gpu_run.sh [gpu_compare.py options]
#       there: install the wheels into $SITE, run the whole comparison (default --shape 1.7b on cuda)
#       and, when py-spy came along, a profile of rlvr; every figure is printed and also written
#       to $OUT (gpu_compare.log, gpu_compare.json, rlvr.pyspy).
#
# Environment: PYTHON (python3), WHEELS (.whl), SITE (/tmp/site), OUT (/tmp/gpu_bench_out),
# PY_VERSION (3.12, for --prepare), PROFILE (1; 0 skips the py-spy rerun).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-/tmp/gpu_bench_out}
TRAVEL_LIMIT_MIB=48  # of the 64 MiB that travel: room for the checkout to grow

prepare() {
  local version=${PY_VERSION:-3.12}
  mkdir -p "$WHEELS"
  # pip does not widen one manylinux tag to the older ones: py-spy's wheel is manylinux1
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    --abi "cp${version/./}" --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" -r bench/gpu_wheels.txt
  PYTHONPATH=src "$PYTHON" bench/gpu_compare.py --save-tokenizer "$WHEELS/smollm2-tokenizer"
  local checkout wheels
  checkout=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  wheels=$(du -sb "$WHEELS" | cut -f1)
  ls -l "$WHEELS"
  echo "travels: checkout $((checkout / 1048576)) MiB + $WHEELS $((wheels / 1048576)) MiB" \
       "= $(((checkout + wheels) / 1048576)) MiB (limit here ${TRAVEL_LIMIT_MIB} MiB, 64 MiB in all)"
  if [ $((checkout + wheels)) -gt $((TRAVEL_LIMIT_MIB * 1048576)) ]; then
    echo "too much to carry: drop wheels or files" >&2
    exit 1
  fi
}

install_wheels() {
  mkdir -p "$SITE"
  if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
  else  # no pip: a wheel is a zip file, and its scripts go to bin/
    for wheel in "$WHEELS"/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$SITE"; done
    mkdir -p "$SITE/bin"
    for script in "$SITE"/*.data/scripts/*; do
      [ -e "$script" ] && mv "$script" "$SITE/bin/" && chmod +x "$SITE/bin/$(basename "$script")"
    done
  fi
}

if [ "${1:-}" = "--prepare" ]; then
  prepare
  exit 0
fi
mkdir -p "$OUT"
install_wheels
export PYTHONPATH="$SITE:$PWD/src" PATH="$SITE/bin:$PATH"
"$PYTHON" - <<'PY'
import sys, torch, transformers, peft, pydantic, rlvr  # without these nothing runs: stop here
try:
    import trl, datasets  # without them the TRL leg fails on its own and the rest goes on
    trl_version = trl.__version__
except ImportError as exc:
    trl_version = f"not importable ({exc})"
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda, "|", gpu,
      "| transformers", transformers.__version__, "| peft", peft.__version__, "| pydantic", pydantic.__version__,
      "| trl", trl_version)
PY
profile=()
if [ "${PROFILE:-1}" = 1 ] && command -v py-spy >/dev/null; then
  profile=(--profile "$OUT/rlvr.pyspy")
fi
"$PYTHON" bench/gpu_compare.py --shape 1.7b --tokenizer "$WHEELS/smollm2-tokenizer" --json "$OUT/gpu_compare.json" \
  ${profile[@]+"${profile[@]}"} "$@" 2>&1 | tee "$OUT/gpu_compare.log"
