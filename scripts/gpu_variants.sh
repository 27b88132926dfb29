#!/usr/bin/env bash
# Prebuilt variants on the H200 in one device call: the variants' hmla-bench binaries timed row by
# row against each other (scripts/gpu_ab.sh), then each test binary's GPU suite.
#   scripts/gpu_variants.sh DIR
# DIR holds binaries built on the workstation (same nvcc) from main and from bench/variants/*.patch:
#   bench_NAME           timed on HMLA_AB_ROWS (default: the sparse rows of the default sweep);
#                        bench_main is the baseline ("cur" in the output);
#   hmla_gpu_tests_NAME  (or tests_NAME, the name scripts/build_bench_variant.sh --tests gives)
#                        run with the gtest filter HMLA_VARIANT_FILTER_NAME, else HMLA_VARIANT_FILTER
#                        (default: the sparse decode suite), each under HMLA_VARIANT_TEST_TIMEOUT s;
#                        HMLA_VARIANT_SANITIZE_NAME, when set, is a filter run under memcheck and racecheck.
# Logs go to $OUT as one archive; one verdict line per test binary is printed.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/gpu_variants.sh DIR}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader

benches=()
for b in "$dir"/bench_*; do [ "$b" = "$dir/bench_main" ] || [ ! -x "$b" ] || benches+=("$b"); done
if [ -x "$dir/bench_main" ]; then
  # gpu_ab.sh's "cur" is this tree's build-gpu bench: main's binary stands in for it.
  mkdir -p build-gpu/tools/hmla-bench && cp "$dir/bench_main" build-gpu/tools/hmla-bench/hmla-bench
  HMLA_AB_PREBUILT=1 HMLA_AB_REPS=${HMLA_AB_REPS:-1} HMLA_AB_ROWS="${HMLA_AB_ROWS:---sweep default --only sparse_decode}" \
    timeout "${HMLA_AB_TIMEOUT:-300}" bash scripts/gpu_ab.sh "${benches[@]}" > "$OUT/ab.log" 2>&1 || status=1
  cut -c1-170 "$OUT/ab.log"
fi

for t in "$dir"/hmla_gpu_tests_* "$dir"/tests_*; do
  [ -x "$t" ] || continue
  name=${t##*/}; name=${name#hmla_gpu_}; name=${name#tests_}
  filter_var=HMLA_VARIANT_FILTER_$name
  filter=${!filter_var:-${HMLA_VARIANT_FILTER:-*SparseDecode*:*Fp8Dequant*}}
  start=$(date +%s)
  timeout "${HMLA_VARIANT_TEST_TIMEOUT:-150}" "$t" --gtest_brief=1 --gtest_filter="$filter" > "$OUT/tests_$name.log" 2>&1
  rc=$?
  [ $rc = 0 ] || status=1
  echo "== tests $name ($filter): rc $rc, $(( $(date +%s) - start )) s; $(grep -E '^\[  PASSED|tests? ran' "$OUT/tests_$name.log" | tail -n 1)"
  grep -E '^\[  FAILED|Failure' "$OUT/tests_$name.log" | head -n 12
  sanitize_var=HMLA_VARIANT_SANITIZE_$name
  if [ -n "${!sanitize_var:-}" ]; then
    for tool in memcheck racecheck; do
      timeout "${HMLA_SANITIZER_TIMEOUT:-150}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" --gtest_brief=1 \
        --gtest_filter="${!sanitize_var}" > "$OUT/sanitizer_${tool}_$name.log" 2>&1 || status=1
      echo "   $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_${tool}_$name.log" | tail -n 1)"
    done
  fi
done
(cd "$OUT" && tar czf /tmp/logs.tgz --exclude='*.tgz' . && find . -type f -name '*.log' -delete && mv /tmp/logs.tgz logs.tgz)
exit $status
