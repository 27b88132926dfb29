#!/usr/bin/env bash
# Sparse decode on the H200 in one device call: the GPU tests (the sparse suite, a dense subset),
# compute-sanitizer on the sanitizer subset, the bench's sparse rows, the Python GPU suite, and
# ../shared/anchors/compare/compare.py against FlashMLA (copied into .deps/compare, with
# .deps/anchors). Logs and JSON go to $OUT.
#   scripts/gpu_sparse.sh [steps]   steps: comma list of tests,densetests,sanitize,bench,compare,clocks,dense,python,ab
#                                   (default: tests,sanitize,bench,python,compare; densetests = a dense
#                                   subset of the GPU suite; dense = compare.py's dense rows too; ab = the
#                                   bench's sparse rows, this build against HMLA_AB_BASE; more = the NaN,
#                                   device-value, merge and fuzz suites; merge = the merge op's bench rows;
#                                   overhead = hmla-host-overhead and bench_overhead.py; prefill = the sparse prefill suite)
# Steps run in this order: prefill, compare, clocks, tests, densetests, more, merge, bench, sanitize, python,
# overhead, ab; the Python package and FlashMLA build in the background from the start.
# HMLA_COMPARE_ONLY: compare.py's kinds (default sparse_decode; e.g. sparse_decode,sparse_prefill).
# HMLA_TESTS_FILTER: the gtest filter of `tests` (default *Sparse*:*Fp8Dequant*, prefill included).
# HMLA_PY_INSTALLED=1: the Python package is already installed (built earlier in the same call).
# Knobs: HMLA_TEST_TIMEOUT, HMLA_PREFILL_TIMEOUT, HMLA_SANITIZERS ("memcheck racecheck"), HMLA_SANITIZER_FILTER,
# HMLA_SANITIZER_TIMEOUT, HMLA_COMPARE_TIMEOUT (seconds).
# HMLA_BIN=dir: use hmla_gpu_tests, hmla_cpu_tests and hmla-bench from dir (built on the workstation
# with the same nvcc, carried), else build into build-gpu/. Device-tool call: carry .deps/bin (or the
# CUTLASS headers to build), .deps/anchors, .deps/compare.
set -uo pipefail
cd "$(dirname "$0")/.."
steps=",${1:-tests,sanitize,bench,python,compare},"
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
status=0
has() { [[ "$steps" == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader

# The Python package and FlashMLA build on the CPUs while the C++ build and the GPU tests run.
py_pid= fm_pid=
if { has python || has compare || has clocks || has overhead; } && [ "${HMLA_PY_INSTALLED:-0}" != 1 ]; then
  export PIP_BREAK_SYSTEM_PACKAGES=1
  # Installed into the interpreter, as a user has it: the FlashMLA-style script tests run it in a
  # clean environment.
  python3 -m pip install -q --no-build-isolation --no-deps ./python > "$OUT/python_build.log" 2>&1 &
  py_pid=$!
fi
if { has compare || has clocks || has overhead; } && [ -f .deps/compare/build_flashmla.sh ]; then
  bash .deps/compare/build_flashmla.sh /tmp/fm > "$OUT/flashmla_build.log" 2>&1 &
  fm_pid=$!
fi

if [ -n "${HMLA_BIN:-}" ]; then
  T=$HMLA_BIN/hmla_gpu_tests; C=$HMLA_BIN/hmla_cpu_tests; B=$HMLA_BIN/hmla-bench
else
  { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build-gpu -j"$(nproc)"; } \
    > "$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log"; exit 1; }
  T=build-gpu/tests/hmla_gpu_tests; C=build-gpu/tests/hmla_cpu_tests; B=build-gpu/tools/hmla-bench/hmla-bench
fi

if has prefill; then
  echo "== gpu tests: sparse prefill"
  timeout "${HMLA_PREFILL_TIMEOUT:-300}" "$T" --gtest_brief=1 --gtest_filter='*SparsePrefill*' > "$OUT/prefill_tests.log" 2>&1 || status=1
  grep -E "FAILED|PASSED|tests ran|Failure|bad values|error of out" "$OUT/prefill_tests.log" | tail -n 30
fi
if [ -n "$py_pid" ]; then
  echo "== python package"
  wait "$py_pid" || { tail -n 30 "$OUT/python_build.log"; status=1; }
fi
if has compare; then
  echo "== compare.py"
  only=${HMLA_COMPARE_ONLY:-sparse_decode}
  has dense && only=dense,$only
  [ -n "$fm_pid" ] && { wait "$fm_pid" || { tail -n 20 "$OUT/flashmla_build.log"; status=1; }; fm_pid=; }
  PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/fm/FlashMLA timeout "${HMLA_COMPARE_TIMEOUT:-400}" python3 .deps/compare/compare.py \
    --out "$OUT/compare" --only "$only" > "$OUT/compare_stdout.log" 2>&1 || status=1
  grep -E "^sparse_decode|^sparse_prefill|^dense_decode|SUMMARY|Error|Traceback" "$OUT/compare_stdout.log" | tail -n 70
fi
if has clocks; then
  echo "== compare.py with each call's SM clock (scripts/profile/compare_clocks.py)"
  only=${HMLA_COMPARE_ONLY:-sparse_decode}
  [ -n "$fm_pid" ] && { wait "$fm_pid" || { tail -n 20 "$OUT/flashmla_build.log"; status=1; }; fm_pid=; }
  PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/fm/FlashMLA timeout "${HMLA_COMPARE_TIMEOUT:-400}" python3 scripts/profile/compare_clocks.py \
    --compare .deps/compare/compare.py --out "$OUT/clocks" --only "$only" > "$OUT/clocks_stdout.log" 2>&1 || status=1
  grep -E "^sparse_decode|^sparse_prefill|^dense_decode|clocks:|SUMMARY|Error|Traceback" "$OUT/clocks_stdout.log" | tail -n 80
fi
if has tests; then
  echo "== gpu tests: sparse decode"
  timeout "${HMLA_TEST_TIMEOUT:-300}" "$T" --gtest_brief=1 --gtest_filter="${HMLA_TESTS_FILTER:-*Sparse*:*Fp8Dequant*}" > "$OUT/sparse_tests.log" 2>&1 || status=1
  grep -E "FAILED|PASSED|tests ran|Failure" "$OUT/sparse_tests.log" | tail -n 30
fi
if has densetests; then
  echo "== gpu tests: dense subset"
  timeout 200 "$T" --gtest_brief=1 --gtest_filter='*Edge*:*Api*:*Determinism*:*CacheStrides*:-*Sparse*' > "$OUT/dense_tests.log" 2>&1 || status=1
  grep -E "FAILED|PASSED|tests ran" "$OUT/dense_tests.log" | tail -n 10
  "$C" --gtest_brief=1 > "$OUT/cpu_tests.log" 2>&1 || status=1
  tail -n 2 "$OUT/cpu_tests.log"
fi
if has more; then
  echo "== gpu tests: NaN, device-side values, merge, fuzz of both decode families"
  timeout "${HMLA_MORE_TIMEOUT:-200}" "$T" --gtest_brief=1 \
    --gtest_filter='DenseDecodeNaN.*:DenseDecodeDeviceValues*.*:Cases/MergeGpu.*:*Fuzz*' > "$OUT/more_tests.log" 2>&1 || status=1
  grep -E "FAILED|PASSED|tests ran|Failure|seed|cases" "$OUT/more_tests.log" | tail -n 30
fi
if has merge; then
  echo "== hmla-bench merge rows"
  for row in "--b 32 --h-q 128" "--b 128 --h-q 128 --states 8" "--b 32768 --h-q 16"; do
    # shellcheck disable=SC2086
    timeout 60 "$B" merge $row --check --no-ceilings 2>&1 | tail -n 2
  done | tee "$OUT/merge_bench.log"
fi
if has bench; then
  echo "== hmla-bench sparse rows"
  HMLA_ANCHORS=.deps/anchors/flashmla-h200.json timeout 300 "$B" --sweep default --only sparse_decode --check \
    --json "$OUT/sparse_bench.json" > "$OUT/sparse_bench.log" 2>&1 || status=1
  tail -n 24 "$OUT/sparse_bench.log"
fi
if has sanitize; then
  for tool in ${HMLA_SANITIZERS:-memcheck racecheck}; do
    timeout "${HMLA_SANITIZER_TIMEOUT:-200}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$T" --gtest_brief=1 \
      --gtest_filter="${HMLA_SANITIZER_FILTER:-*SparseDecodeSanitizer*}" > "$OUT/sanitizer_$tool.log" 2>&1 || status=1
    echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -n 1)"
  done
fi
if has python; then
  echo "== python gpu tests (sparse)"
  timeout "${HMLA_PY_TIMEOUT:-300}" python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_gpu_sparse.py \
    python/tests/test_gpu_flashmla_script.py python/tests/test_gpu_compile.py python/tests/test_cpu_torch_library.py \
    python/tests/test_gpu_merge.py python/tests/test_gpu_torch.py python/tests/test_gpu_graph.py \
    python/tests/test_gpu_torch_fast.py \
    > "$OUT/python_sparse.log" 2>&1 || status=1
  tail -n 25 "$OUT/python_sparse.log"
fi
if has overhead; then
  # The C++ run entry points' host time (hmla-host-overhead), then the Python call's, FlashMLA's beside
  # it when compare built it, in one run.
  echo "== host overhead of a small decode call (hmla-host-overhead, python/tests/bench_overhead.py)"
  timeout 120 "$(dirname "$B")/hmla-host-overhead" --json "$OUT/host_overhead.json" || status=1
  if [ -n "$fm_pid" ] && ! has compare; then wait "$fm_pid" || tail -n 20 "$OUT/flashmla_build.log"; fi
  pypath=""
  [ -d /tmp/fm/FlashMLA ] && pypath=/tmp/fm/FlashMLA
  (cd /tmp && OUT="$OUT" PYTHONPATH=$pypath timeout "${HMLA_OVERHEAD_TIMEOUT:-180}" python3 "$OLDPWD/python/tests/bench_overhead.py") \
    > "$OUT/overhead.log" 2>&1 || status=1
  tail -n 20 "$OUT/overhead.log"
fi
if has ab; then
  # HMLA_AB_BASE: prebuilt hmla-bench binaries named bench_NAME (space-separated; for example main's, built on the
  # workstation), timed against this build's row by row on the sparse rows.
  echo "== A/B: this build against ${HMLA_AB_BASE:?HMLA_AB_BASE names the baseline hmla-bench}"
  mkdir -p build-gpu/tools/hmla-bench
  [ "$B" -ef build-gpu/tools/hmla-bench/hmla-bench ] || cp "$B" build-gpu/tools/hmla-bench/hmla-bench
  HMLA_AB_PREBUILT=1 HMLA_AB_REPS=${HMLA_AB_REPS:-1} HMLA_AB_ROWS="${HMLA_AB_ROWS:---sweep default --only sparse_decode}" \
    timeout "${HMLA_AB_TIMEOUT:-240}" bash scripts/gpu_ab.sh $HMLA_AB_BASE > "$OUT/ab.log" 2>&1 || status=1
  cat "$OUT/ab.log" | cut -c1-150
fi
# The device tool brings back at most 8 files: the logs travel as one archive beside the JSON.
(cd "$OUT" && tar czf /tmp/logs.tgz --exclude='*.tgz' . && find . -type f -name '*.log' -delete && mv /tmp/logs.tgz logs.tgz)
exit $status
