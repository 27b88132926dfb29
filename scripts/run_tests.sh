#!/usr/bin/env bash
# The tests command: installs the pinned dependencies, configures and builds everything (the CUDA
# sources included; no GPU is needed to compile), then runs every test with ctest.
#   cpu tests: the CPU reference, number formats, FP8 cache layouts, argument validation
#   gpu tests: the kernels against the reference; reported as skipped where there is no Hopper GPU
# Extra arguments go to ctest (for example: -L cpu).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/build.sh

ctest --test-dir build --output-on-failure "$@"
