# Locates the CUTLASS/CuTe headers (header-only use).
#   -DCUTLASS_DIR=<dir>  a CUTLASS source tree or install prefix (holding include/cute/tensor.hpp)
#   default              the pinned PyPI wheel that scripts/setup_deps.sh unpacks under .deps/
set(HMLA_CUTLASS_VERSION "4.2.0.0")
set(CUTLASS_DIR "" CACHE PATH "CUTLASS source tree or install prefix")

set(_hmla_cutlass_candidates)
if(CUTLASS_DIR)
  list(APPEND _hmla_cutlass_candidates "${CUTLASS_DIR}" "${CUTLASS_DIR}/cutlass_library/source")
else()
  list(APPEND _hmla_cutlass_candidates
       "${PROJECT_SOURCE_DIR}/.deps/cutlass-${HMLA_CUTLASS_VERSION}/cutlass_library/source")
endif()

set(HMLA_CUTLASS_INCLUDE_DIRS "")
foreach(_root IN LISTS _hmla_cutlass_candidates)
  if(EXISTS "${_root}/include/cute/tensor.hpp")
    set(HMLA_CUTLASS_INCLUDE_DIRS "${_root}/include")
    if(EXISTS "${_root}/tools/util/include")
      list(APPEND HMLA_CUTLASS_INCLUDE_DIRS "${_root}/tools/util/include")
    endif()
    break()
  endif()
endforeach()

if(NOT HMLA_CUTLASS_INCLUDE_DIRS)
  message(FATAL_ERROR
    "CUTLASS/CuTe headers not found (looked in: ${_hmla_cutlass_candidates}). "
    "Run scripts/setup_deps.sh to install nvidia-cutlass==${HMLA_CUTLASS_VERSION} into .deps/, "
    "or pass -DCUTLASS_DIR=<CUTLASS source tree>.")
endif()
message(STATUS "hmla: CUTLASS/CuTe headers from ${HMLA_CUTLASS_INCLUDE_DIRS}")
