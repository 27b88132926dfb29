#!/usr/bin/env bash
# Where does a dense decode call spend its time? Builds hmla-bench (build-gpu/, as scripts/gpu_run.sh
# does), then one of:
#   stalls [row args]    on one bench row: Nsight Compute speed-of-light, warp-state (stall)
#                        breakdown, the SASS lines with the most stall samples, and the kernel's
#                        wgmma / barrier sequence from cuobjdump (serialised wgmmas show up as
#                        WARPGROUP.DEPBAR / WARPGROUP.ARRIVE between HGMMA instructions).
#                        Default row: --b 128 --s-q 2 --h-q 128 --s-k 8192 (compute-bound, anchored).
#                        Output: $OUT/profile.txt, $OUT/profile.ncu-rep (Nsight Compute GUI),
#                        $OUT/profile_source.csv.gz (per SASS line: scripts/profile/ncu_csv.py lines).
#   breakdown ["row" ...] GPU time of each kernel of one call (plan, attention, combine) through
#                        gpu__time_duration (kernels serialised: no programmatic-launch overlap).
#                        Default rows: the small-batch anchors (b = 1, 8, 32; h_q 128; s_k 8192).
#                        Output: $OUT/breakdown.txt.
#   trace ["row" ...]    per-tile timeline of the attention kernel (src/sm90/dense_decode/trace.cuh):
#                        builds build-trace/ with -DHMLA_DENSE_TRACE=ON, runs each row with
#                        HMLA_TRACE_FILE and prints scripts/profile/trace_summary.py's medians (the
#                        steps of a tile in SM clocks, the K load time, the SM clock). The hooks
#                        cost up to 10 % on some schedules: compare timelines, time with hmla-bench.
#                        HMLA_TRACE_MBLOCK=1 traces the CTAs of query tile 1 instead of 0.
#                        Output: $OUT/trace_*.bin, $OUT/trace.txt. Tile by tile, on the workstation:
#                        scripts/profile/trace_tiles.py $OUT/trace_<row>.bin [cta] [first] [last].
# Usage: scripts/gpu_profile.sh stalls|breakdown|trace [...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
mode=${1:-stalls}
shift || true
case "$mode" in stalls|breakdown|trace) ;; *) echo "usage: $0 stalls|breakdown|trace [...]" >&2; exit 2 ;; esac

