#!/usr/bin/env bash
# Issue 27's host-side figures in one device call:
#   hmla-host-overhead      the C++ run entry points' host time against the launch floor ($OUT/host_overhead.json);
#   bench_overhead.py       the Python call's overhead over its kernels, FlashMLA's on the same call
#                           beside it ($OUT/python_overhead.json);
#   test_gpu_compile.py     torch.compile, CUDA-graph capture and torch.library.opcheck of the ops
#                           (full tracebacks in the log).
# HMLA_BIN=dir holding hmla-host-overhead (built on the workstation with the same nvcc), else build-gpu/
# is built. The Python package is installed from ./python unless HMLA_PY_INSTALLED=1 (carry the CUTLASS
# include folders); FlashMLA comes from .deps/compare (a copy of ../shared/anchors/compare).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH" PIP_BREAK_SYSTEM_PACKAGES=1
status=0
if [ "${HMLA_PY_INSTALLED:-0}" != 1 ]; then
  python3 -m pip install -q --no-build-isolation --no-deps ./python > "$OUT/python_build.log" 2>&1 &
  pip_pid=$!
fi
fm_ready=0
if [ -d .deps/compare ]; then
  bash .deps/compare/build_flashmla.sh /tmp/fm > "$OUT/flashmla_build.log" 2>&1 && fm_ready=1
fi
if [ -n "${HMLA_BIN:-}" ]; then
  H=$HMLA_BIN/hmla-host-overhead
else
  { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build-gpu -j"$(nproc)" --target hmla-host-overhead; } \
    > "$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log"; exit 1; }
  H=build-gpu/tools/hmla-bench/hmla-host-overhead
fi
echo "== hmla-host-overhead"
timeout 120 "$H" --json "$OUT/host_overhead.json" || status=1
if [ -n "${pip_pid:-}" ]; then
  wait "$pip_pid" || { tail -n 30 "$OUT/python_build.log"; exit 1; }
fi
pypath=""
[ "$fm_ready" = 1 ] && pypath=/tmp/fm/FlashMLA
echo "== bench_overhead.py (FlashMLA beside: $([ "$fm_ready" = 1 ] && echo yes || echo no))"
(cd /tmp && OUT="$OUT" PYTHONPATH=$pypath timeout 180 python3 "$OLDPWD/python/tests/bench_overhead.py") \
  > "$OUT/overhead.log" 2>&1 || status=1
tail -n 16 "$OUT/overhead.log"
echo "== test_gpu_compile.py"
timeout 300 python3 -m pytest -q -rs -p no:cacheprovider --tb=long python/tests/test_gpu_compile.py \
  > "$OUT/compile_tests.log" 2>&1 || status=1
grep -E "passed|failed|Error|error:|^E " "$OUT/compile_tests.log" | head -n 40
exit $status
