// Collectives among the devices of one process, over raw buffers (DESIGN.md section 10): the
// buffer work behind frontend/collectives.h. CPU devices share the host's memory, so a collective
// is a threaded pass over every device's buffers (HostAllReduce...); GPUs go through NCCL
// (NcclAllReduce...; runtime/cuda/nccl.cc, and a stub in builds without CUDA or NCCL).
//
// Determinism: every reduced element is accumulated in device order (device 0, then 1, ...) in
// the dtype's compute type (float for float16/bfloat16), so every device receives bit-identical
// values whatever the thread count or chunking. The CPU path guarantees it; NCCL's own
// reduction order is NCCL's (identical on every device, not necessarily device order).
//
// What it does not do: argument checks beyond internal invariants (the frontend checks and
// explains), engine scheduling (the caller runs these inside one engine task), strided buffers.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/runtime/dtype.h"

namespace kiln::coll {

enum class ReduceOp : uint8_t { kSum, kMean, kMax, kMin };

/// "sum", "mean", "max", "min".
const char* ReduceOpName(ReduceOp op);
/// Parses an op name; throws ValueError listing the valid names otherwise.
ReduceOp ParseReduceOp(std::string_view name);
/// Throws DTypeError when the collectives cannot reduce `dt` (bool).
void CheckReducible(const char* what, DType dt);

/// The buffers of an AllReduce or Broadcast: tensor k of device d starts at
/// `ptrs[d * numel.size() + k]` and holds `numel[k]` contiguous elements of `dtype`.
struct BufferSet {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> numel;
  std::vector<void*> ptrs;
  int devices() const { return numel.empty() ? 0 : static_cast<int>(ptrs.size() / numel.size()); }
};

/// How a host collective splits its work: `chunks` pieces of the flat element range handed to
/// kiln's fork-join pool (0: one per thread, each at least `grain` elements). Results do not
/// depend on either; tests vary them to prove it.
struct HostOptions {
  int64_t chunks = 0;
  int64_t grain = int64_t{1} << 15;
};

/// The sizes of np.array_split(range(n), parts): the first n % parts parts one element longer.
std::vector<int64_t> SplitCounts(int64_t n, int parts);

// ---- CPU devices (host memory) -----------------------------------------------------------------

/// dst[i] = op(dst[i], src[i]) for i in [0, n), on the calling thread, with the loop and the
/// combination every host collective uses (the MPI ring's reduction step). kMean sums: the caller
/// divides once every part is in.
void HostReduceInto(DType dt, void* dst, const void* src, int64_t n, ReduceOp op);
/// Reduces tensor k over all devices, in device order, and writes the result to every device.
void HostAllReduce(const BufferSet& b, ReduceOp op, const HostOptions& o = {});
/// Copies device `root`'s tensors to every other device.
void HostBroadcast(const BufferSet& b, int root, const HostOptions& o = {});
/// out[d] = the reduction over devices of part d (SplitCounts(n, D)) of in[*] (n elements each).
/// out[d] may be exactly in[d] + offset of part d (in place); no other overlap.
void HostReduceScatter(DType dt, std::span<const void* const> in, int64_t n, std::span<void* const> out,
                       ReduceOp op, const HostOptions& o = {});
/// out[d] = in[0] ++ in[1] ++ ... (counts[e] elements from in[e]). in[d] may be exactly the part
/// of out[d] it fills (in place); no other overlap.
void HostAllGather(DType dt, std::span<const void* const> in, std::span<const int64_t> counts,
                   std::span<void* const> out, const HostOptions& o = {});

// ---- GPUs (NCCL) ---------------------------------------------------------------------------------

/// True when this build has the NCCL path (CUDA and NCCL found at configure time).
bool HasNccl();
/// The same four collectives over `devices` (distinct GPUs, in device order), through the GPU
/// platform (gpu.h): NCCL on CUDA, with a communicator
/// per device set created on first use and cached. Each enqueues on a per-device NCCL stream and
/// waits for it before returning. Throw DeviceError in builds without NCCL.
void NcclAllReduce(std::span<const Device> devices, const BufferSet& b, ReduceOp op);
void NcclBroadcast(std::span<const Device> devices, const BufferSet& b, int root);
void NcclReduceScatter(std::span<const Device> devices, DType dt, std::span<const void* const> in, int64_t n,
                       std::span<void* const> out, ReduceOp op);
void NcclAllGather(std::span<const Device> devices, DType dt, std::span<const void* const> in,
                   std::span<const int64_t> counts, std::span<void* const> out);

} // namespace kiln::coll
