#!/usr/bin/env bash
# The pending device call of bench/variants/README.md ("Pending"); carry .deps/packed (made by
# scripts/carry_pack.sh .deps/next_dec2 .deps/anchors).
set -uo pipefail
cd "$(dirname "$0")/../.."
bash scripts/carry_pack.sh --unpack
OUT0=$OUT
# The decode kernel's timeline (main's kernel with the trace events), rows of short and long requests.
OUT=$OUT0/trace HMLA_BIN=.deps/next_dec2/trace bash scripts/gpu_trace.sh sparse
m1='sparse-decode --layout model1 --b 128 --s-q 2 --s-k 16384 --page 256'
OUT=$OUT0/dec HMLA_AB_REPS=2 HMLA_AB_ROWS="$(printf '%s\n' "$m1 --h-q 128 --topk 128" \
  "$m1 --h-q 128 --topk 128 --extra-topk 512 --extra-page 64" "$m1 --h-q 64 --topk 128 --extra-topk 512 --extra-page 64" \
  'sparse-decode --layout v32 --b 128 --s-q 1 --topk 2048 --h-q 128')" \
  bash scripts/gpu_variants.sh .deps/next_dec2 | grep -vE '^(bench_|cur)' | tail -n 6
