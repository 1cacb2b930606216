// GPU buffers across processes: NCCL, bootstrapped through MPI (include/kiln/runtime/mpi.h).
// Rank 0 makes the unique id, MPI broadcasts it, every rank joins with ncclCommInitRank on its
// GPU. One communicator per process, for the first GPU it reduces on (the usual one GPU per
// rank, chosen with local_rank()). Built without NCCL (KILN_WITH_NCCL unset), every call is a
// DeviceError. What it does not do: deadlines (NCCL waits on the stream; a dead peer is
// caught by the MPI collectives around it), several GPUs per process.
#include <mutex>
#include <string>

#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/mpi.h"

#if KILN_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "nccl_types.h"
#endif

namespace kiln::mpi {

#if KILN_WITH_NCCL

namespace {

struct NcclState {
  std::mutex mu;
  ncclComm_t comm = nullptr;
  int device = -1;
};

NcclState& State() {
  static NcclState* s = new NcclState();
  return *s;
}

void Check(ncclResult_t rc, const char* call) {
  if (rc != ncclSuccess)
    KILN_THROW(DistributedError) << "allreduce on GPU: " << call << " failed: " << ncclGetErrorString(rc)
                                 << "; check that every rank reduces on its own GPU (gpu(local_rank())) "
                                    "and that the other ranks are alive";
}

ncclDataType_t NcclType(DType t) { return coll::nccl::Type(t, "allreduce on GPU"); }
ncclRedOp_t NcclOp(ReduceOp op) { return coll::nccl::Op(op); }

ncclComm_t CommFor(int device_index) {
  NcclState& s = State();
  std::lock_guard<std::mutex> g(s.mu);
  if (s.comm) {
    if (s.device != device_index)
      KILN_THROW(DeviceError) << "allreduce on GPU: this process reduces on gpu(" << s.device
                              << "), found an array on gpu(" << device_index
                              << "); use one GPU per process (gpu(kiln.distributed.local_rank()))";
    return s.comm;
  }
  ncclUniqueId id{};
  if (Rank() == 0) Check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  Broadcast(&id, sizeof id, 0, "allreduce on GPU (NCCL bootstrap)");
  if (cudaSetDevice(device_index) != cudaSuccess)
    KILN_THROW(DeviceError) << "allreduce on GPU: cudaSetDevice(" << device_index << ") failed";
  Check(ncclCommInitRank(&s.comm, Size(), id, Rank()), "ncclCommInitRank");
  s.device = device_index;
  return s.comm;
}

} // namespace

bool NcclAvailable() { return std::string(gpurt::Get().Name()) == "cuda"; }

void NcclAllreduce(void* buf, int64_t count, DType dtype, ReduceOp op, int device_index, void* stream) {
  ncclComm_t comm = CommFor(device_index);
  if (count == 0) return;
  Check(ncclAllReduce(buf, buf, static_cast<size_t>(count), NcclType(dtype), NcclOp(op), comm,
                      static_cast<cudaStream_t>(stream)),
        "ncclAllReduce");
}

void NcclShutdown() {
  NcclState& s = State();
  std::lock_guard<std::mutex> g(s.mu);
  if (s.comm) ncclCommDestroy(s.comm);
  s.comm = nullptr;
  s.device = -1;
}

#else // CUDA without NCCL

bool NcclAvailable() { return false; }
void NcclAllreduce(void*, int64_t, DType, ReduceOp, int, void*) {
  KILN_THROW(DeviceError) << "allreduce on GPU across processes: expected kiln built with NCCL, found "
                             "none (libnccl was not found at configure time); install NCCL next to the "
                             "CUDA toolkit and reconfigure, or reduce CPU copies of the arrays";
}
void NcclShutdown() {}

#endif

} // namespace kiln::mpi
