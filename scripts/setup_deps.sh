#!/usr/bin/env bash
# Installs the pinned build dependencies that do not come from the system into .deps/ (git-ignored):
#   CUTLASS/CuTe headers from the PyPI wheel nvidia-cutlass (headers only, --no-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
CUTLASS_VERSION=4.2.0.0
dest=.deps/cutlass-${CUTLASS_VERSION}
if [ ! -f "$dest/cutlass_library/source/include/cute/tensor.hpp" ]; then
  rm -rf "$dest"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
    --target "$dest" "nvidia-cutlass==${CUTLASS_VERSION}"
fi
# GoogleTest sources travel to the GPU machine (which has no GoogleTest package) from Debian's copy.
if [ ! -f .deps/googletest/CMakeLists.txt ] && [ -f /usr/src/googletest/CMakeLists.txt ]; then
  mkdir -p .deps && cp -r /usr/src/googletest .deps/googletest
fi
echo "deps ready: $dest"
