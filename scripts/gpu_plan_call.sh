#!/usr/bin/env bash
# One device call for the plan kernel's A/B and a gather diagnostic, from binaries built on the
# workstation and packed into .deps/packed (scripts/carry_pack.sh .deps/plan), most important first:
#   tests_*         hmla_gpu_tests builds: the DecodePlan tests of each; the last one also runs the
#                   GPU suite without sparse prefill and the sanitizer subsets, and the DecodePlan
#                   form edges under compute-sanitizer memcheck and racecheck
#   bench_*         hmla-bench builds: plan_us of scripts/gpu_plan_time.sh (HMLA_PLAN_NCU=1 adds
#                   Nsight Compute's kernel times)
#   bench_diag_*    variants whose attention time is compared with bench_main's on h 64 and h 128 rows
#   HMLA_PLAN_PROFILE=1: the plan kernel's stall profile at b 16 and b 4096 (the last bench_*)
# Output under $OUT: tests_plan.txt, plan_time.txt, diag.txt, suite.txt, sanitize.txt, prof_*/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
bash scripts/carry_pack.sh --unpack
P=.deps/plan
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for t in "$P"/tests_*; do
  timeout 100 "$t" --gtest_brief=1 --gtest_filter='DecodePlan*' 2>&1 | tail -n 6 | sed "s@^@$(basename "$t"): @"
done | tee "$OUT/tests_plan.txt"
mapfile -t benches < <(ls "$P"/bench_* | grep -v bench_diag_)
tests=$(ls "$P"/tests_* | tail -n 1)
last_bench=${benches[${#benches[@]}-1]}
HMLA_PLAN_NCU=${HMLA_PLAN_NCU:-0} timeout 240 bash scripts/gpu_plan_time.sh "${benches[@]}" 2>&1 | tee "$OUT/plan_time.txt"
mapfile -t diags < <(ls "$P"/bench_diag_* 2>/dev/null)
if [ ${#diags[@]} -gt 0 ]; then
  for row in "--layout v32 --b 128 --s-q 1 --h-q 128 --topk 2048" "--layout v32 --b 128 --s-q 1 --h-q 64 --topk 2048" \
             "--layout model1 --b 64 --s-q 2 --h-q 128 --topk 128 --extra-topk 1024 --extra-page 64"; do
    # main before and after the variants: the card's drift shows between the two
    for b in "$P/bench_main" "${diags[@]}" "$P/bench_main"; do
      # shellcheck disable=SC2086
      line=$(timeout 60 "$b" sparse-decode $row --no-ceilings --iters 30 2>&1 | grep -E '^ *fp8|rror' | head -n 1)
      echo "$(basename "$b") | $row | $(echo "$line" | awk -F'|' '{print $2}')"
    done
  done | tee "$OUT/diag.txt"
fi
HMLA_FUZZ_SECONDS=4 timeout 170 "$tests" --gtest_brief=1 --gtest_filter='-*Prefill*:*Sanitizer*' > "$OUT/suite.txt" 2>&1
echo "suite rc=$?"; grep -E "fuzz:|Failure|PASSED|FAILED|tests ran" "$OUT/suite.txt" | head -n 20
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool "$tool" $([ "$tool" = racecheck ] && echo --racecheck-report hazard) \
    "$tests" --gtest_brief=1 --gtest_filter='DecodePlan.FormEdges*' 2>&1 | tail -n 4 | sed "s/^/$tool: /"
done | tee "$OUT/sanitize.txt"
if [ "${HMLA_PLAN_PROFILE:-0}" = 1 ]; then
  for row in "--b 16 --topk 2048" "--b 4096 --topk 64 --s-k 4096"; do
    d=$OUT/prof_$(echo "$row" | awk '{print $2}')
    mkdir -p "$d"
    # shellcheck disable=SC2086
    OUT=$d HMLA_BENCH_BIN=$last_bench HMLA_PROFILE_FAMILY=sparse-decode HMLA_PROFILE_KERNEL=decode_scheduler_kernel \
      HMLA_PROFILE_NCU_FLAGS="--cache-control none" HMLA_PROFILE_TIMEOUT=60 timeout 80 \
      bash scripts/gpu_profile.sh stalls --layout v32 --s-q 1 --h-q 16 $row > "$d/summary.txt" 2>&1
    head -c 2000 "$d/summary.txt"
  done
fi
