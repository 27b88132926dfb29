#!/usr/bin/env bash
# The main job: installs the pinned dependencies, builds everything, then runs the dense decode
# benchmark sweep on the GPU and writes bench/results/latest.json. Extra arguments go to hmla-bench.
# Where there is no NVIDIA GPU it builds, says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/build.sh

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
