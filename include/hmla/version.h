// hmla's version, the one place it is written: CMakeLists.txt (project VERSION, the installed
// hmlaConfigVersion.cmake) and python/pyproject.toml (the wheel's version) both read the three
// numbers below with a regex, so each stays a plain `#define NAME <integer>` on its own line.
#pragma once

#define HMLA_VERSION_MAJOR 0
#define HMLA_VERSION_MINOR 2
#define HMLA_VERSION_PATCH 0

// Two levels so that the numbers, not the macro names, are turned into text.
#define HMLA_VERSION_TEXT_(x) #x
#define HMLA_VERSION_TEXT(x) HMLA_VERSION_TEXT_(x)
#define HMLA_VERSION_STRING                                                   \
  HMLA_VERSION_TEXT(HMLA_VERSION_MAJOR) "." HMLA_VERSION_TEXT(HMLA_VERSION_MINOR) "." \
  HMLA_VERSION_TEXT(HMLA_VERSION_PATCH)
// One integer for preprocessor comparisons: 0.2.0 is 200, 1.4.12 is 10412.
#define HMLA_VERSION (HMLA_VERSION_MAJOR * 10000 + HMLA_VERSION_MINOR * 100 + HMLA_VERSION_PATCH)

namespace hmla {

// The version of the headers this translation unit was compiled against. Inline, so that it needs
// nothing from the library at link time and a CPU-only tool can print it.
inline const char* version() { return HMLA_VERSION_STRING; }

}  // namespace hmla
