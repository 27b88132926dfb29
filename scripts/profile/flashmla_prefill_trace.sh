#!/usr/bin/env bash
# FlashMLA's sparse prefill kernel traced pair by pair (scripts/profile/flashmla_prefill_trace.py says
# what and why), in one device call: the kit's source (.deps/compare/flashmla-sm90-kit.tgz, see
# ../shared/anchors/compare/README.md) with scripts/profile/flashmla_prefill_trace.patch, built from
# source (~2 min on 16 cores), then the rows. Carry .deps/compare. Beside it, hmla's own trace of the
# same rows: scripts/gpu_trace.sh prefill. The patch keeps one line of context per hunk: it adds
# measurement points to the kit's own file and carries as little of FlashMLA's source as applies.
#   HMLA_FM_TRACE_ROWS="64 576 8192;128 576 65536" bash scripts/profile/flashmla_prefill_trace.sh
# (rows: "h_q d_qk s_kv" of compare.py's s_q 4096 topk 2048 rows; the default is gpu_trace.sh prefill's
# two rows). HMLA_FM_TRACE_BUILD_ONLY=1 builds and stops (to build beside another step).
set -uo pipefail
cd "$(dirname "$0")/../.." && root=$PWD
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
work=${HMLA_FM_TRACE_DIR:-/tmp/fm_traced}
export PATH=/usr/local/cuda/bin:$PATH
if [ ! -f "$work/FlashMLA/flash_mla/cuda.built" ]; then
  rm -rf "$work" && mkdir -p "$work"
  tar xzf .deps/compare/flashmla-sm90-kit.tgz -C "$work"
  (cd "$work" && patch -p1 -s < "$root/scripts/profile/flashmla_prefill_trace.patch") || exit 1
  start=$(date +%s)
  if ! (cd "$work/FlashMLA" && FLASH_MLA_DISABLE_SM100=1 MAX_JOBS=${MAX_JOBS:-12} NVCC_THREADS=2 \
        python3 setup.py build_ext --inplace > "$OUT/flashmla_traced_build.log" 2>&1); then
    tail -n 30 "$OUT/flashmla_traced_build.log"; echo "traced FlashMLA build failed"; exit 1
  fi
  touch "$work/FlashMLA/flash_mla/cuda.built"
  echo "traced FlashMLA built in $(( $(date +%s) - start )) s"
fi
[ "${HMLA_FM_TRACE_BUILD_ONLY:-0}" = 1 ] && exit 0
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
IFS=';' read -r -a rows <<< "${HMLA_FM_TRACE_ROWS:-64 576 8192;128 576 65536}"
for r in "${rows[@]}"; do
  read -r h d s <<< "$r"
  PYTHONUNBUFFERED=1 PYTHONPATH="$work/FlashMLA" timeout 120 python3 scripts/profile/flashmla_prefill_trace.py \
    --compare .deps/compare/compare.py --h-q "$h" --d-qk "$d" --s-kv "$s" --json "$OUT/flashmla_trace_h${h}_d${d}_s${s}.json"
done
