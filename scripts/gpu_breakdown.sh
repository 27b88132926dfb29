#!/usr/bin/env bash
# Per-kernel GPU time of one dense decode call (plan, attention kernel, combine) for a few rows,
# through Nsight Compute's gpu__time_duration (kernels serialised, so programmatic dependent launch
# does not overlap them here). Usage: scripts/gpu_breakdown.sh ["row args" ...]
#   default rows: the three small-batch anchor rows (b = 1, 8, 32; h_q 128; s_k 8192)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
rows=("$@")
[ ${#rows[@]} -eq 0 ] && rows=("--b 1 --h-q 128 --s-k 8192" "--b 8 --h-q 128 --s-k 8192" "--b 32 --h-q 128 --s-k 8192")
if ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build-gpu -j"$(nproc)" --target hmla-bench; } \
     > "$OUT/breakdown_build.log" 2>&1; then
  tail -n 40 "$OUT/breakdown_build.log"; exit 1
fi
for row in "${rows[@]}"; do
  echo "== $row"
  # shellcheck disable=SC2086
  timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum \
    --kernel-name regex:'dense_decode_kernel|combine_kernel|decode_scheduler_kernel' --launch-count 24 \
    build-gpu/tools/hmla-bench/hmla-bench dense-decode $row --no-ceilings --no-backlog --warmup 2 --iters 8 \
    --rotate-mib 1 2>&1 |
    awk '/\) \(/ && /Context/ {line = $0; sub(/^ +(void )?/, "", line); gsub(/\(anonymous namespace\)::/, "", line); sub(/[<(].*/, "", line); name = line}
         /gpu__time_duration.sum/ {t[name] = t[name] " " $NF $(NF-1)}
         END {for (k in t) print "  " k ":" t[k]}'
done | tee "$OUT/breakdown.txt"
