#!/usr/bin/env bash
# A/B of variants in one device call: each variant is built (all in parallel) in its own copy of
# the tree, then the same rows are timed with every build, alternating row by row. The
# working tree itself is variant "cur". A variant is
#   NAME.patch  a diff against the working tree (git diff / git format-patch), applied with git apply;
#   NAME.cuh    a file put in place of src/sm90/dense_decode/kernel.cuh (with NAME.config.h, when
#               present, in place of config.h);
#   bench_NAME  an hmla-bench executable built on the workstation (same nvcc), run as it is.
# HMLA_AB_PREBUILT=1 times the working tree's build-gpu/tools/hmla-bench/hmla-bench as "cur"
# instead of building it; HMLA_AB_NO_CUR=1 times only the named variants (prebuilt bench_NAME binaries
# of main and of diagnostic builds, say), with nothing built on the device.
#   bash scripts/gpu_ab.sh .deps/variant/a.patch .deps/variant/b.cuh
# (variant files in an ignored folder travel with the device tool's `carry`). Rows: HMLA_AB_ROWS,
# lines of hmla-bench arguments (default: the quick sweep and one long memory-bound row).
# Each build is left in /tmp/hmla_ab_NAME/b for commands that follow in the same call. Rows are
# timed with every variant in turn (HMLA_AB_REPS rounds), each output line prefixed by the variant;
# a table of each variant's best time per row and its ratio to the first variant ends the output
# (scripts/profile/ab_summary.py).
set -u
cd "$(dirname "$0")/.." || exit 1
export PATH="/usr/local/cuda/bin:$PATH"
anchors=${HMLA_ANCHORS:-$PWD/.deps/anchors/flashmla-h200.json}
rows=${HMLA_AB_ROWS:-"--sweep quick
dense-decode --b 128 --h-q 16 --s-k 32768"}
variants=(cur "$@")
[ "${HMLA_AB_NO_CUR:-0}" = 1 ] && variants=("$@")
jobs_per_build=$(( $(nproc) / ${#variants[@]} ))
[ "$jobs_per_build" -ge 2 ] || jobs_per_build=2

# A variant's name: the file name without its extension (a prebuilt bench_NAME keeps its whole
# name: stripping from its last dot would cut into a dotted folder such as .deps).
variant_name() {
  local base
  base=$(basename "$1")
  if [[ "$base" == bench_* ]]; then echo "$base"; else echo "${base%.*}"; fi
}

build_variant() {
  local v=$1 name dir
  name=$(variant_name "$v")
  # A prebuilt binary goes where a build would have left it.
  local prebuilt=
  [ "$v" = cur ] && [ "${HMLA_AB_PREBUILT:-0}" = 1 ] && prebuilt=build-gpu/tools/hmla-bench/hmla-bench
  [ "$v" != cur ] && [ -x "$v" ] && [[ "$name" == bench_* ]] && prebuilt=$v
  if [ -n "$prebuilt" ]; then
    mkdir -p "/tmp/hmla_ab_$name/b/tools/hmla-bench" && cp "$prebuilt" "/tmp/hmla_ab_$name/b/tools/hmla-bench/hmla-bench"
    return
  fi
  [ "$v" = cur ] || v=$(realpath "$v")
  dir=/tmp/hmla_ab_$name
  rm -rf "$dir" && mkdir -p "$dir"
  cp -r CMakeLists.txt cmake include src tools tests .deps "$dir"/ 2>/dev/null
  case "$v" in
    cur) ;;
    *.patch) (cd "$dir" && git apply "$v") || { echo "== $name: patch does not apply"; return 1; } ;;
    *.cuh)
      cp "$v" "$dir/src/sm90/dense_decode/kernel.cuh"
      [ -f "${v%.cuh}.config.h" ] && cp "${v%.cuh}.config.h" "$dir/src/sm90/dense_decode/config.h" ;;
    *) echo "== $name: unknown variant kind (.patch or .cuh)"; return 1 ;;
  esac
  { cmake -S "$dir" -B "$dir/b" -G Ninja -DHMLA_BUILD_TESTS=OFF &&
    cmake --build "$dir/b" -j"$jobs_per_build" --target hmla-bench; } > "$dir/build.log" 2>&1 ||
    { echo "== $name: build failed"; tail -n 20 "$dir/build.log"; return 1; }
}

for v in "${variants[@]}"; do build_variant "$v" & done
wait
# Row by row, the variants alternate (HMLA_AB_REPS rounds, default 2): the card's clock drifts with
# its temperature and power state over a call, and alternating spreads that drift over all of them.
reps=${HMLA_AB_REPS:-2}
summary_input=$(mktemp)
while IFS= read -r args; do
  [ -n "$args" ] || continue
  echo "== $args"
  for ((rep = 0; rep < reps; ++rep)); do
    for v in "${variants[@]}"; do
      name=$(variant_name "$v")
      bench=/tmp/hmla_ab_$name/b/tools/hmla-bench/hmla-bench
      [ -x "$bench" ] || continue
      # shellcheck disable=SC2086
      "$bench" $args --no-ceilings --anchors "$anchors" 2>/dev/null | grep -E '^ *[0-9a-z_]+ +[0-9]+ .*[|]' | sed "s/^/$name /" |
        tee -a "$summary_input"
    done
  done
done <<< "$rows"
echo "== best of ${reps} per variant (ratio: the first variant's time over this one's)"
python3 scripts/profile/ab_summary.py "$summary_input"
rm -f "$summary_input"
