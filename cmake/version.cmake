# hmla_read_version(<header> <out_var>): sets <out_var> to "MAJOR.MINOR.PATCH" read from the
# HMLA_VERSION_* defines of include/hmla/version.h, so that the header stays the only place the
# version is written. Usable before project() (it needs no language).
function(hmla_read_version header out_var)
  file(STRINGS "${header}" _lines REGEX "^#define HMLA_VERSION_(MAJOR|MINOR|PATCH) +[0-9]+ *$")
  foreach(_part MAJOR MINOR PATCH)
    set(_value "")
    foreach(_line IN LISTS _lines)
      if(_line MATCHES "^#define HMLA_VERSION_${_part} +([0-9]+)")
        set(_value "${CMAKE_MATCH_1}")
      endif()
    endforeach()
    if(_value STREQUAL "")
      message(FATAL_ERROR "hmla: no '#define HMLA_VERSION_${_part} <integer>' line in ${header}")
    endif()
    set(_${_part} "${_value}")
  endforeach()
  set(${out_var} "${_MAJOR}.${_MINOR}.${_PATCH}" PARENT_SCOPE)
endfunction()
