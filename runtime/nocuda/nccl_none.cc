// The NCCL collectives when kiln is built without CUDA: there are no GPUs to reduce among, and
// every call is a DeviceError.
#include "kiln/runtime/collectives.h"
#include "kiln/runtime/error.h"

namespace kiln::coll {

namespace {
[[noreturn]] void NoCuda() {
  KILN_THROW(DeviceError) << "kiln was built without CUDA (KILN_CUDA=OFF), so there are no GPU collectives; "
                             "reduce on kiln.cpu() devices, or rebuild with the CUDA toolkit and NCCL";
}
} // namespace

bool HasNccl() { return false; }
void NcclAllReduce(std::span<const Device>, const BufferSet&, ReduceOp) { NoCuda(); }
void NcclBroadcast(std::span<const Device>, const BufferSet&, int) { NoCuda(); }
void NcclReduceScatter(std::span<const Device>, DType, std::span<const void* const>, int64_t,
                       std::span<void* const>, ReduceOp) {
  NoCuda();
}
void NcclAllGather(std::span<const Device>, DType, std::span<const void* const>, std::span<const int64_t>,
                   std::span<void* const>) {
  NoCuda();
}

} // namespace kiln::coll
