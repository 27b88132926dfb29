# Locates hmla-bench's header-only dependencies and makes one INTERFACE target of each, used by the
# bench alone (the library never sees them):
#   hmla_bench_nlohmann_json  nlohmann-json >= 3.11 (ordered_json, dump's UTF-8 error handler)
#   hmla_bench_cli11          CLI11 >= 2.1 (set_version_flag, fallthrough subcommands)
# Searched in order: -DHMLA_NLOHMANN_JSON_INCLUDE_DIR= / -DHMLA_CLI11_INCLUDE_DIR=, the pinned copies
# that scripts/setup_deps.sh stages under .deps/, then the system's include directories.
set(HMLA_NLOHMANN_JSON_VERSION "3.12.0")
set(HMLA_CLI11_VERSION "2.1.2")

find_path(HMLA_NLOHMANN_JSON_INCLUDE_DIR nlohmann/json.hpp
          HINTS "${PROJECT_SOURCE_DIR}/.deps/nlohmann-json-${HMLA_NLOHMANN_JSON_VERSION}/nlohmann_json/include"
          DOC "directory holding nlohmann/json.hpp")
find_path(HMLA_CLI11_INCLUDE_DIR CLI/CLI.hpp
          HINTS "${PROJECT_SOURCE_DIR}/.deps/cli11-${HMLA_CLI11_VERSION}/include"
          DOC "directory holding CLI/CLI.hpp")

# "MAJOR.MINOR.PATCH" from three #define lines of `file`, or "" when they are not there.
function(_hmla_header_version out file prefix)
  set(_parts)
  foreach(_part MAJOR MINOR PATCH)
    file(STRINGS "${file}" _line REGEX "#define ${prefix}_${_part} +[0-9]+")
    string(REGEX REPLACE ".*#define ${prefix}_${_part} +([0-9]+).*" "\\1" _number "${_line}")
    list(APPEND _parts "${_number}")
  endforeach()
  list(JOIN _parts "." _version)
  if(NOT _version MATCHES "^[0-9]+\\.[0-9]+\\.[0-9]+$")
    set(_version "")
  endif()
  set(${out} "${_version}" PARENT_SCOPE)
endfunction()

# The version macros sit in detail/abi_macros.hpp from 3.11 on, in json.hpp itself before.
set(_hmla_json_version "")
if(HMLA_NLOHMANN_JSON_INCLUDE_DIR)
  foreach(_file detail/abi_macros.hpp json.hpp)
    if(NOT _hmla_json_version AND EXISTS "${HMLA_NLOHMANN_JSON_INCLUDE_DIR}/nlohmann/${_file}")
      _hmla_header_version(_hmla_json_version "${HMLA_NLOHMANN_JSON_INCLUDE_DIR}/nlohmann/${_file}"
                           NLOHMANN_JSON_VERSION)
    endif()
  endforeach()
endif()
if(NOT _hmla_json_version OR _hmla_json_version VERSION_LESS 3.11)
  message(FATAL_ERROR
    "hmla-bench needs nlohmann-json >= 3.11 (found: '${_hmla_json_version}' in "
    "'${HMLA_NLOHMANN_JSON_INCLUDE_DIR}'). Run scripts/setup_deps.sh (stages nlohmann-json=="
    "${HMLA_NLOHMANN_JSON_VERSION} from PyPI into .deps/), install nlohmann-json3-dev, or pass "
    "-DHMLA_NLOHMANN_JSON_INCLUDE_DIR=<dir holding nlohmann/json.hpp>; -DHMLA_BUILD_TOOLS=OFF skips the bench.")
endif()

set(_hmla_cli11_version "")
if(HMLA_CLI11_INCLUDE_DIR AND EXISTS "${HMLA_CLI11_INCLUDE_DIR}/CLI/Version.hpp")
  _hmla_header_version(_hmla_cli11_version "${HMLA_CLI11_INCLUDE_DIR}/CLI/Version.hpp" CLI11_VERSION)
endif()
if(NOT _hmla_cli11_version OR _hmla_cli11_version VERSION_LESS 2.1)
  message(FATAL_ERROR
    "hmla-bench needs CLI11 >= 2.1 (found: '${_hmla_cli11_version}' in '${HMLA_CLI11_INCLUDE_DIR}'). "
    "Install libcli11-dev and run scripts/setup_deps.sh (stages CLI11 ${HMLA_CLI11_VERSION} into .deps/), or "
    "pass -DHMLA_CLI11_INCLUDE_DIR=<dir holding CLI/CLI.hpp>; -DHMLA_BUILD_TOOLS=OFF skips the bench.")
endif()

add_library(hmla_bench_nlohmann_json INTERFACE)
target_include_directories(hmla_bench_nlohmann_json SYSTEM INTERFACE "${HMLA_NLOHMANN_JSON_INCLUDE_DIR}")
add_library(hmla_bench_cli11 INTERFACE)
target_include_directories(hmla_bench_cli11 SYSTEM INTERFACE "${HMLA_CLI11_INCLUDE_DIR}")
message(STATUS "hmla-bench: nlohmann-json ${_hmla_json_version} from ${HMLA_NLOHMANN_JSON_INCLUDE_DIR}, "
               "CLI11 ${_hmla_cli11_version} from ${HMLA_CLI11_INCLUDE_DIR}")
