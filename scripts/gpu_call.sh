#!/usr/bin/env bash
# One device call that times prebuilt variants and runs compare.py, all within the call's limit:
#   LIMIT=SECONDS VARIANTS=DIR COMPARE="sparse_decode sparse_prefill dense" bash scripts/gpu_call.sh
# - Archives carried in .deps/packed (scripts/carry_pack.sh) are unpacked first.
# - With COMPARE set, the Python package (pip, from ./python, ~45 s on 16 cores) and FlashMLA
#   (.deps/compare/build_flashmla.sh, ~2 min, seconds from the kit's prebuilt) build in the
#   background while the variants run.
# - VARIANTS: a folder for scripts/gpu_variants.sh (bench_main and bench_NAME timed row by row,
#   tests_NAME run with their filters; HMLA_AB_ROWS, HMLA_AB_REPS, HMLA_VARIANT_FILTER* apply).
# - Then compare.py once per kind in COMPARE, each given what is left of LIMIT (at most 200 s).
# - PATCH=FILE: applied (git apply) to this copy of the tree before the Python package builds, so
#   that compare.py times a variant's kernels (the device's tree is a copy: nothing comes back).
# Everything under $OUT ends as one archive ($OUT/out.tgz), since the device tool returns few files.
# Device-tool call: carry .deps/packed, .deps/anchors and .deps/compare; timeout_s ~ LIMIT + 15.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
limit=${LIMIT:-560}
[ -d .deps/packed ] && bash scripts/carry_pack.sh --unpack
export PATH="/usr/local/cuda/bin:$PATH" PIP_BREAK_SYSTEM_PACKAGES=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader

py_pid= fm_pid=
if [ -n "${PATCH:-}" ]; then
  git apply "$PATCH" || { echo "PATCH $PATCH does not apply" >&2; exit 1; }
  echo "applied $PATCH"
fi
if [ -n "${COMPARE:-}" ]; then
  (s=$SECONDS; python3 -m pip install -q --no-build-isolation --no-deps ./python; echo "rc $? in $((SECONDS - s)) s") \
    > "$OUT/python_build.log" 2>&1 &
  py_pid=$!
  bash .deps/compare/build_flashmla.sh /tmp/fm > "$OUT/flashmla_build.log" 2>&1 &
  fm_pid=$!
fi

if [ -n "${VARIANTS:-}" ]; then
  echo "== variants in $VARIANTS at $SECONDS s"
  OUT=$OUT/variants bash scripts/gpu_variants.sh "$VARIANTS"
fi

if [ -n "${COMPARE:-}" ]; then
  wait "$py_pid"; echo "python package: $(tail -n 1 "$OUT/python_build.log")"
  wait "$fm_pid"; echo "FlashMLA: $(tail -n 1 "$OUT/flashmla_build.log")"
  for kind in $COMPARE; do
    left=$((limit - SECONDS - 15))
    [ "$left" -gt 200 ] && left=200
    [ "$left" -gt 30 ] || { echo "== compare.py $kind skipped: $left s left"; continue; }
    echo "== compare.py $kind at $SECONDS s, limit $left s"
    PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/fm/FlashMLA timeout "$left" python3 .deps/compare/compare.py \
      --out "$OUT/compare_$kind" --only "$kind" > "$OUT/compare_${kind}_stdout.log" 2>&1
    grep -E "SUMMARY|Error|Traceback" "$OUT/compare_${kind}_stdout.log" | cut -c1-300 | tail -n 4
  done
fi
(cd "$OUT" && tar czf /tmp/out.tgz . && find . -mindepth 1 -delete && mv /tmp/out.tgz .)
