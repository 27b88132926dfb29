#!/usr/bin/env bash
# The split-KV plan's cost on the device, for prebuilt hmla-bench binaries (main and variants built
# on the workstation with scripts/build_bench_variant.sh): plan_us of sparse decode rows from b 1 to
# 4096 (V3.2, s_q 1; large batches at --s-k 4096: at the default 32768 positions the bench builds a
# 22 GB cache on the host for b 1024), then Nsight Compute's kernel time of the plan alone on three
# rows (no launch or event overhead).
#   scripts/gpu_plan_time.sh BENCH...
# Optional: HMLA_PLAN_TESTS=path/to/hmla_gpu_tests runs the dense and sparse decode fuzz suites
# (HMLA_FUZZ_SECONDS each, default 12) with it afterwards.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
[ $# -gt 0 ] || { echo "usage: $0 BENCH..." >&2; exit 2; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
rows=("--b 1 --h-q 16 --topk 2048" "--b 16 --h-q 16 --topk 2048" "--b 128 --h-q 64 --topk 2048"
      "--b 128 --h-q 128 --topk 2048" "--b 1024 --h-q 16 --topk 128 --s-k 4096"
      "--b 4096 --h-q 16 --topk 64 --s-k 4096")
echo "bench | row | attention us | plan_us"
for row in "${rows[@]}"; do
  for b in "$@"; do
    # shellcheck disable=SC2086
    out=$(timeout 60 "$b" sparse-decode --layout v32 --s-q 1 $row --no-ceilings --iters 30 2>&1)
    line=$(echo "$out" | grep -E '^ *fp8|rror' | head -n 1)
    echo "$(basename "$b") | $row | $(echo "$line" | awk -F'|' '{print $2 "|" $3}')"
    # a build with bench/variants/plan_phase_clocks.patch prints its phases
    echo "$out" | grep -E '^plan clocks' | head -n 2 | sed 's/^/    /'
  done
done
# HMLA_PLAN_NCU=0 skips the Nsight Compute times.
[ "${HMLA_PLAN_NCU:-1}" = 0 ] && set --
for b in "$@"; do
  for row in "--b 16 --h-q 16 --topk 2048" "--b 128 --h-q 64 --topk 2048" "--b 4096 --h-q 16 --topk 64 --s-k 4096"; do
    # shellcheck disable=SC2086
    t=$(timeout 90 ncu --clock-control none --kernel-name regex:decode_scheduler --launch-count 2 \
          --metrics gpu__time_duration.sum "$b" sparse-decode --layout v32 --s-q 1 $row --no-ceilings \
          --iters 2 --warmup 1 --warmup-ms 0 2>&1 | grep -E 'gpu__time_duration' | tr -s ' ' | tail -n 1)
    echo "$(basename "$b") | $row | ncu plan kernel: $t"
  done
done
if [ -n "${HMLA_PLAN_TESTS:-}" ]; then
  HMLA_FUZZ_SECONDS=${HMLA_FUZZ_SECONDS:-12} timeout 120 "$HMLA_PLAN_TESTS" --gtest_brief=1 \
    --gtest_filter='DenseDecodeFuzz*:SparseDecodeFuzz*' 2>&1 | grep -E 'fuzz:|Failure|PASSED|FAILED' | head -n 12
fi
