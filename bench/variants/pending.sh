#!/usr/bin/env bash
# The variants of bench/variants built and not yet run, and the device calls that run them
# (bench/variants/README.md says what each expects; docs/PERF.md has the predictions).
#   bash bench/variants/pending.sh build         workstation: main's bench and every variant below
#                                                (.deps/wide, .deps/narrow, .deps/plan), packed with the
#                                                CUTLASS headers, and the comparison kit staged
#                                                (scripts/build.sh first: ~5 min, this ~12 min)
#   bash bench/variants/pending.sh run survey    device (~7 min): every built variant timed, nothing tested:
#                                                the gather floor, main / wide on the 14 sparse decode rows,
#                                                main / n16 / n16all / n16x2 on the narrow rows, main /
#                                                padded plan_us (when device time is short: then test the
#                                                winners)
#   bash bench/variants/pending.sh run wide      device (~9 min): the gather floor, main against the wide form's L1 prefetch
#                                                with the indices first (sparse_wide_l1_prefetch_indices_first.patch)
#                                                on the 14 sparse decode rows, its tests, then compare.py's
#                                                sparse decode rows with it
#   bash bench/variants/pending.sh run plan      device (~9 min): the plan kernel with its per-request shared
#                                                arrays padded against bank conflicts
#                                                (plan_padded_shared_arrays.patch) against main, its tests,
#                                                the plan-step diagnostic, then compare.py's sparse prefill
#                                                rows on main
#   bash bench/variants/pending.sh run narrow    device (~9 min): main against sixteen producer warps in the
#                                                narrow form (sparse_narrow_sixteen_producer_warps.patch) at
#                                                h_q 16 (n16, n16x2 with two tiles) and at h_q 16 and 32 (n16all) on the narrow
#                                                rows, n16all's tests and sanitizer cases, then compare.py's
#                                                sparse decode rows with n16
#   bash bench/variants/pending.sh run profile   device (~5 min): Nsight Compute on V3.2 b 128 h_q 16 and
#                                                h_q 64 with the memory and instruction sections, and on
#                                                the plan kernel at b 4096 and b 128
# Each run: carry .deps/packed, .deps/anchors and .deps/compare; timeout_s 600 (run wide: CALL_LIMIT=S
# for a shorter call, default 530 s of command). Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
v=bench/variants
build() {
  set -e
  local b=scripts/build_bench_variant.sh
  bash $b main
  bash $b empty --patch $v/plan_diag_empty_carveout.patch --only src/scheduler/decode_scheduler \
    --flags "-DHMLA_PLAN_DIAG_EMPTY"
  bash $b plain --patch $v/plan_diag_plain_kernel.patch --only src/scheduler/decode_scheduler \
    --flags "-DHMLA_PLAN_DIAG_PLAIN"
  bash $b plainsmem --patch $v/plan_diag_plain_kernel.patch --only src/scheduler/decode_scheduler \
    --flags "-DHMLA_PLAN_DIAG_PLAIN -DHMLA_PLAN_DIAG_PLAIN_SMEM"
  bash $b padded --patch $v/plan_padded_shared_arrays.patch --only src/scheduler/decode_scheduler --tests
  bash $b wide --patch $v/sparse_wide_l1_prefetch_indices_first.patch --tests
  bash $b n16 --patch $v/sparse_narrow_sixteen_producer_warps.patch
  bash $b n16all --patch $v/sparse_narrow_sixteen_producer_warps.patch --tests \
    --flags "-DHMLA_NARROW_SIXTEEN_PRODUCER_WARPS=2"
  bash $b n16x2 --patch $v/sparse_narrow_sixteen_producer_warps.patch \
    --flags "-DHMLA_NARROW_SIXTEEN_PRODUCER_WARPS=3"
  local d=.deps/variants
  rm -rf .deps/plan .deps/wide .deps/narrow && mkdir -p .deps/plan .deps/wide .deps/narrow
  cp $d/bench_main $d/bench_empty $d/bench_plain $d/bench_plainsmem $d/bench_padded $d/tests_padded .deps/plan/
  cp $d/bench_main $d/bench_wide $d/tests_wide .deps/wide/
  cp $d/bench_main $d/bench_n16 $d/bench_n16all $d/bench_n16x2 $d/tests_n16all .deps/narrow/
  # The Python package's build on the device needs CUTLASS's headers (include/ and
  # tools/util/include/ only: ~1 MiB packed).
  bash scripts/carry_pack.sh .deps/plan .deps/wide .deps/narrow
  tar cf - .deps/cutlass-*/cutlass_library/source/include .deps/cutlass-*/cutlass_library/source/tools/util/include |
    xz -T0 -6 > .deps/packed/deps_cutlass.txz
  # The comparison kit and the stored anchors travel as copies (the device sees only the repository).
  local shared=../shared/anchors
  if [ -d $shared/compare ]; then
    rm -rf .deps/anchors .deps/compare && mkdir -p .deps/anchors .deps/compare
    cp $shared/*.json $shared/*.md .deps/anchors/ && cp -r $shared/compare/. .deps/compare/
  else
    echo "warning: $shared/compare not found: .deps/anchors and .deps/compare not staged (compare.py needs them)" >&2
  fi
}

# The gather floor (scripts/profile/gather_floor.cu: the named rows read with nothing else to do,
# ~1 min with its build) into $OUT.
gather_floor() {
  /usr/local/cuda/bin/nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/gather_floor scripts/profile/gather_floor.cu &&
    timeout 100 /tmp/gather_floor 128 2048 > "$OUT/gather_floor.txt" 2>&1
  grep -E "floor|SMs" "$OUT/gather_floor.txt"
}

# The narrow form's rows of the default sweep (h_q 16 and 32).
narrow_rows="sparse-decode --layout v32 --b 128 --s-q 1 --h-q 16 --s-k 32768 --page 64 --topk 2048
sparse-decode --layout v32 --b 16 --s-q 1 --h-q 16 --s-k 32768 --page 64 --topk 2048
sparse-decode --layout v32 --b 128 --s-q 1 --h-q 32 --s-k 32768 --page 64 --topk 2048
sparse-decode --layout model1 --b 128 --s-q 2 --h-q 16 --s-k 16384 --page 256 --topk 128 --extra-topk 512 --extra-page 64 --extra-s-k 16384"
# The sanitizer subset's cases of h_q <= 32 (the narrow form).
narrow_sanitizer_cases='*SparseDecodeSanitizer*hq16*:*SparseDecodeSanitizer*hq8_*:*SparseDecodeSanitizer*hq32*:*SparseDecodeSanitizer*hq1'

case "${1:-}" in
  build) build ;;
  run)
    case "${2:-}" in
      survey)
        OUT=${OUT:-$PWD/gpu-out}
        mkdir -p "$OUT"
        bash scripts/carry_pack.sh --unpack
        gather_floor
        # Benches only (gpu_variants.sh would run any test binary beside them): the wide form on the
        # 14 sparse decode rows, the narrow forms on the narrow rows.
        rm -rf .deps/survey_wide .deps/survey_narrow && mkdir -p .deps/survey_wide .deps/survey_narrow
        cp .deps/wide/bench_main .deps/wide/bench_wide .deps/survey_wide/
        cp .deps/narrow/bench_main .deps/narrow/bench_n16 .deps/narrow/bench_n16all .deps/narrow/bench_n16x2 \
          .deps/survey_narrow/
        OUT=$OUT/wide HMLA_AB_REPS=2 HMLA_AB_TIMEOUT=150 bash scripts/gpu_variants.sh .deps/survey_wide
        OUT=$OUT/narrow HMLA_AB_REPS=3 HMLA_AB_ROWS="$narrow_rows" HMLA_AB_TIMEOUT=150 \
          bash scripts/gpu_variants.sh .deps/survey_narrow
        HMLA_PLAN_NCU=0 timeout 100 bash scripts/gpu_plan_time.sh .deps/plan/bench_main .deps/plan/bench_padded \
          > "$OUT/plan_time.txt" 2>&1
        grep -F "|" "$OUT/plan_time.txt" | cut -c1-160
        (cd "$OUT" && tar czf /tmp/out.tgz . && find . -mindepth 1 -delete && mv /tmp/out.tgz .) ;;
      wide)
        # The gather floor first, then the variants and compare.py in what is left.
        OUT=${OUT:-$PWD/gpu-out}
        mkdir -p "$OUT"
        floor_start=$SECONDS
        gather_floor
        LIMIT=$((${CALL_LIMIT:-530} - (SECONDS - floor_start))) HMLA_AB_REPS=2 HMLA_AB_TIMEOUT=130 HMLA_VARIANT_TEST_TIMEOUT=70 VARIANTS=.deps/wide \
          PATCH=$v/sparse_wide_l1_prefetch_indices_first.patch COMPARE=sparse_decode bash scripts/gpu_call.sh ;;
      plan)
        # The padded plan against main (plan_us on six rows, the plan kernel alone under Nsight
        # Compute), its plan and fuzz tests and memcheck on the plan's form edges; then the plan-step
        # rows (every bench of .deps/plan), all with the CPUs idle (the step's host launches are part
        # of what they time); then compare.py's sparse prefill rows on main.
        OUT=${OUT:-$PWD/gpu-out}
        mkdir -p "$OUT/plan"
        bash scripts/carry_pack.sh --unpack
        timeout 150 bash scripts/gpu_plan_time.sh .deps/plan/bench_main .deps/plan/bench_padded \
          > "$OUT/plan/plan_time.txt" 2>&1
        grep -F "|" "$OUT/plan/plan_time.txt" | cut -c1-160
        HMLA_FUZZ_SECONDS=10 timeout 100 .deps/plan/tests_padded --gtest_brief=1 \
          --gtest_filter='*DecodePlan*:DenseDecodeFuzz*:SparseDecodeFuzz*' > "$OUT/plan/tests_padded.log" 2>&1
        echo "tests_padded: rc $?; $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/plan/tests_padded.log" | head -n 3 | tr '\n' ' ')"
        timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 .deps/plan/tests_padded --gtest_brief=1 \
          --gtest_filter='*DecodePlan*FormEdges*' > "$OUT/plan/memcheck_padded.log" 2>&1
        echo "memcheck: rc $?; $(grep -E 'ERROR SUMMARY' "$OUT/plan/memcheck_padded.log" | tail -n 1)"
        HMLA_STEP_MODES=plan HMLA_STEP_ROWS="0 2" timeout 150 bash scripts/profile/plan_step_before.sh \
          > "$OUT/plan/plan_step.txt" 2>&1
        grep -E "^r[0-9]" "$OUT/plan/plan_step.txt" | cut -c1-200
        LIMIT=$((${CALL_LIMIT:-560} - SECONDS)) COMPARE="sparse_prefill" bash scripts/gpu_call.sh ;;
      narrow)
        # Sixteen producer warps of 4 tokens, one tile each (640 threads), against main's eight with
        # two tiles (h_q 16) or one (h_q 32): whether the narrow producers are short of warps to hide
        # their latencies (docs/PERF.md, "Sixteen producer warps in the narrow form").
        LIMIT=${CALL_LIMIT:-540} HMLA_AB_REPS=3 HMLA_AB_ROWS="$narrow_rows" HMLA_AB_TIMEOUT=170 HMLA_VARIANT_TEST_TIMEOUT=90 \
          HMLA_VARIANT_SANITIZE_n16all="$narrow_sanitizer_cases" HMLA_SANITIZER_TIMEOUT=60 VARIANTS=.deps/narrow \
          PATCH=$v/sparse_narrow_sixteen_producer_warps.patch COMPARE=sparse_decode bash scripts/gpu_call.sh ;;
      profile)
        # What caps the narrow form's gather: L1/LSU throughput, sectors per request, the producers'
        # issue share (h_q 16), beside the wide form's h_q 64 row; then the plan kernel at b 4096
        # and b 128 (kernel alone, warm as between an engine's plans), whose per-request cost
        # (~1.6 us per request a thread handles past 1000 requests) may be shared-memory bank
        # conflicts (the memory tables count them; plan_padded_shared_arrays.patch removes them).
        OUT=${OUT:-$PWD/gpu-out}
        mkdir -p "$OUT"
        bash scripts/carry_pack.sh --unpack
        for h in 16 64; do
          OUT=$OUT/h$h HMLA_BENCH_BIN=.deps/plan/bench_main HMLA_PROFILE_FAMILY=sparse-decode HMLA_PROFILE_TIMEOUT=150 \
            HMLA_PROFILE_NCU_FLAGS="--section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section InstructionStats" \
            bash scripts/gpu_profile.sh stalls --layout v32 --b 128 --s-q 1 --h-q $h --topk 2048
        done
        for b in 4096 128; do
          OUT=$OUT/plan_b$b HMLA_BENCH_BIN=.deps/plan/bench_main HMLA_PROFILE_FAMILY=sparse-decode HMLA_PROFILE_TIMEOUT=90 \
            HMLA_PROFILE_KERNEL=decode_scheduler_kernel \
            HMLA_PROFILE_NCU_FLAGS="--cache-control none --section MemoryWorkloadAnalysis_Tables" \
            bash scripts/gpu_profile.sh stalls --layout v32 --b $b --s-q 1 --h-q 16 --topk 64 --s-k 4096
        done
        (cd "$OUT" && tar czf /tmp/out.tgz . && find . -mindepth 1 -delete && mv /tmp/out.tgz .) ;;
      *) echo "usage: $0 run survey|wide|narrow|plan|profile" >&2; exit 2 ;;
    esac ;;
  *) echo "usage: $0 build | run survey|wide|narrow|plan|profile" >&2; exit 2 ;;
esac
