#!/usr/bin/env bash
# Where a fresh plan's cost in a decoding step lands on the GPU: hmla-bench's step loop (the
# attention call alone alternating with the plan and the same call) in a -DHMLA_STEP_PROBE build
# (bench/variants/plan_step_probe.patch: every CTA of the plan, attention and combine kernels records
# its start and end on the global timer), summarised by scripts/profile/plan_step_probe.py.
# Build on the workstation:
#   scripts/build_bench_variant.sh probe --patch bench/variants/plan_step_probe.patch --flags -DHMLA_STEP_PROBE \
#     --only 'src/scheduler/(decode_scheduler|combine)|src/sm90/sparse_decode/instantiate'
#   mkdir -p .deps/plan && cp .deps/variants/bench_probe .deps/plan/ && scripts/carry_pack.sh .deps/plan
# Device call: carry .deps/packed. HMLA_STEP_MODES: HMLA_BENCH_STEP_BEFORE modes (default plan);
# HMLA_STEP_ROWS: rows below (default all).
set -uo pipefail
cd "$(dirname "$0")/../.."
bash scripts/carry_pack.sh --unpack
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
B=${HMLA_PROBE_BENCH:-.deps/plan/bench_probe}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
rows=("--layout v32 --s-q 1 --b 128 --h-q 64 --topk 2048" "--layout v32 --s-q 1 --b 16 --h-q 16 --topk 2048"
      "--layout model1 --b 128 --s-q 2 --s-k 16384 --page 256 --h-q 128 --topk 128")
for i in ${HMLA_STEP_ROWS:-0 1 2}; do
  for mode in ${HMLA_STEP_MODES:-plan}; do
    file="$OUT/probe_row${i}_${mode}.txt"
    # shellcheck disable=SC2086
    line=$(HMLA_STEP_PROBE_FILE=$file HMLA_BENCH_STEP_BEFORE=$mode timeout 90 "$B" sparse-decode ${rows[$i]} \
      --no-ceilings --iters 50 2>&1 | grep -E '^ *fp8|rror' | head -n 1)
    echo "row $i ($mode): $line"
    python3 scripts/profile/plan_step_probe.py "$file"
    xz -T0 "$file"
  done
done
