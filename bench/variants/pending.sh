#!/usr/bin/env bash
# The variants of bench/variants built and not yet timed, and the device calls that time them
# (bench/variants/README.md says what each expects; docs/PERF.md has the predictions).
#   bash bench/variants/pending.sh build         workstation: every binary into .deps/s9, .deps/s10 and
#                                                .deps/plan, packed into .deps/packed with the CUTLASS
#                                                headers (build/ configured and built first)
#   bash bench/variants/pending.sh run decode    device (~8 min): main, l1pf and l1pfh on the 14 sparse
#                                                decode rows, l1pf's tests
#   bash bench/variants/pending.sh run narrow    device (~8 min): main, l1pf2, ring, bulk and idx on the
#                                                three h_q 16 rows and MODEL1's h_q 128 topk 128 row, their tests
#   bash bench/variants/pending.sh run plan      device (~9 min): the plan-step diagnostic, then compare.py
#                                                on main: sparse decode and sparse prefill rows
# Each run: carry .deps/packed, .deps/anchors and .deps/compare; timeout_s 600. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
v=bench/variants
build() {
  set -e
  local b=scripts/build_bench_variant.sh
  bash $b main
  bash $b l1pf --patch $v/sparse_l1_prefetch.patch --flags "-DHMLA_DECODE_L1_PREFETCH=3" --tests
  bash $b l1pfh --patch $v/sparse_l1_prefetch.patch --flags "-DHMLA_DECODE_L1_PREFETCH=3 -DHMLA_DECODE_L1_PREFETCH_TOKENS=8"
  bash $b l1pf2 --patch $v/sparse_l1_prefetch.patch --only src/sm90/sparse_decode/instantiate_narrow --tests \
    --flags "-DHMLA_DECODE_L1_PREFETCH=1 -DHMLA_DECODE_L1_PREFETCH_AHEAD=2"
  bash $b ring --patch $v/sparse_ring_channel.patch --only src/sm90/sparse_decode/instantiate_narrow --tests \
    --flags "-DHMLA_DECODE_RING_CHANNEL=1"
  bash $b bulk --patch $v/sparse_ring_channel.patch --only src/sm90/sparse_decode/instantiate_narrow --tests \
    --flags "-DHMLA_DECODE_RING_CHANNEL=2"
  bash $b idx --patch $v/sparse_indices_first.patch --tests
  bash $b empty --patch $v/plan_diag_empty_carveout.patch --only src/scheduler/decode_scheduler \
    --flags "-DHMLA_PLAN_DIAG_EMPTY"
  bash $b plain --patch $v/plan_diag_plain_kernel.patch --only src/scheduler/decode_scheduler \
    --flags "-DHMLA_PLAN_DIAG_PLAIN"
  bash $b plainsmem --patch $v/plan_diag_plain_kernel.patch --only src/scheduler/decode_scheduler \
    --flags "-DHMLA_PLAN_DIAG_PLAIN -DHMLA_PLAN_DIAG_PLAIN_SMEM"
  local d=.deps/variants
  rm -rf .deps/s9 .deps/s10 .deps/plan && mkdir -p .deps/s9 .deps/s10 .deps/plan
  cp $d/bench_main $d/bench_l1pf $d/bench_l1pfh $d/tests_l1pf .deps/s9/
  cp $d/bench_main $d/bench_l1pf2 $d/bench_ring $d/bench_bulk $d/bench_idx $d/tests_l1pf2 $d/tests_ring $d/tests_bulk \
    $d/tests_idx .deps/s10/
  cp $d/bench_main $d/bench_empty $d/bench_plain $d/bench_plainsmem .deps/plan/
  # The Python package's build on the device needs CUTLASS's headers (include/ and
  # tools/util/include/ only: ~1 MiB packed).
  bash scripts/carry_pack.sh .deps/s9 .deps/s10 .deps/plan
  tar cf - .deps/cutlass-*/cutlass_library/source/include .deps/cutlass-*/cutlass_library/source/tools/util/include |
    xz -T0 -6 > .deps/packed/deps_cutlass.txz
}

h16_rows="sparse-decode --layout v32 --b 128 --s-q 1 --h-q 16 --s-k 32768 --page 64 --topk 2048
sparse-decode --layout v32 --b 16 --s-q 1 --h-q 16 --s-k 32768 --page 64 --topk 2048
sparse-decode --layout model1 --b 128 --s-q 2 --h-q 16 --s-k 16384 --page 256 --topk 128 --extra-topk 512 --extra-page 64 --extra-s-k 16384
sparse-decode --layout model1 --b 128 --s-q 2 --h-q 128 --s-k 16384 --page 256 --topk 128"

case "${1:-}" in
  build) build ;;
  run)
    case "${2:-}" in
      decode)
        LIMIT=580 HMLA_AB_REPS=2 HMLA_AB_TIMEOUT=360 HMLA_VARIANT_TEST_TIMEOUT=150 VARIANTS=.deps/s9 \
          bash scripts/gpu_call.sh ;;
      narrow)
        LIMIT=580 HMLA_AB_REPS=3 HMLA_AB_ROWS="$h16_rows" HMLA_AB_TIMEOUT=240 HMLA_VARIANT_TEST_TIMEOUT=70 \
          HMLA_VARIANT_FILTER='*SparseDecodeGrid*' VARIANTS=.deps/s10 bash scripts/gpu_call.sh ;;
      plan)
        # The plan-step rows first, with the CPUs idle (the step's host launches are part of what
        # they time), then the builds for compare.py.
        OUT=${OUT:-$PWD/gpu-out}
        mkdir -p "$OUT/plan"
        HMLA_STEP_MODES=plan HMLA_STEP_ROWS="0 2" timeout 150 bash scripts/profile/plan_step_before.sh \
          > "$OUT/plan/plan_step.txt" 2>&1
        grep -E "^r[0-9]" "$OUT/plan/plan_step.txt" | cut -c1-200
        LIMIT=420 COMPARE="sparse_decode sparse_prefill" bash scripts/gpu_call.sh ;;
      *) echo "usage: $0 run decode|narrow|plan" >&2; exit 2 ;;
    esac ;;
  *) echo "usage: $0 build | run decode|narrow|plan" >&2; exit 2 ;;
esac
