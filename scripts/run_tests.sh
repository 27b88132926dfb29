#!/usr/bin/env bash
# The tests command: installs the pinned dependencies, configures and builds everything (the CUDA
# sources included; no GPU is needed to compile), then runs every test with ctest.
#   cpu tests: the CPU reference, number formats, FP8 cache layouts, argument validation
#   gpu tests: the kernels against the reference; reported as skipped where there is no Hopper GPU
# Extra arguments go to ctest (for example: -L cpu).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if ! command -v nvcc >/dev/null 2>&1; then
  echo "error: nvcc not found: hmla needs the CUDA 13.0 toolkit (nvcc on PATH or in /usr/local/cuda/bin)" >&2
  exit 1
fi

bash scripts/setup_deps.sh
cmake -S . -B build -G Ninja
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure "$@"
