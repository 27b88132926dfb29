#!/usr/bin/env bash
# Shared first half of the two commands: find nvcc, install the pinned dependencies, configure and
# build every target into build/ (the CUDA sources included; no GPU is needed to compile).
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
