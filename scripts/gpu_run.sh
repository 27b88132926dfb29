#!/usr/bin/env bash
# The GPU job, run on the H200 through the device tool (or by hand on any Hopper machine):
# build everything, run the gpu tests, a sanitizer subset, and the benchmark; logs and JSON go to
# $OUT (default ./gpu-out). Usage: scripts/gpu_run.sh [all|tests|bench|sanitize|quick|check] [bench args...]
#   check: the fast correctness subset (edge cases, API, determinism, NaN, FP8 dequantisation,
#          sanitizer cases and one shard of the FlashMLA grid), the default sweep with --check,
#          then the Python GPU suite.
#
# Device-tool call (from the repo root on the workstation), carrying the pinned headers:
#   run(command="bash scripts/gpu_run.sh all", carry=[".deps/cutlass-4.2.0.0/cutlass_library/source/include",
#       ".deps/cutlass-4.2.0.0/cutlass_library/source/tools/util/include", ".deps/googletest"])
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
shift || true
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
# The reference figures travel in .deps/anchors (a copy of ../shared/anchors, which the device
# tool does not send); hmla-bench finds ../shared/anchors by itself where it exists.
[ -f .deps/anchors/flashmla-h200.json ] && export HMLA_ANCHORS=${HMLA_ANCHORS:-$PWD/.deps/anchors/flashmla-h200.json}
status=0

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
  nvcc --version | tail -n 2
  cmake --version | head -n 1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

echo "== build"
# HMLA_SKIP_BUILD=1: use the binaries already in build-gpu/ (built on the workstation with the same
# nvcc and carried over), which saves the device the build.
if [ "${HMLA_SKIP_BUILD:-0}" = 1 ]; then
  echo "build skipped (HMLA_SKIP_BUILD=1): $(ls build-gpu/tests/hmla_gpu_tests build-gpu/tests/hmla_cpu_tests build-gpu/tools/hmla-bench/hmla-bench 2>&1 | tr '\n' ' ')"
elif ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release &&
       cmake --build build-gpu -j"$(nproc)"; } > "$OUT/build.log" 2>&1; then
  tail -n 60 "$OUT/build.log"
  exit 1
else
  echo "build ok"
fi

run_tests() {
  echo "== gpu tests"
  test_rc=0
  timeout "${HMLA_TEST_TIMEOUT:-420}" build-gpu/tests/hmla_gpu_tests --gtest_brief=1 "$@" > "$OUT/gpu_tests.log" 2>&1 || test_rc=$?
  [ "$test_rc" -eq 0 ] || status=1
  [ "$test_rc" -eq 124 ] && echo "gpu tests: timed out after ${HMLA_TEST_TIMEOUT:-420} s (a hang?)"
  grep -E "FAILED|PASSED|SKIPPED|tests ran" "$OUT/gpu_tests.log" | tail -n 40
  echo "== cpu tests"
  build-gpu/tests/hmla_cpu_tests --gtest_brief=1 > "$OUT/cpu_tests.log" 2>&1 || status=1
  tail -n 3 "$OUT/cpu_tests.log"
}
run_sanitizer() {
  # One call per subset, so that a report (or a timeout) in one kernel family leaves the other's
  # result readable.
  echo "== compute-sanitizer (memcheck, racecheck) on the dense and sparse sanitizer subsets"
  for subset in Dense Sparse; do
    for tool in memcheck racecheck; do
      log="$OUT/sanitizer_$tool.log"
      [ "$subset" = Sparse ] && log="$OUT/sanitizer_sparse_$tool.log"
      timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 build-gpu/tests/hmla_gpu_tests \
        --gtest_filter="*${subset}DecodeSanitizer*" --gtest_brief=1 > "$log" 2>&1 || status=1
      echo "$subset $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1)"
    done
  done
}
run_bench() {
  echo "== hmla-bench"
  timeout "${HMLA_BENCH_TIMEOUT:-420}" build-gpu/tools/hmla-bench/hmla-bench "$@" --json "$OUT/bench.json" > "$OUT/bench.log" 2> "$OUT/bench.err" || status=1
  cat "$OUT/bench.log"
  tail -n 5 "$OUT/bench.err"
}

run_check() {
  run_tests --gtest_filter='*Edge*:*Api*:*Device*:*Sanitizer*:*Determinism*:*CacheStrides*:*NaN*:*Fp8Dequant*'
  mv "$OUT/gpu_tests.log" "$OUT/gpu_tests_subset.log"
  if [ "$test_rc" -eq 124 ]; then tail -n 20 "$OUT/gpu_tests_subset.log"; return; fi
  GTEST_TOTAL_SHARDS=16 GTEST_SHARD_INDEX=${HMLA_GRID_SHARD:-5} run_tests --gtest_filter='FlashMLAGrid*'
  run_bench --sweep default --check "$@"
  echo "== python gpu tests"
  timeout "${HMLA_PY_TIMEOUT:-360}" bash scripts/run_python_tests.sh gpu > "$OUT/python_all.log" 2>&1 || status=1
  grep -E "passed|failed|error|overhead|us per call|Error" "$OUT/python_all.log" | tail -n 25
}
# The device tool brings back at most 8 files: past 7, logs travel as one archive beside the JSON.
pack_logs() {
  local n
  n=$(find "$OUT" -maxdepth 1 -type f | wc -l)
  if [ "$n" -gt 7 ]; then
    (cd "$OUT" && tar czf /tmp/hmla_logs.tgz --exclude='*.json' --exclude='logs.tgz' . &&
     find . -maxdepth 1 -type f ! -name '*.json' -delete && mv /tmp/hmla_logs.tgz logs.tgz)
  fi
}
trap pack_logs EXIT

case "$mode" in
  check) run_check "$@" ;;
  all) run_tests; run_sanitizer; run_bench --sweep default --check "$@" ;;
  tests) run_tests "$@" ;;
  sanitize) run_sanitizer ;;
  bench) run_bench "$@" ;;
  quick) run_tests --gtest_filter='*Sanitizer*:*Device*'; run_bench --sweep quick --check "$@" ;;
  *) echo "unknown mode '$mode' (all|tests|bench|sanitize|quick|check)"; exit 2 ;;
esac
exit $status
