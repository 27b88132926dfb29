#!/usr/bin/env bash
# The sparse prefill kernel's per-pair timeline (src/sm90/sparse_prefill/trace.cuh) on the GPU in one
# device call: each row runs in a trace build of hmla-bench with $HMLA_TRACE_FILE set, and
# scripts/profile/prefill_trace_summary.py prints where a pair's clocks go (the timeline of the
# row's last call; the trace build records one store per event, so its times are a little above a
# release build's).
#   scripts/gpu_prefill_trace.sh ["--h-q 64 --d-qk 576 --s-kv 8192" ...]   (s_q 4096, topk 2048)
# HMLA_BIN=dir holding a trace build's hmla-bench (cmake -DHMLA_PREFILL_TRACE=ON, built on the
# workstation with the same nvcc: then nothing needs to be built or carried but the binary), else
# build-trace/ is built (carry the CUTLASS headers). Output: $OUT/trace_<row>.bin, .json, trace.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
if [ -n "${HMLA_BIN:-}" ]; then
  B=$HMLA_BIN/hmla-bench
else
  { cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DHMLA_PREFILL_TRACE=ON &&
    cmake --build build-trace -j"$(nproc)" --target hmla-bench; } > "$OUT/build_trace.log" 2>&1 ||
    { tail -n 40 "$OUT/build_trace.log"; exit 1; }
  B=build-trace/tools/hmla-bench/hmla-bench
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
if [ $# -eq 0 ]; then
  set -- "--h-q 64 --d-qk 576 --s-kv 8192" "--h-q 128 --d-qk 576 --s-kv 65536"
fi
status=0
for row in "$@"; do
  name=$(echo "$row" | tr -d '-' | tr ' ' '_')
  echo "== $row"
  # shellcheck disable=SC2086
  HMLA_TRACE_FILE="$OUT/trace_$name.bin" timeout 120 "$B" sparse-prefill --s-q 4096 --topk 2048 --topk-length full \
    $row --no-ceilings --no-anchors --iters 10 > "$OUT/bench_$name.log" 2>&1 || status=1
  tail -n 2 "$OUT/bench_$name.log"
  python3 scripts/profile/prefill_trace_summary.py "$OUT/trace_$name.bin" --json "$OUT/trace_$name.json" || status=1
done > "$OUT/trace.txt" 2>&1
cat "$OUT/trace.txt"
exit $status
