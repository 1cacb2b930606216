// Helpers of the simulated-GPU tests: the simulator to test (the process's platform under
// KILN_GPU_SIM, else a private one), a code-expecting check, and a kernel test double whose GPU
// threads run a C++ lambda (installed as the module compiler while a test needs it).
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/runtime/gpu.h"
#include "kiln/runtime/gpusim/emulator.h"

namespace kiln::testing {

/// The simulator under test: gpurt::Get() when it is one (KILN_GPU_SIM), else one of our own
/// with two devices of 256 MiB (so these tests run in every configuration).
inline gpurt::Platform& Sim() {
  static gpurt::Platform* p = std::string(gpurt::Get().Name()) == "simulator"
                                  ? &gpurt::Get()
                                  : gpurt::CreateSimulatedPlatform(2, size_t{256} << 20);
  return *p;
}

/// The CUDA code of the GpuError `f` throws (0 when it throws none).
template <class F>
int CodeOf(F&& f) {
  try {
    f();
  } catch (const gpurt::GpuError& e) {
    (void)e.what();
    return e.code();
  }
  return 0;
}

/// Host view of simulated device memory (what a simulated kernel or copy touches).
template <class T>
T* HostView(void* device_ptr) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(device_ptr) + gpusim::DeviceMemoryWindow().alias_delta);
}

using ThreadBody = std::function<void(gpusim::Dim3 block_idx, gpusim::Dim3 thread_idx, gpusim::Dim3 block_dim,
                                      void** args)>;

/// A kernel whose every GPU thread runs `body`; blocks in reverse order (not launch order).
class LambdaKernel final : public gpusim::EmulatedKernel {
 public:
  LambdaKernel(ThreadBody body, gpusim::KernelAttributes a) : body_(std::move(body)), attrs_(std::move(a)) {}
  gpusim::KernelAttributes& attributes() override { return attrs_; }
  std::unique_ptr<gpusim::KernelFault> Run(gpusim::Dim3 grid, gpusim::Dim3 block, size_t, void** args) override {
    ++runs;
    for (int64_t b = int64_t{grid.x} * grid.y * grid.z - 1; b >= 0; --b) {
      gpusim::Dim3 bi{static_cast<uint32_t>(b % grid.x), static_cast<uint32_t>(b / grid.x % grid.y),
                      static_cast<uint32_t>(b / (int64_t{grid.x} * grid.y))};
      for (uint32_t z = 0; z < block.z; ++z)
        for (uint32_t y = 0; y < block.y; ++y)
          for (uint32_t x = 0; x < block.x; ++x) body_(bi, {x, y, z}, block, args);
    }
    if (fault_code) return std::make_unique<gpusim::KernelFault>(gpusim::KernelFault{fault_code, "planted fault"});
    return nullptr;
  }
  int fault_code = 0;
  std::atomic<int> runs{0};

 private:
  ThreadBody body_;
  gpusim::KernelAttributes attrs_;
};

/// Kernels by module "IR" text: LambdaModules().emplace("test:name", ...) before loading.
inline std::map<std::string, std::function<std::unique_ptr<LambdaKernel>()>>& LambdaModules() {
  static std::map<std::string, std::function<std::unique_ptr<LambdaKernel>()>> m;
  return m;
}

class LambdaModule final : public gpusim::EmulatedModule {
 public:
  explicit LambdaModule(std::unique_ptr<LambdaKernel> k) : k_(std::move(k)) {}
  gpusim::EmulatedKernel* Function(const std::string& name) override { return name == "k" ? k_.get() : nullptr; }

 private:
  std::unique_ptr<LambdaKernel> k_;
};

/// Installs the lambda-module compiler for the scope (restoring whatever was installed).
class LambdaCompilerScope {
 public:
  LambdaCompilerScope() : prev_(gpusim::GetModuleCompiler()) {
    gpusim::SetModuleCompiler([](std::string_view ir) -> std::unique_ptr<gpusim::EmulatedModule> {
      auto it = LambdaModules().find(std::string(ir));
      if (it == LambdaModules().end()) return nullptr;
      return std::make_unique<LambdaModule>(it->second());
    });
  }
  ~LambdaCompilerScope() {
    for (size_t i = Loaded().size(); i-- > loaded_before_;) Loaded()[i].first->ModuleUnload(Loaded()[i].second);
    Loaded().resize(loaded_before_);
    gpusim::SetModuleCompiler(prev_);
  }

  /// Loads the lambda module `id` on `p`'s current device; it is unloaded when the scope ends
  /// (the test's launches have finished by then), so that LeakSanitizer finds nothing left.
  static gpurt::Module Load(gpurt::Platform& p, const std::string& id) {
    gpurt::Module m = p.ModuleLoad({id, ""});
    Loaded().emplace_back(&p, m);
    return m;
  }

 private:
  static std::vector<std::pair<gpurt::Platform*, gpurt::Module>>& Loaded() {
    static std::vector<std::pair<gpurt::Platform*, gpurt::Module>> v;
    return v;
  }
  size_t loaded_before_ = Loaded().size();
  gpusim::ModuleCompiler prev_;
};

}  // namespace kiln::testing
