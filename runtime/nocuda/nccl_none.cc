// Builds without CUDA have no NCCL: GPU collectives are those of the simulator (gpu.h), if any.
#include "kiln/runtime/collectives.h"

namespace kiln::coll {

bool HasNccl() { return false; }

} // namespace kiln::coll