if [ "$mode" = trace ]; then
  if ! { cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DHMLA_DENSE_TRACE=ON -DHMLA_BUILD_TESTS=OFF \
           -DCMAKE_CUDA_FLAGS="-DHMLA_TRACE_MBLOCK=${HMLA_TRACE_MBLOCK:-0}" &&
         cmake --build build-trace -j"$(nproc)" --target hmla-bench; } > "$OUT/trace_build.log" 2>&1; then
    tail -n 40 "$OUT/trace_build.log"; exit 1
  fi
  rows=("$@")
  [ ${#rows[@]} -eq 0 ] && rows=("--b 128 --s-q 2 --h-q 128 --s-k 8192" "--b 32 --h-q 128 --s-k 8192" "--b 128 --h-q 16 --s-k 8192")
  for row in "${rows[@]}"; do
    file="$OUT/trace_$(echo "$row" | tr -d ' -').bin"
    # shellcheck disable=SC2086
    HMLA_TRACE_FILE="$file" build-trace/tools/hmla-bench/hmla-bench dense-decode $row --no-ceilings --no-anchors \
      --warmup 2 --warmup-ms 0 --iters 5 > /dev/null 2>&1
    python3 scripts/profile/trace_summary.py "$file" "$row"
  done | tee "$OUT/trace.txt"
  exit 0
fi

# HMLA_BENCH_BIN=<path to hmla-bench> profiles an existing build (for example one left by
# scripts/gpu_ab.sh in /tmp/hmla_ab_NAME/b) instead of building build-gpu/.
bench=${HMLA_BENCH_BIN:-build-gpu/tools/hmla-bench/hmla-bench}
lib=$(dirname "$(dirname "$(dirname "$bench")")")/libhmla.a
if [ -z "${HMLA_BENCH_BIN:-}" ] &&
   ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build-gpu -j"$(nproc)" --target hmla-bench; } \
     > "$OUT/profile_build.log" 2>&1; then
  tail -n 40 "$OUT/profile_build.log"; exit 1
fi

if [ "$mode" = breakdown ]; then
  rows=("$@")
  [ ${#rows[@]} -eq 0 ] && rows=("--b 1 --h-q 128 --s-k 8192" "--b 8 --h-q 128 --s-k 8192" "--b 32 --h-q 128 --s-k 8192")
  for row in "${rows[@]}"; do
    echo "== $row"
    # shellcheck disable=SC2086
    timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum \
      --kernel-name regex:'dense_decode_kernel|combine_kernel|decode_scheduler_kernel' --launch-count 24 \
      "$bench" dense-decode $row --no-ceilings --no-backlog --warmup 2 --iters 8 \
      --rotate-mib 1 2>&1 |
      awk '/\) \(/ && /Context/ {line = $0; sub(/^ +(void )?/, "", line); gsub(/\(anonymous namespace\)::/, "", line); sub(/[<(].*/, "", line); name = line}
           /gpu__time_duration.sum/ {t[name] = t[name] " " $NF $(NF-1)}
           END {for (k in t) print "  " k ":" t[k]}'
  done | tee "$OUT/breakdown.txt"
  exit 0
fi

row=("$@")
# HMLA_PROFILE_FAMILY=sparse-decode or sparse-prefill profiles a sparse kernel (its row's flags as for
# hmla-bench).
family=${HMLA_PROFILE_FAMILY:-dense-decode}
kernel=${family//-/_}_kernel
# h_q <= 32 runs the narrow form of the sparse decode kernel.
[ "$family" = sparse-decode ] && kernel="sparse_decode_(narrow_)?kernel"
# HMLA_PROFILE_KERNEL: another kernel of the row's call, e.g. decode_scheduler_kernel (the plan; the
# bench times plans back to back, so add HMLA_PROFILE_NCU_FLAGS="--cache-control none" to keep its code
# and data warm as they are between an engine's plans).
kernel=${HMLA_PROFILE_KERNEL:-$kernel}
if [ ${#row[@]} -eq 0 ]; then
  case "$family" in
    sparse-decode) row=(--layout v32 --b 128 --s-q 1 --h-q 64 --topk 2048) ;;
    sparse-prefill) row=(--s-q 4096 --h-q 64 --d-qk 576 --s-kv 8192 --topk 2048) ;;
    *) row=(--b 128 --s-q 2 --h-q 128 --s-k 8192) ;;
  esac
fi
report="$OUT/profile"
# shellcheck disable=SC2086
timeout "${HMLA_PROFILE_TIMEOUT:-300}" ncu --clock-control none ${HMLA_PROFILE_NCU_FLAGS:-} --kernel-name regex:"$kernel" --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
  --section Occupancy --section SourceCounters \
  -f -o "$report" "$bench" "$family" "${row[@]}" --no-ceilings --no-backlog \
  > "$OUT/profile_run.log" 2>&1 || { tail -n 30 "$OUT/profile_run.log"; exit 1; }
{
  echo "== row: ${row[*]}"
  ncu --import "$report.ncu-rep" --page details 2>&1
  echo "== warp stall reasons"
  ncu --import "$report.ncu-rep" --page raw --csv 2>/dev/null > /tmp/hmla_raw.csv
  python3 scripts/profile/ncu_csv.py stalls /tmp/hmla_raw.csv
  echo "== SASS lines with the most warp stall samples"
  ncu --import "$report.ncu-rep" --page source --print-source sass --csv 2>/dev/null > /tmp/hmla_source.csv
  python3 scripts/profile/ncu_csv.py hot /tmp/hmla_source.csv
  # Kept for the workstation: scripts/profile/ncu_csv.py lines $OUT/profile_source.csv.gz FIRST LAST
  gzip -c /tmp/hmla_source.csv > "$OUT/profile_source.csv.gz"
  echo "== wgmma / barrier sequence (cuobjdump)"
  cuobjdump -sass "$lib" 2>/dev/null |
    awk '/Function : /{on = ($0 ~ /dense_decode_kernel/ && $0 ~ /bfloat16/)} on' |
    grep -E "HGMMA|WARPGROUP|DEPBAR|BAR\.|SYNCS|UTMALDG|STSM|LDSM" | sed -E 's@/\*[0-9a-f]+\*/@@; s@ +@ @g' > /tmp/hmla_seq.txt
  echo "instructions: $(wc -l < /tmp/hmla_seq.txt)"
  head -n 400 /tmp/hmla_seq.txt
} > "$OUT/profile.txt" 2>&1
grep -E "SM Frequency|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots|No Eligible|Warp Cycles" "$OUT/profile.txt" | head -n 20
sed -n '/== warp stall reasons/,/== wgmma/p' "$OUT/profile.txt" | head -n 70
