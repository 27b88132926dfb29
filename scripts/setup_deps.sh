#!/usr/bin/env bash
# Installs the pinned build dependencies that do not come from the system into .deps/ (git-ignored):
#   CUTLASS/CuTe headers from the PyPI wheel nvidia-cutlass (headers only, --no-deps).
#   nlohmann-json headers from the PyPI wheel nlohmann-json (hmla-bench's JSON files).
#   CLI11 headers copied from Debian's libcli11-dev (hmla-bench's command line).
# The GPU machine installs no packages, so everything a build there needs is staged here.
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
# nlohmann-json: PyPI's wheel repackages the upstream release's include/ tree unchanged; pip pins it
# exactly on every machine, which Debian's package (3.11.2 on Debian 12) would not.
NLOHMANN_JSON_VERSION=3.12.0
json_dest=.deps/nlohmann-json-${NLOHMANN_JSON_VERSION}
if [ ! -f "$json_dest/nlohmann_json/include/nlohmann/json.hpp" ]; then
  rm -rf "$json_dest"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
    --target "$json_dest" "nlohmann-json==${NLOHMANN_JSON_VERSION}"
fi
# CLI11 is on no registry but Debian's (libcli11-dev 2.1.2+ds-1 on Debian 12, headers in
# /usr/include/CLI); only that version is staged, so that every build of the bench uses the same one.
# Where the package is not installed, its .deb is downloaded (apt-get download: no root, nothing
# installed) and only its headers unpacked into .deps/.
CLI11_VERSION=2.1.2
cli_dest=.deps/cli11-${CLI11_VERSION}
cli11_at() { grep -qs "#define CLI11_VERSION \"${CLI11_VERSION}\"" "$1/Version.hpp"; }
if [ ! -f "$cli_dest/include/CLI/CLI.hpp" ]; then
  cli_src=/usr/include/CLI
  if ! cli11_at "$cli_src" && command -v apt-get >/dev/null 2>&1; then
    cli_tmp=$(mktemp -d)
    if (cd "$cli_tmp" && apt-get download -q "libcli11-dev=${CLI11_VERSION}+ds-1" >/dev/null 2>&1 &&
        dpkg-deb -x libcli11-dev_*.deb unpacked); then
      cli_src=$cli_tmp/unpacked/usr/include/CLI
    fi
  fi
  if cli11_at "$cli_src"; then
    rm -rf "$cli_dest" && mkdir -p "$cli_dest/include" && cp -r "$cli_src" "$cli_dest/include/CLI"
  else
    echo "warning: CLI11 ${CLI11_VERSION} not staged: /usr/include/CLI is missing or another version and apt-get download failed" \
         "(apt-get install libcli11-dev on Debian 12); hmla-bench then needs -DHMLA_CLI11_INCLUDE_DIR=" >&2
  fi
  if [ -n "${cli_tmp:-}" ]; then rm -rf "$cli_tmp"; fi
fi
echo "deps ready: $dest $json_dest $cli_dest"
