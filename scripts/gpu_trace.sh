#!/usr/bin/env bash
# A kernel's per-step timeline on the GPU in one device call: each row runs in a trace build of
# hmla-bench with $HMLA_TRACE_FILE set, and the kernel's summary script prints where a step's clocks
# go (the timeline of the row's last call; a trace build records one store per event, so its times
# are a little above a release build's).
#   scripts/gpu_trace.sh prefill ["--h-q 64 --d-qk 576 --s-kv 8192" ...]   sparse prefill, s_q 4096 topk 2048
#                                    (src/sm90/sparse_prefill/trace.cuh, profile/prefill_trace_summary.py)
#   scripts/gpu_trace.sh sparse ["--layout model1 --b 128 ..." ...]        the wide sparse decode kernel
#                                    (src/sm90/sparse_decode/trace.cuh, profile/sparse_trace_summary.py)
# HMLA_BIN=dir holding a trace build's hmla-bench (cmake -DHMLA_PREFILL_TRACE=ON / -DHMLA_SPARSE_TRACE=ON,
# or scripts/build_bench_variant.sh NAME --flags -D..., built on the workstation with the same nvcc:
# then nothing needs to be built or carried but the binary), else build-trace/ is built (carry the
# CUTLASS headers). Output: $OUT/trace_<row>.bin, .json, trace.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/gpu_trace.sh prefill|sparse [ROW ...]}
shift
case "$kind" in
  prefill)
    option=HMLA_PREFILL_TRACE summary=prefill_trace_summary.py
    bench_args=(sparse-prefill --s-q 4096 --topk 2048 --topk-length full)
    [ $# -gt 0 ] || set -- "--h-q 64 --d-qk 576 --s-kv 8192" "--h-q 128 --d-qk 576 --s-kv 65536" ;;
  sparse)
    option=HMLA_SPARSE_TRACE summary=sparse_trace_summary.py
    bench_args=(sparse-decode)
    m1='--layout model1 --b 128 --s-q 2 --s-k 16384 --page 256 --h-q 128'
    [ $# -gt 0 ] || set -- "$m1 --topk 128" "$m1 --topk 128 --extra-topk 512 --extra-page 64" \
      "--layout v32 --b 128 --s-q 1 --h-q 128 --topk 2048" ;;
  *) echo "unknown kernel: $kind (prefill or sparse)" >&2; exit 2 ;;
esac
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
if [ -n "${HMLA_BIN:-}" ]; then
  B=$HMLA_BIN/hmla-bench
else
  { cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -D$option=ON &&
    cmake --build build-trace -j"$(nproc)" --target hmla-bench; } > "$OUT/build_trace.log" 2>&1 ||
    { tail -n 40 "$OUT/build_trace.log"; exit 1; }
  B=build-trace/tools/hmla-bench/hmla-bench
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
status=0
for row in "$@"; do
  name=$(echo "$row" | sed 's/--layout //; s/--extra-/x/g' | tr -d '-' | tr ' ' '_')
  echo "== $row"
  # shellcheck disable=SC2086
  HMLA_TRACE_FILE="$OUT/trace_$name.bin" timeout 120 "$B" "${bench_args[@]}" $row --no-ceilings --no-anchors \
    --iters 10 > "$OUT/bench_$name.log" 2>&1 || status=1
  tail -n 2 "$OUT/bench_$name.log"
  python3 "scripts/profile/$summary" "$OUT/trace_$name.bin" --json "$OUT/trace_$name.json" || status=1
done > "$OUT/trace.txt" 2>&1
cat "$OUT/trace.txt"
exit $status
