// Shared by the fuzz targets (one per reader of outside data, see CMakeLists.txt): what counts as a
// finding. A reader must answer hostile bytes with a typed user error (FormatError, ShapeError...)
// that says something; an InternalError (an invariant that input could break), any other
// exception escaping (std::terminate), a crash, a sanitizer report or a hang is a finding. What a
// reader accepts must also survive its own writer (the Check* helpers abort otherwise).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "kiln/runtime/error.h"

namespace kiln::fuzz {

[[noreturn]] inline void Finding(const char* what, std::string_view detail) {
  std::fprintf(stderr, "kiln fuzz finding: %s: %.*s\n", what, static_cast<int>(detail.size()), detail.data());
  std::abort();
}

/// Runs `read` (the reader on one input); returns whether it accepted the input.
template <class F> bool Accepts(F&& read) {
  try {
    read();
    return true;
  } catch (const InternalError& e) {
    Finding("InternalError (a kiln invariant) reached the caller", e.what());
  } catch (const Error& e) {
    if (std::strlen(e.what()) < 10) Finding("a typed error without a message", e.what());
    return false;
  }
}

/// Aborts unless `cond`: a property of an accepted input that failed.
inline void Require(bool cond, const char* what) {
  if (!cond) Finding("property failed", what);
}

}  // namespace kiln::fuzz
