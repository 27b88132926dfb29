#!/usr/bin/env bash
# The device tool carries at most 64 MiB of ignored paths; the prebuilt binaries and CUTLASS headers
# a device call needs are ~75 MiB as files but ~4 MiB as xz archives (the fatbins compress well).
#   scripts/carry_pack.sh PATH...     (workstation) each PATH packed into .deps/packed/, then carry .deps/packed
#   scripts/carry_pack.sh --unpack    (device) every archive in .deps/packed/ extracted in place
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --unpack ]; then
  for a in .deps/packed/*.txz; do [ -f "$a" ] && tar xJf "$a"; done
  exit 0
fi
[ $# -gt 0 ] || { echo "usage: $0 PATH... | --unpack" >&2; exit 2; }
rm -rf .deps/packed && mkdir -p .deps/packed
for p in "$@"; do
  [ -e "$p" ] || { echo "no such path: $p" >&2; exit 1; }
  name=$(echo "$p" | tr '/' '_'); name=${name#.}  # no hidden archive: the unpack glob skips those
  tar cf - "$p" | xz -T0 -6 > ".deps/packed/$name.txz"
done
du -sh .deps/packed
