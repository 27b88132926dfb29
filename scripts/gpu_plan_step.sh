#!/usr/bin/env bash
# One device call for what a fresh plan costs a decoding step, from binaries built on the
# workstation into .deps/plan and packed (scripts/carry_pack.sh .deps/plan; carry .deps/packed):
#   tests_*   hmla_gpu_tests: the plan and sparse decode suites, dense decode's edges, API and fuzz
#             (HMLA_FUZZ_SECONDS each), launch replay; memcheck on the plan's form edges and the
#             fresh-plan tests, memcheck and racecheck on the sparse decode sanitizer subset
#   bench_*   hmla-bench builds, timed alternately on the same rows, HMLA_STEP_ROUNDS rounds (2):
#             sparse decode rows with plan_us (the plan between two events), cold_us (the same after
#             the L2 was swept) and step_us (what the plan adds to the attention call behind it),
#             and dense decode rows (attention + combine; HMLA_STEP_DENSE=0 leaves them out)
# Output under $OUT: tests.txt, sanitize.txt, rows.txt (every bench line as printed).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
bash scripts/carry_pack.sh --unpack
export PATH="/usr/local/cuda/bin:$PATH"
P=.deps/plan
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | tee "$OUT/card.txt"
mapfile -t benches < <(ls "$P"/bench_*)
sparse_rows=("--layout v32 --s-q 1 --b 1 --h-q 16 --topk 2048" "--layout v32 --s-q 1 --b 16 --h-q 16 --topk 2048"
             "--layout v32 --s-q 1 --b 128 --h-q 64 --topk 2048" "--layout v32 --s-q 1 --b 128 --h-q 128 --topk 2048"
             "--layout v32 --s-q 1 --b 1024 --h-q 16 --topk 128 --s-k 4096"
             "--layout v32 --s-q 1 --b 4096 --h-q 16 --topk 64 --s-k 4096"
             "--layout model1 --b 128 --s-q 2 --s-k 16384 --page 256 --h-q 128 --topk 128")
dense_rows=("--b 1 --s-q 1 --h-q 128 --s-k 8192" "--b 8 --s-q 1 --h-q 128 --s-k 8192"
            "--b 32 --s-q 1 --h-q 128 --s-k 8192" "--b 128 --s-q 2 --h-q 64 --s-k 1024")
# Each bench on one row, the row's first line as printed (or its error).
time_row() {
  local family=$1 row=$2 pattern=$3 round=$4 b line
  for b in "${benches[@]}"; do
    # shellcheck disable=SC2086
    line=$(timeout 60 "$b" "$family" $row --no-ceilings --iters 50 2>&1 | grep -E "$pattern|rror" | head -n 1)
    echo "r$round $(basename "$b") | $line"
  done
}
for round in $(seq "${HMLA_STEP_ROUNDS:-2}"); do
  for row in "${sparse_rows[@]}"; do time_row sparse-decode "$row" '^ *fp8' "$round"; done
  [ "${HMLA_STEP_DENSE:-1}" = 1 ] || continue
  for row in "${dense_rows[@]}"; do time_row dense-decode "$row" '^ *[0-9]+ +[0-9]+ +[0-9]' "$round"; done
done | tee "$OUT/rows.txt"
for t in "$P"/tests_*; do
  [ -x "$t" ] || continue
  HMLA_FUZZ_SECONDS=${HMLA_FUZZ_SECONDS:-5} timeout 240 "$t" --gtest_brief=1 \
    --gtest_filter='DecodePlan*:*SparseDecode*:*DenseDecodeEdge*:DenseDecodeApi*:DenseDecodeFuzz*:LaunchReplay*:-*Sanitizer*' \
    > "$OUT/tests.txt" 2>&1
  echo "$(basename "$t") rc=$?"; grep -E "fuzz:|Failure|PASSED|FAILED|tests ran" "$OUT/tests.txt" | head -n 20
  {
    timeout 90 compute-sanitizer --tool memcheck "$t" --gtest_brief=1 \
      --gtest_filter='DecodePlan.FormEdges*:SparseDecodeDeterminism.FreshPlan*' 2>&1 | tail -n 3
    for tool in memcheck racecheck; do
      timeout 90 compute-sanitizer --tool "$tool" $([ "$tool" = racecheck ] && echo --racecheck-report hazard) \
        "$t" --gtest_brief=1 --gtest_filter='*SparseDecodeSanitizer*' 2>&1 | tail -n 3
    done
  } | tee "$OUT/sanitize.txt"
done
