#!/usr/bin/env bash
# An hmla-bench of a kernel variant, built on the workstation from build/ (configured and built
# first), so that a device call times several variants without building any of them there:
#   scripts/build_bench_variant.sh NAME [--patch FILE] [--flags "NVCC FLAGS"] [--only REGEX] [--tests]
# The library's translation units whose source path matches REGEX (default: the sparse decode
# instantiations, src/sm90/sparse_decode/instantiate) are recompiled with the patch applied (to a
# copy of include/ and src/) and the flags added; build/libhmla.a is copied, those objects replaced,
# and hmla-bench linked against the copy (with --tests, hmla_gpu_tests too: its objects are main's,
# right as long as the patch changes no library header a test includes, which today is only
# src/common/fp8_dequant.cuh). Other files of the patch (tests, tools) are ignored.
# Output: .deps/variants/bench_NAME (stripped), to carry and time with
#   HMLA_AB_NO_CUR=1 bash scripts/gpu_ab.sh .deps/variants/bench_main .deps/variants/bench_NAME
# (bench_main: `scripts/build_bench_variant.sh main`, no patch, no flags). ptxas's spill and
# serialisation reports (-Xptxas -v) go to .deps/variants/NAME.ptxas.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
name=${1:?usage: $0 NAME [--patch FILE] [--flags FLAGS] [--only REGEX] [--tests]}
shift
patch= flags= only='src/sm90/sparse_decode/instantiate' tests=0
while [ $# -gt 0 ]; do
  case "$1" in
    --patch) patch=$(realpath "$2"); shift 2 ;;
    --flags) flags=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --tests) tests=1; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -f build/build.ninja ] || { echo "build/ is not configured: run scripts/build.sh first" >&2; exit 1; }
export PATH="/usr/local/cuda/bin:$PATH"
work=$(mktemp -d "/tmp/hmla_variant_${name}.XXXX")
trap 'rm -rf "$work"' EXIT
src_root=$root
if [ -n "$patch" ]; then
  cp -r include src "$work"/
  (cd "$work" && git apply --include='include/*' --include='src/*' "$patch")
  src_root=$work
fi
report=$root/.deps/variants/$name.ptxas.txt
mkdir -p "$root/.deps/variants"
: > "$report"
mapfile -t commands < <(ninja -C build -t commands hmla-bench | grep -E -- " -c $root/[^ ]*($only)[^ ]*\.cu( |$)" || true)
[ ${#commands[@]} -gt 0 ] || { echo "no library translation unit matches '$only'" >&2; exit 1; }
# The library is re-archived from ninja's own archive line with the recompiled objects in place of
# theirs (replacing members by name would hit the first of two same-named objects, e.g. the
# dense and sparse decode launch.cu.o).
archive=" $(ninja -C build -t commands hmla | grep -E -- 'ar qc libhmla\.a ' | tail -n 1 | sed 's/.*ar qc libhmla\.a //; s/ &&.*//') "
# The translation units compile side by side, one per core (each nvcc of an instantiation file
# takes a minute or more), each writing its ptxas report to a file of its own.
parallel=$(nproc)
members=()
for cmd in "${commands[@]}"; do
  obj=$(grep -o -- ' -o [^ ]*' <<< "$cmd" | head -n 1 | cut -c5-)
  member=$(echo "$obj" | tr '/' '_')
  # Sources and headers from the patched copy (the tree's own paths otherwise), the object beside
  # the library copy, the extra flags and ptxas's report last.
  cmd=${cmd//-I$root\/include/-I$src_root\/include}
  cmd=${cmd//-I$root\/src/-I$src_root\/src}
  cmd=${cmd// -c $root\/src\// -c $src_root\/src\/}
  cmd=${cmd// -o $obj/ -o $work\/$member}
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
  ( (cd build && eval "$cmd $flags -Xptxas -v") > "$work/$member.log" 2>&1 ) &
  members+=("$member")
  archive=${archive/ $obj / $work\/$member }
done
wait
for member in "${members[@]}"; do
  grep -E "spill|C75|error" "$work/$member.log" | grep -v " 0 bytes spill" >> "$report" || true
  [ -f "$work/$member" ] || { echo "compile failed: $member (errors in $report)" >&2; exit 1; }
done
(cd build && rm -f "$work/libhmla.a" && eval "ar qc $work/libhmla.a $archive" && ranlib "$work/libhmla.a")
# A target's link line from ninja, against the library copy, writing into the work folder.
relink() {
  local target=$1 out=$2 link
  link=$(ninja -C build -t commands "$target" | tail -n 1)
  link=${link//libhmla.a/$work\/libhmla.a}
  link=${link//-o $out/-o $work\/$(basename "$out")}
  (cd build && eval "$link")
  strip "$work/$(basename "$out")"
}
relink hmla-bench tools/hmla-bench/hmla-bench
cp "$work/hmla-bench" "$root/.deps/variants/bench_$name"
if [ "$tests" = 1 ]; then
  relink hmla_gpu_tests tests/hmla_gpu_tests
  cp "$work/hmla_gpu_tests" "$root/.deps/variants/tests_$name"
fi
echo "built .deps/variants/bench_$name$([ "$tests" = 1 ] && echo " and tests_$name") (${#commands[@]} translation units recompiled; ptxas: $report)"
[ -s "$report" ] && sed 's/^/  /' "$report" | cut -c1-200 | sort | uniq -c | head -n 12
exit 0
