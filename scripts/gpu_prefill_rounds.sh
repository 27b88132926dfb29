#!/usr/bin/env bash
# Sparse prefill's last round cut into pieces (ItemRounds, src/sm90/sparse_prefill/launch.h) in one
# device call, from binaries built on the workstation (same nvcc) and carried:
#   1. the GPU tests of sparse prefill (both forms, whole items and the cut last round) and its
#      sanitizer subset under memcheck and racecheck;
#   2. hmla-bench rows timed with the cut and without it (HMLA_BENCH_PREFILL_WHOLE_ITEMS=1, the same
#      binary), and with a baseline bench (whole items only, the kernel before the cut), alternating
#      row by row, HMLA_ROUNDS_REPS rounds (default 2): compare.py's 8 anchor rows and rows of fewer
#      items than SMs;
#   3. with a bench_tracegrid (-DHMLA_PREFILL_TRACE_GRID: every CTA's start and end), how evenly the
#      persistent grid's CTAs finish on two anchor rows, whole items and cut.
#   HMLA_BIN=dir (hmla_gpu_tests, hmla-bench; optional bench_base, bench_tracegrid)
#   bash scripts/gpu_prefill_rounds.sh
# Output: $OUT/tests.log, sanitize_*.log, rows.txt (one line per run), and the best of each.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
B=${HMLA_BIN:?HMLA_BIN=dir of prebuilt binaries}
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader

if [ "${HMLA_ROUNDS_TESTS:-1}" = 1 ]; then
  start=$(date +%s)
  filter=${HMLA_ROUNDS_TEST_FILTER:-*SparsePrefill*}
  timeout "${HMLA_ROUNDS_TEST_TIMEOUT:-200}" "$B/hmla_gpu_tests" --gtest_brief=1 --gtest_filter="$filter" \
    > "$OUT/tests.log" 2>&1 || status=1
  echo "== tests $filter: $(( $(date +%s) - start )) s; $(grep -E '^\[  PASSED|tests? ran' "$OUT/tests.log" | tail -n 1)"
  grep -E '^\[  FAILED|Failure|bad values|error of out' "$OUT/tests.log" | head -n 20
  for tool in memcheck racecheck; do
    timeout "${HMLA_SANITIZER_TIMEOUT:-120}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$B/hmla_gpu_tests" \
      --gtest_brief=1 --gtest_filter='*SparsePrefillSanitizer*' > "$OUT/sanitize_$tool.log" 2>&1 || status=1
    echo "   $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/sanitize_$tool.log" | tail -n 2 | tr '\n' ' ')"
  done
fi

rows=("--s-q 4096 --h-q 64 --d-qk 576 --s-kv 8192 --topk 2048" "--s-q 4096 --h-q 64 --d-qk 576 --s-kv 65536 --topk 2048"
      "--s-q 4096 --h-q 64 --d-qk 512 --s-kv 8192 --topk 2048" "--s-q 4096 --h-q 64 --d-qk 512 --s-kv 65536 --topk 2048"
      "--s-q 4096 --h-q 128 --d-qk 576 --s-kv 8192 --topk 2048" "--s-q 4096 --h-q 128 --d-qk 576 --s-kv 65536 --topk 2048"
      "--s-q 4096 --h-q 128 --d-qk 512 --s-kv 8192 --topk 2048" "--s-q 4096 --h-q 128 --d-qk 512 --s-kv 65536 --topk 2048"
      "--s-q 16 --h-q 64 --d-qk 576 --s-kv 8192 --topk 2048" "--s-q 32 --h-q 128 --d-qk 576 --s-kv 65536 --topk 2048"
      "--s-q 2 --h-q 128 --d-qk 512 --s-kv 65536 --topk 16384")
[ -n "${HMLA_ROUNDS_ROWS:-}" ] && mapfile -t rows <<< "$HMLA_ROUNDS_ROWS"
time_row() {  # name env bench row
  local line
  # shellcheck disable=SC2086
  line=$(env $2 timeout 120 "$3" sparse-prefill $4 --no-ceilings --no-anchors --iters "${HMLA_ROUNDS_ITERS:-10}" 2>&1 |
         grep -E '^ *[0-9]+ .*[|]' | head -n 1)
  echo "$1 | $4 | $(echo "$line" | awk -F'|' '{print $2}' | awk '{print $1}')"
}
for ((rep = 0; rep < ${HMLA_ROUNDS_REPS:-2}; ++rep)); do
  for row in "${rows[@]}"; do
    time_row cut "HMLA_BENCH_PREFILL_WHOLE_ITEMS=0" "$B/hmla-bench" "$row"
    time_row whole "HMLA_BENCH_PREFILL_WHOLE_ITEMS=1" "$B/hmla-bench" "$row"
    [ -x "$B/bench_base" ] && time_row base "HMLA_BENCH_PREFILL_WHOLE_ITEMS=1" "$B/bench_base" "$row"
  done
done | tee "$OUT/rows.txt"
echo "== best per row (us): cut / whole / base, whole / cut"
python3 - "$OUT/rows.txt" <<'EOF'
import sys, collections
best = collections.defaultdict(dict)
order = []
for line in open(sys.argv[1]):
    parts = [x.strip() for x in line.split("|")]
    if len(parts) < 3 or not parts[2]:
        continue
    name, row, t = parts[0], parts[1], float(parts[2])
    if row not in order:
        order.append(row)
    best[row][name] = min(t, best[row].get(name, float("inf")))
for row in order:
    b = best[row]
    cells = " / ".join(f"{b[k]:.1f}" if k in b else "-" for k in ("cut", "whole", "base"))
    ratio = b["whole"] / b["cut"] if "cut" in b and "whole" in b else float("nan")
    print(f"{row:60s} {cells}  {ratio:.3f}")
EOF
if [ -x "$B/bench_tracegrid" ]; then
  for row in "--s-q 4096 --h-q 64 --d-qk 576 --s-kv 8192 --topk 2048" "--s-q 4096 --h-q 128 --d-qk 576 --s-kv 8192 --topk 2048"; do
    for whole in 1 0; do
      # shellcheck disable=SC2086
      HMLA_BENCH_PREFILL_WHOLE_ITEMS=$whole HMLA_TRACE_FILE="$OUT/grid.bin" timeout 120 "$B/bench_tracegrid" sparse-prefill \
        $row --no-ceilings --no-anchors --iters 5 > /dev/null 2>&1 || status=1
      echo "== CTAs' ends, whole items only = $whole: $row"
      python3 scripts/profile/prefill_trace_summary.py "$OUT/grid.bin" --grid-only || status=1
    done
  done | tee "$OUT/grid.txt"
fi
exit $status
