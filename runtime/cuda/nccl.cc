// Collectives among the GPUs of one process over NCCL (see include/kiln/runtime/collectives.h).
//
// One communicator per ordered device set, made by ncclCommInitAll on first use and cached for
// the life of the process, with a non-blocking NCCL stream per device. A call issues one NCCL
// group over every device (single thread, several devices, as NCCL's examples do), then waits
// for those streams, so that when the engine task returns its outputs are final, as for every
// other GPU task. Uneven splits (np.array_split) use grouped ncclReduce / ncclBroadcast per
// part; even ones use ncclReduceScatter / ncclAllGather.
//
// What it does not do: overlap with the caller's compute stream through events (the engine
// orders tasks on variables, and GPU tasks finish their streams), or destroy communicators at
// exit (the CUDA context may already be gone then).
#include "kiln/runtime/collectives.h"

#include "kiln/runtime/error.h"
#include "nccl_coll.h"

#if KILN_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "nccl_types.h"

#include <map>
#include <memory>
#include <mutex>
#endif

namespace kiln::coll {

#if KILN_WITH_NCCL

namespace {

void NcclCheck(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    KILN_THROW(DeviceError) << what << " failed: " << ncclGetErrorString(r) << " (" << static_cast<int>(r)
                            << "); check that every GPU of the call is visible and not used by another "
                               "process's communicator";
}
void CudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    KILN_THROW(DeviceError) << what << " failed: " << cudaGetErrorString(e) << " (" << static_cast<int>(e)
                            << ")";
}

ncclDataType_t NcclType(DType dt) { return nccl::Type(dt, "NCCL collectives"); }
ncclRedOp_t NcclOp(ReduceOp op) { return nccl::Op(op); }

// The communicators and streams of one ordered device set.
class Clique {
public:
  explicit Clique(const std::vector<int>& devs) : devs_(devs), comms_(devs.size()), streams_(devs.size()) {
    NcclCheck(ncclCommInitAll(comms_.data(), static_cast<int>(devs.size()), devs.data()), "ncclCommInitAll");
    int prev = 0;
    CudaCheck(cudaGetDevice(&prev), "cudaGetDevice");
    for (size_t i = 0; i < devs.size(); ++i) {
      CudaCheck(cudaSetDevice(devs[i]), "cudaSetDevice");
      CudaCheck(cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking), "cudaStreamCreate");
    }
    cudaSetDevice(prev);
  }

  // Runs issue(i, comm, stream) for every device inside one NCCL group, then waits for all.
  template <class F> void Run(F&& issue) {
    std::lock_guard<std::mutex> g(mu_); // one collective at a time per communicator
    int prev = 0;
    CudaCheck(cudaGetDevice(&prev), "cudaGetDevice");
    NcclCheck(ncclGroupStart(), "ncclGroupStart");
    try {
      for (size_t i = 0; i < devs_.size(); ++i) issue(i, comms_[i], streams_[i]);
    } catch (...) {
      (void)ncclGroupEnd();
      throw;
    }
    NcclCheck(ncclGroupEnd(), "ncclGroupEnd");
    for (size_t i = 0; i < devs_.size(); ++i) {
      CudaCheck(cudaSetDevice(devs_[i]), "cudaSetDevice");
      CudaCheck(cudaStreamSynchronize(streams_[i]), "cudaStreamSynchronize (NCCL)");
    }
    cudaSetDevice(prev);
  }

private:
  std::vector<int> devs_;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
  std::mutex mu_;
};

Clique& GetClique(std::span<const Device> devices) {
  std::vector<int> key;
  for (const Device& d : devices) {
    KILN_CHECK(d.is_gpu()) << "NCCL collective on " << d.str();
    key.push_back(d.index);
  }
  static std::mutex mu;
  static auto* cache = new std::map<std::vector<int>, std::unique_ptr<Clique>>(); // leaked: see header
  std::lock_guard<std::mutex> g(mu);
  auto& c = (*cache)[key];
  if (!c) c = std::make_unique<Clique>(key);
  return *c;
}

std::vector<int64_t> Offsets(std::span<const int64_t> counts) {
  std::vector<int64_t> off(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) off[i] = off[i - 1] + counts[i - 1];
  return off;
}

} // namespace

bool HasNccl() { return true; }

