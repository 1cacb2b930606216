// GPU tests run when a GPU is present; otherwise they print the marker CTest reports as skipped
// (tests/cpp/CMakeLists.txt: SKIP_REGULAR_EXPRESSION) and return.
#pragma once

#include <iostream>

#include "kiln/runtime/device.h"

#define KILN_REQUIRE_GPU()                                                              \
  if (::kiln::NumGPUs() == 0) {                                                         \
    std::cout << "[kiln-skip] no GPU on this machine: this GPU test did not run\n";     \
    return;                                                                             \
  }
