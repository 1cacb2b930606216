// Builds without CUDA: there is no CUDA platform (gpurt::Get() falls back to the simulator under
// KILN_GPU_SIM, else to no GPUs).
#include "kiln/runtime/gpu.h"

namespace kiln::gpurt {
Platform* CreateCudaPlatform() { return nullptr; }
}  // namespace kiln::gpurt