void NcclAllReduceImpl(std::span<const Device> devices, const BufferSet& b, ReduceOp op) {
  const ncclDataType_t t = NcclType(b.dtype);
  const size_t K = b.numel.size();
  GetClique(devices).Run([&](size_t i, ncclComm_t comm, cudaStream_t s) {
    for (size_t k = 0; k < K; ++k) {
      void* p = b.ptrs[i * K + k];
      NcclCheck(ncclAllReduce(p, p, static_cast<size_t>(b.numel[k]), t, NcclOp(op), comm, s),
                "ncclAllReduce");
    }
  });
}

void NcclBroadcastImpl(std::span<const Device> devices, const BufferSet& b, int root) {
  const ncclDataType_t t = NcclType(b.dtype);
  const size_t K = b.numel.size();
  GetClique(devices).Run([&](size_t i, ncclComm_t comm, cudaStream_t s) {
    for (size_t k = 0; k < K; ++k) {
      void* p = b.ptrs[i * K + k];
      NcclCheck(ncclBroadcast(b.ptrs[static_cast<size_t>(root) * K + k], p, static_cast<size_t>(b.numel[k]),
                              t, root, comm, s),
                "ncclBroadcast");
    }
  });
}

void NcclReduceScatterImpl(std::span<const Device> devices, DType dt, std::span<const void* const> in, int64_t n,
                       std::span<void* const> out, ReduceOp op) {
  const ncclDataType_t t = NcclType(dt);
  const size_t D = devices.size(), es = DTypeSize(dt);
  std::vector<int64_t> counts = SplitCounts(n, static_cast<int>(D)), off = Offsets(counts);
  const bool even = n % static_cast<int64_t>(D) == 0;
  GetClique(devices).Run([&](size_t i, ncclComm_t comm, cudaStream_t s) {
    if (even) {
      NcclCheck(ncclReduceScatter(in[i], out[i], static_cast<size_t>(counts[0]), t, NcclOp(op), comm, s),
                "ncclReduceScatter");
      return;
    }
    for (size_t part = 0; part < D; ++part) {
      const void* src = static_cast<const char*>(in[i]) + off[part] * es;
      void* dst = part == i ? out[i] : const_cast<void*>(src); // recvbuff is used on the root only
      NcclCheck(ncclReduce(src, dst, static_cast<size_t>(counts[part]), t, NcclOp(op), static_cast<int>(part),
                           comm, s),
                "ncclReduce");
    }
  });
}

void NcclAllGatherImpl(std::span<const Device> devices, DType dt, std::span<const void* const> in,
                   std::span<const int64_t> counts, std::span<void* const> out) {
  const ncclDataType_t t = NcclType(dt);
  const size_t D = devices.size(), es = DTypeSize(dt);
  std::vector<int64_t> off = Offsets(counts);
  bool even = true;
  for (int64_t c : counts) even &= c == counts[0];
  GetClique(devices).Run([&](size_t i, ncclComm_t comm, cudaStream_t s) {
    if (even) {
      NcclCheck(ncclAllGather(in[i], out[i], static_cast<size_t>(counts[0]), t, comm, s), "ncclAllGather");
      return;
    }
    for (size_t part = 0; part < D; ++part) {
      void* dst = static_cast<char*>(out[i]) + off[part] * es;
      NcclCheck(
          ncclBroadcast(in[i], dst, static_cast<size_t>(counts[part]), t, static_cast<int>(part), comm, s),
          "ncclBroadcast");
    }
  });
}

#else // CUDA without NCCL

namespace {
[[noreturn]] void NoNccl() {
  KILN_THROW(DeviceError) << "collectives among GPUs need NCCL, and this kiln was built without it; "
                             "install NCCL next to the CUDA toolkit and rebuild, or reduce on kiln.cpu()";
}
} // namespace

bool HasNccl() { return false; }
void NcclAllReduceImpl(std::span<const Device>, const BufferSet&, ReduceOp) { NoNccl(); }
void NcclBroadcastImpl(std::span<const Device>, const BufferSet&, int) { NoNccl(); }
void NcclReduceScatterImpl(std::span<const Device>, DType, std::span<const void* const>, int64_t,
                       std::span<void* const>, ReduceOp) {
  NoNccl();
}
void NcclAllGatherImpl(std::span<const Device>, DType, std::span<const void* const>, std::span<const int64_t>,
                   std::span<void* const>) {
  NoNccl();
}

#endif

} // namespace kiln::coll
