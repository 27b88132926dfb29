#!/usr/bin/env bash
# The decode calls' order against a kernel launched after them with programmatic dependent launch
# (tests/gpu/test_stream_order.cu), in one device call: the stream-order tests with the combine whose
# spare CTAs all retired at once (HMLA_OLD: a directory with tests_oldcombine / bench_oldcombine built by
# scripts/build_bench_variant.sh oldcombine --patch bench/variants/combine_spare_ctas_retire_at_once.patch
# --only src/scheduler/combine --tests; they should fail there, which the tests' first form did not:
# docs/PERF.md "The combine's grid and the kernel after it") and with this tree's (to pass),
# the decode suites that run the combine, compute-sanitizer on the new tests, and hmla-bench rows of
# both builds. Binaries from .deps/bin (this tree, scripts/carry_pack.sh .deps/bin .deps/old).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/carry_pack.sh --unpack
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
T=.deps/bin/hmla_gpu_tests B=.deps/bin/hmla-bench
old=${HMLA_OLD:-.deps/old}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
status=0
if [ -x "$old/tests_oldcombine" ]; then
  echo "== stream order, spare combine CTAs retiring at once (should fail)"
  timeout 120 "$old/tests_oldcombine" --gtest_brief=1 --gtest_filter='*StreamOrder*' 2>&1 | grep -E "Failure|differ|PASSED|FAILED" | head -n 8
fi
echo "== stream order, this tree"
timeout 120 "$T" --gtest_brief=1 --gtest_filter='*StreamOrder*' > "$OUT/stream_order.log" 2>&1 || status=1
grep -E "Failure|differ|PASSED|FAILED" "$OUT/stream_order.log" | head -n 8
echo "== decode suites that run the combine"
timeout 300 "$T" --gtest_brief=1 \
  --gtest_filter='*SparseDecode*:*DecodePlan*:*Edge*:*Api*:*Determinism*:*CacheStrides*:Cases/MergeGpu.*:*LaunchReplay*:-*Sanitizer*' \
  > "$OUT/decode_tests.log" 2>&1 || status=1
grep -E "FAILED|PASSED|tests ran" "$OUT/decode_tests.log" | tail -n 12
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$T" --gtest_brief=1 \
  --gtest_filter='*StreamOrder*:*SparseDecodeSanitizer*' > "$OUT/memcheck.log" 2>&1 || status=1
echo "memcheck: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1)"
echo "== hmla-bench, spare CTAs retiring at once / the first waiting (us)"
for round in 1 2; do
  for row in "sparse-decode --layout v32 --s-q 1 --b 128 --h-q 64 --topk 2048" \
             "sparse-decode --layout model1 --b 128 --s-q 2 --s-k 16384 --page 256 --h-q 128 --topk 128" \
             "sparse-decode --layout v32 --s-q 1 --b 16 --h-q 16 --topk 2048" \
             "dense-decode --b 128 --s-q 1 --h-q 64 --s-k 8192"; do
    for b in "$old/bench_oldcombine" "$B"; do
      [ -x "$b" ] || continue
      # shellcheck disable=SC2086
      line=$(timeout 60 "$b" $row --no-ceilings --iters 50 2>&1 | grep -E '^ *(fp8|[0-9])|rror' | head -n 1)
      echo "r$round $(basename "$b") | $line"
    done
  done
done | tee "$OUT/bench_ab.log"
exit $status
