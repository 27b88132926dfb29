#!/usr/bin/env bash
# A/B of kernel variants in one device call: for each variant file given, build hmla-bench in a copy
# of the tree with that file in place of src/sm90/dense_decode/kernel.cuh (and NAME.config.h in place
# of config.h when the variant has one), then time the same rows with every build. The working tree's own kernel is variant "cur".
#   bash scripts/gpu_ab.sh .deps/variant/kernel_a.cuh .deps/variant/kernel_b.cuh
# (variant files in an ignored folder travel with the device tool's `carry`). Extra rows: set
# HMLA_AB_ROWS to lines of hmla-bench arguments (default: the quick sweep and one long memory row).
set -u
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
anchors=${HMLA_ANCHORS:-$PWD/.deps/anchors/flashmla-h200.json}
rows=${HMLA_AB_ROWS:-"--sweep quick
dense-decode --b 128 --h-q 16 --s-k 32768"}
variants=(cur "$@")
for v in "${variants[@]}"; do
  name=$(basename "$v" .cuh)
  dir=/tmp/hmla_ab_$name
  rm -rf "$dir" && mkdir -p "$dir"
  cp -r CMakeLists.txt cmake include src tools tests .deps "$dir"/ 2>/dev/null
  if [ "$v" != cur ]; then
    cp "$v" "$dir/src/sm90/dense_decode/kernel.cuh"
    # A variant NAME.cuh may bring its own NAME.config.h (the tile config it was written for).
    [ -f "${v%.cuh}.config.h" ] && cp "${v%.cuh}.config.h" "$dir/src/sm90/dense_decode/config.h"
  fi
  if ! { cmake -S "$dir" -B "$dir/b" -G Ninja -DHMLA_BUILD_TESTS=OFF && cmake --build "$dir/b" -j"$(nproc)" --target hmla-bench; } > "$dir/build.log" 2>&1; then
    echo "== $name: build failed"; tail -n 20 "$dir/build.log"; continue
  fi
  echo "== $name"
  while IFS= read -r args; do
    # shellcheck disable=SC2086
    "$dir/b/tools/hmla-bench/hmla-bench" $args --no-ceilings --anchors "$anchors" 2>/dev/null | grep -E '^ +[0-9]'
  done <<< "$rows"
done
