// GPU collectives across processes when kiln is built without CUDA: there are no GPU arrays,
// so any call is a DeviceError (the CUDA build's version is runtime/cuda/nccl_dist.cc).
#include "kiln/runtime/error.h"
#include "kiln/runtime/mpi.h"

namespace kiln::mpi {

bool NcclAvailable() { return false; }
void NcclAllreduce(void*, int64_t, DType, ReduceOp, int, void*) {
  KILN_THROW(DeviceError) << "allreduce on GPU across processes: kiln was built without CUDA "
                             "(KILN_CUDA=OFF); use kiln.cpu() arrays, or rebuild with the CUDA toolkit";
}
void NcclShutdown() {}

} // namespace kiln::mpi
