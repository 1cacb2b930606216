// The NCCL collectives of one process's GPUs, which the CUDA platform (gpu_cuda.cc) serves as
// gpurt::Platform's collectives. Internal to runtime/cuda/.
#pragma once

#include <span>

#include "kiln/runtime/collectives.h"

namespace kiln::coll {

void NcclAllReduceImpl(std::span<const Device> devices, const BufferSet& b, ReduceOp op);
void NcclBroadcastImpl(std::span<const Device> devices, const BufferSet& b, int root);
void NcclReduceScatterImpl(std::span<const Device> devices, DType dt, std::span<const void* const> in, int64_t n,
                           std::span<void* const> out, ReduceOp op);
void NcclAllGatherImpl(std::span<const Device> devices, DType dt, std::span<const void* const> in,
                       std::span<const int64_t> counts, std::span<void* const> out);

}  // namespace kiln::coll
