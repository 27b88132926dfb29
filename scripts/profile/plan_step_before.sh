#!/usr/bin/env bash
# What stands before the attention kernel in a decoding step costs the step (diagnostic; benches
# built with hmla-bench's HMLA_BENCH_STEP_BEFORE modes, packed as .deps/plan/bench_*):
# HMLA_BENCH_STEP_BEFORE = plan | spin0 | spin10 | event | plan_event | smemN | eT_N (tools/hmla-bench
# README); step_us is the last time column. HMLA_STEP_MODES picks the modes, HMLA_STEP_ROWS the rows
# (indices into the list below, default all).
set -uo pipefail
cd "$(dirname "$0")/../.."
bash scripts/carry_pack.sh --unpack
mapfile -t benches < <(ls .deps/plan/bench_*)
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
modes=${HMLA_STEP_MODES:-"plan spin0 spin10 event"}
rows=("--layout v32 --s-q 1 --b 128 --h-q 64 --topk 2048" "--layout v32 --s-q 1 --b 1024 --h-q 16 --topk 128 --s-k 4096"
      "--layout model1 --b 128 --s-q 2 --s-k 16384 --page 256 --h-q 128 --topk 128"
      "--layout v32 --s-q 1 --b 16 --h-q 16 --topk 2048")
for round in $(seq "${HMLA_STEP_ROUNDS:-2}"); do
  for i in ${HMLA_STEP_ROWS:-0 1 2 3}; do
    row=${rows[$i]}
    for mode in $modes; do
      for b in "${benches[@]}"; do
        # shellcheck disable=SC2086
        line=$(HMLA_BENCH_STEP_BEFORE=$mode timeout 60 "$b" sparse-decode $row --no-ceilings --iters 50 2>&1 | grep -E '^ *fp8|rror' | head -n 1)
        echo "r$round $(basename "$b") $mode | $line"
      done
    done
  done
done
