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

#include <string>

#include "kiln/runtime/gpu.h"

// A test that needs a real GPU (PTX loaded by the driver, timings) says so and skips on simulated
// GPUs; it is the only kind of GPU test that skips under KILN_GPU_SIM.
#define KILN_REQUIRE_REAL_GPU()                                                                   \
  if (::kiln::NumGPUs() == 0 || std::string(::kiln::gpurt::Get().Name()) != "cuda") {            \
    std::cout << "[kiln-skip] needs a real GPU (PTX is loaded by the driver): did not run here\n"; \
    return;                                                                                       \
  }
