#!/usr/bin/env bash
# The variants this folder's README lists as pending, built on the workstation and measured in one
# device call, most informative step first, so that a call cut short by its limit still answers the
# main question (which variant is faster) and leaves its logs under $OUT.
#   bash bench/variants/pending.sh build   workstation, after scripts/build.sh: bench (and test)
#                                          binaries of main and of each variant into .deps/next_q,
#                                          packed with what compare.py needs into .deps/packed
#   bash bench/variants/pending.sh run [quick]
#                                          device call (carry .deps/packed; ~8 minutes):
#        0. the event-timed floor under a one-CTA kernel (scripts/profile/launch_floor.cu; seconds)
#        1. decode A/B, best of two, against main's binary on the rows that the Q variants move
#        2. the decode variants' GPU tests; memcheck and racecheck on the late prefetch (lq2)
#        3. prefill A/B and the prefill variant's tests
#        4. a trace of the late prefetch (scripts/gpu_trace.sh)
#      quick: step 1 on three rows (short MODEL1 h 128, V3.2 h 128 and h 16) and the decode tests
#      without sanitizers, ~3 minutes: for a call that must fit what is left of a session's device time.
# Then on the workstation: python3 scripts/profile/ab_summary.py on the ab.log in the logs archive
# if a step was cut before its summary printed.
set -uo pipefail
cd "$(dirname "$0")/../.."
variants=bench/variants
# name | patch | build_bench_variant.sh options
decode=(
  "q1p|sparse_q_one_pass.patch|"
  "q1qpf|sparse_q_one_pass_prefetch.patch|"
  "lq2|sparse_q_one_pass_late_prefetch.patch|--tests"
  "lq4|sparse_q_one_pass_late_prefetch.patch|--flags -DHMLA_Q_PREFETCH_TILES_BEFORE_END=4"
)
prefill=("pfqpf|prefill_q_prefetch.patch|--tests --only src/sm90/sparse_prefill/instantiate")
# Built again with -DHMLA_SPARSE_TRACE as .deps/next_q/trace/hmla-bench:
trace_patch=sparse_q_one_pass_late_prefetch.patch

case "${1:-}" in
  build)
    set -e
    rm -rf .deps/next_q && mkdir -p .deps/next_q/decode .deps/next_q/prefill .deps/next_q/trace
    scripts/build_bench_variant.sh main
    cp .deps/variants/bench_main .deps/next_q/decode/ && cp .deps/variants/bench_main .deps/next_q/prefill/
    for entry in "${decode[@]/#/decode|}" "${prefill[@]/#/prefill|}"; do
      IFS='|' read -r kind name patch options <<< "$entry"
      # shellcheck disable=SC2086
      scripts/build_bench_variant.sh "$name" --patch "$variants/$patch" $options
      cp .deps/variants/bench_"$name" .deps/next_q/"$kind"/
      [[ "$options" != *--tests* ]] || cp .deps/variants/tests_"$name" .deps/next_q/"$kind"/
    done
    scripts/build_bench_variant.sh trace --patch "$variants/$trace_patch" --flags -DHMLA_SPARSE_TRACE
    cp .deps/variants/bench_trace .deps/next_q/trace/hmla-bench
    nvcc -O2 -std=c++17 -arch=sm_90a -Iinclude -Itools/hmla-bench -o .deps/next_q/launch_floor \
      scripts/profile/launch_floor.cu tools/hmla-bench/device_util.cu -lcublas
    mkdir -p .deps/compare .deps/anchors
    cp ../shared/anchors/compare/* .deps/compare/ 2>/dev/null || true
    cp ../shared/anchors/flashmla-h200.* .deps/anchors/ 2>/dev/null || true
    bash scripts/carry_pack.sh .deps/next_q .deps/compare .deps/anchors .deps/cutlass-4.2.0.0
    ;;
  run)
    bash scripts/carry_pack.sh --unpack || exit 1
    OUT=${OUT:-$PWD/gpu-out}
    m1='sparse-decode --layout model1 --b 128 --s-q 2 --s-k 16384 --page 256'
    v32='sparse-decode --layout v32 --b 128 --s-q 1 --topk 2048'
    decode_rows=$(printf '%s\n' "$m1 --h-q 128 --topk 128" "$m1 --h-q 128 --topk 128 --extra-topk 512 --extra-page 64" \
      "$v32 --h-q 128" "$v32 --h-q 64" "$v32 --h-q 16" "$m1 --h-q 64 --topk 128 --extra-topk 512 --extra-page 64" \
      "$m1 --h-q 16 --topk 128 --extra-topk 512 --extra-page 64")
    prefill_rows=$(printf '%s\n' 'sparse-prefill --s-q 4096 --h-q 64 --d-qk 576 --s-kv 8192 --topk 2048' \
      'sparse-prefill --s-q 4096 --h-q 128 --d-qk 512 --s-kv 65536 --topk 2048' \
      'sparse-prefill --s-q 4096 --h-q 64 --d-qk 512 --s-kv 65536 --topk 2048')
    quick=0 sanitize='*SparseDecodeSanitizer*'
    if [ "${2:-}" = quick ]; then
      quick=1 sanitize=
      decode_rows=$(printf '%s\n' "$m1 --h-q 128 --topk 128" "$v32 --h-q 128" "$v32 --h-q 16")
    fi
    status=0
    mkdir -p "$OUT/decode" "$OUT/prefill"
    # The floor under plan_us (scripts/profile/launch_floor.cu, ~5 s): a second, not a step's worth.
    [ ! -x .deps/next_q/launch_floor ] || timeout 30 .deps/next_q/launch_floor 2>&1 | tee "$OUT/launch_floor.txt"
    OUT=$OUT/decode HMLA_AB_REPS=2 HMLA_AB_TIMEOUT=260 HMLA_VARIANT_TEST_TIMEOUT=60 HMLA_SANITIZER_TIMEOUT=50 \
      HMLA_VARIANT_SANITIZE_lq2="$sanitize" HMLA_AB_ROWS="$decode_rows" \
      bash scripts/gpu_variants.sh .deps/next_q/decode 2>&1 | grep -v "^cur \|^bench_" || status=1
    [ "$quick" = 0 ] || exit $status
    OUT=$OUT/prefill HMLA_AB_REPS=2 HMLA_AB_TIMEOUT=90 HMLA_VARIANT_TEST_TIMEOUT=90 \
      HMLA_VARIANT_FILTER_pfqpf='*SparsePrefill*' HMLA_AB_ROWS="$prefill_rows" \
      bash scripts/gpu_variants.sh .deps/next_q/prefill 2>&1 | grep -v "^cur \|^bench_" || status=1
    OUT=$OUT/trace HMLA_BIN=.deps/next_q/trace timeout 60 bash scripts/gpu_trace.sh sparse "${m1#sparse-decode } --h-q 128 --topk 128" 2>&1 |
      tail -n 40
    exit $status
    ;;
  *) echo "usage: $0 build | run [quick]" >&2; exit 2 ;;
esac
