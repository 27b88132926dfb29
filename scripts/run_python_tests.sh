#!/usr/bin/env bash
# Builds and installs hmla's Python package (python/: scikit-build-core + nanobind), then runs its
# pytest suite (python/tests); on a GPU machine also the Python-call overhead micro-benchmark.
#
#   scripts/run_python_tests.sh cpu   CI, no GPU: a venv (build-pyvenv/, git-ignored) with the pinned
#                                     tools of python/requirements-test.txt (needs PyPI), CPU tests only
#   scripts/run_python_tests.sh gpu   the H200: the machine's own Python, where PyTorch, CuPy, JAX,
#                                     nanobind and scikit-build-core are preinstalled (no network
#                                     needed); every test, then python/tests/bench_overhead.py
#   scripts/run_python_tests.sh       gpu when nvidia-smi lists a GPU, else cpu
#
# Logs, JUnit XML and the benchmark JSON go to $OUT (gpu mode: default ./gpu-out). The CUTLASS headers
# come from .deps/ (scripts/setup_deps.sh fetches them; the device tool must carry them, as for
# scripts/gpu_run.sh) or from -C cmake.define.CUTLASS_DIR=... in HMLA_PIP_ARGS.
# Environment: PYTHON (interpreter, default python3), HMLA_PIP_ARGS (extra `pip install` arguments).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-auto}
if [ "$mode" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then mode=gpu; else mode=cpu; fi
fi
case "$mode" in cpu|gpu) ;; *) echo "usage: $0 [cpu|gpu]" >&2; exit 2 ;; esac
if [ "$mode" = gpu ]; then OUT=${OUT:-$PWD/gpu-out}; fi
OUT=${OUT:-}
[ -n "$OUT" ] && mkdir -p "$OUT"
log_dir=${OUT:-$PWD/build-pyvenv-logs}
mkdir -p "$log_dir"
export PATH="/usr/local/cuda/bin:$PATH"
PY=${PYTHON:-python3}

echo "== hmla python tests ($mode mode)"
if [ "$mode" = cpu ]; then
  if [ ! -x build-pyvenv/bin/python ]; then
    "$PY" -m venv build-pyvenv || { echo "error: '$PY -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  fi
  PY=$PWD/build-pyvenv/bin/python
  "$PY" -m pip install --quiet --disable-pip-version-check -r python/requirements-test.txt || {
    echo "error: could not install python/requirements-test.txt (PyPI needed)" >&2; exit 1; }
else
  export PIP_BREAK_SYSTEM_PACKAGES=1  # the device's interpreter may be an OS-managed one
  if ! "$PY" -c "import nanobind, scikit_build_core, pytest, numpy" 2>/dev/null; then
    echo "installing the build/test tools (needs PyPI)"
    "$PY" -m pip install --quiet --disable-pip-version-check nanobind scikit-build-core pytest numpy || {
      echo "error: $PY lacks nanobind / scikit-build-core / pytest / numpy and PyPI is not reachable" >&2; exit 1; }
  fi
fi
"$PY" --version

# CUTLASS headers (the same pinned wheel as scripts/run_tests.sh); the CMake build fetches them too.
if [ ! -f .deps/cutlass-4.2.0.0/cutlass_library/source/include/cute/tensor.hpp ] && [[ "${HMLA_PIP_ARGS:-}" != *CUTLASS_DIR* ]]; then
  bash scripts/setup_deps.sh || echo "warning: scripts/setup_deps.sh failed; the build needs the CUTLASS headers" >&2
fi

echo "== build and install (log: $log_dir/python_build.log)"
t0=$(date +%s)
# shellcheck disable=SC2086
if ! "$PY" -m pip install --no-build-isolation --no-deps --disable-pip-version-check -v ${HMLA_PIP_ARGS:-} ./python \
     > "$log_dir/python_build.log" 2>&1; then
  tail -n 60 "$log_dir/python_build.log"
  echo "error: pip install ./python failed" >&2
  exit 1
fi
echo "built and installed in $(( $(date +%s) - t0 )) s"

status=0
junit=()
[ -n "$OUT" ] && junit=(--junitxml "$OUT/python_tests_$mode.xml")
echo "== pytest"
if [ "$mode" = cpu ]; then
  "$PY" -m pytest python/tests -m "not gpu" -q -rs -p no:cacheprovider "${junit[@]}" || status=1
else
  "$PY" -m pytest python/tests -v -rs -p no:cacheprovider "${junit[@]}" 2>&1 | tee "$log_dir/python_tests.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "== Python-call overhead (python/tests/bench_overhead.py)"
  OUT="$log_dir" "$PY" python/tests/bench_overhead.py || status=1
fi
exit $status
