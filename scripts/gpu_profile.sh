#!/usr/bin/env bash
# Where does the dense decode kernel spend its time? Builds hmla-bench (build-gpu/, as
# scripts/gpu_run.sh does), then on one bench row:
#   - Nsight Compute: speed-of-light, tensor-pipe use, warp-state (stall) breakdown;
#   - the SASS lines with the most stall samples (warp-state sampling, all samples);
#   - the kernel's wgmma / barrier instruction sequence from cuobjdump (serialised wgmmas show up
#     as WARPGROUP.DEPBAR / WARPGROUP.ARRIVE between HGMMA instructions).
# Usage: scripts/gpu_profile.sh [hmla-bench dense-decode arguments]
#   default row: --b 128 --s-q 2 --h-q 128 --s-k 8192 (compute-bound, anchored)
# Output: $OUT/profile.txt (summary), $OUT/profile.ncu-rep (open in the Nsight Compute GUI).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
row=("$@")
[ ${#row[@]} -eq 0 ] && row=(--b 128 --s-q 2 --h-q 128 --s-k 8192)

if ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build-gpu -j"$(nproc)" --target hmla-bench; } \
     > "$OUT/profile_build.log" 2>&1; then
  tail -n 40 "$OUT/profile_build.log"; exit 1
fi
report="$OUT/profile"
timeout 300 ncu --clock-control none --kernel-name regex:dense_decode_kernel --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
  --section Occupancy --section SourceCounters \
  -f -o "$report" build-gpu/tools/hmla-bench/hmla-bench dense-decode "${row[@]}" --no-ceilings --no-backlog \
  > "$OUT/profile_run.log" 2>&1 || { tail -n 30 "$OUT/profile_run.log"; exit 1; }
{
  echo "== row: ${row[*]}"
  ncu --import "$report.ncu-rep" --page details 2>&1
  echo "== warp stall reasons"
  ncu --import "$report.ncu-rep" --page raw --csv 2>/dev/null > /tmp/hmla_raw.csv
  python3 scripts/profile/stalls.py /tmp/hmla_raw.csv
  echo "== SASS lines with the most warp stall samples"
  ncu --import "$report.ncu-rep" --page source --print-source sass --csv 2>/dev/null > /tmp/hmla_source.csv
  python3 scripts/profile/hot_sass.py /tmp/hmla_source.csv
  echo "== wgmma / barrier sequence (cuobjdump)"
  cuobjdump -sass build-gpu/libhmla.a 2>/dev/null |
    awk '/Function : /{on = ($0 ~ /dense_decode_kernel/ && $0 ~ /bfloat16/)} on' |
    grep -E "HGMMA|WARPGROUP|DEPBAR|BAR\.|SYNCS|UTMALDG|STSM|LDSM" | sed -E 's@/\*[0-9a-f]+\*/@@; s@ +@ @g' > /tmp/hmla_seq.txt
  echo "instructions: $(wc -l < /tmp/hmla_seq.txt)"
  head -n 400 /tmp/hmla_seq.txt
} > "$OUT/profile.txt" 2>&1
grep -E "SM Frequency|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots|No Eligible|Warp Cycles" "$OUT/profile.txt" | head -n 20
sed -n '/== warp stall reasons/,/== wgmma/p' "$OUT/profile.txt" | head -n 70
