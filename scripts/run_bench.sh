#!/usr/bin/env bash
# The main job: installs the pinned dependencies, builds everything, then runs the dense decode
# benchmark sweep on the GPU and writes bench/results/latest.json. Extra arguments go to hmla-bench.
# Where there is no NVIDIA GPU it builds, says so and exits 0.
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

gpus=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null || true)
fi
if ! grep -q '^GPU ' <<<"$gpus"; then
  echo "no NVIDIA GPU on this machine: hmla-bench needs a Hopper GPU (sm_90a); see scripts/gpu_run.sh for the device workflow"
  exit 0
fi

mkdir -p bench/results
build/tools/hmla-bench/hmla-bench --sweep default --json bench/results/latest.json "$@"
