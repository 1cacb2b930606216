// The hand-written GPU kernels of codegen/cu/*.cu as built into the library: each module's NVPTX
// IR (for a simulated GPU) and PTX (for a real one), by the .cu file's name. Empty when the build
// had no clang-19 or libdevice (codegen/CMakeLists.txt).
#pragma once
#include <cstring>
#include <span>

namespace kiln::codegen {

struct CuModule {
  const char* name;  ///< the .cu file's name without extension
  const char* ir;
  const char* ptx;
};

/// Every module built in (generated: codegen/cu/embed.cmake).
std::span<const CuModule> CuModules();

/// The module `name`, or nullptr when this build has none of that name.
inline const CuModule* FindCuModule(const char* name) {
  for (const CuModule& m : CuModules())
    if (std::strcmp(m.name, name) == 0) return &m;
  return nullptr;
}

}  // namespace kiln::codegen
