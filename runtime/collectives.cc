// Host collectives among CPU devices (see include/kiln/runtime/collectives.h).
//
// CPU devices share one memory, so the ring of reduce-scatter plus all-gather collapses into one
// pass: the flat element range is cut into chunks that kiln's fork-join pool hands to threads;
// the thread that owns a chunk reduces it over every device (its share of the reduce-scatter)
// and writes the result straight to every device (its share of the all-gather). Each element is
// read once per device and written once per device, the least traffic possible, and no thread
// ever waits for another.
//
// Within a chunk, up to four devices are reduced in one fused pass (the device count a template
// argument); more go in blocks that fit L1: the block of device 0 is loaded into an accumulator,
// each further device is folded in with a loop the compiler vectorizes, and the result is stored
// to each output. Elementwise the order is always device 0, 1, 2..., so results
// are bit-identical on every device and independent of chunks, blocks and threads.
#include "kiln/runtime/collectives.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "kiln/runtime/cpu/combine.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/profiler.h"

namespace kiln::coll {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
  case ReduceOp::kSum: return "sum";
  case ReduceOp::kMean: return "mean";
  case ReduceOp::kMax: return "max";
  case ReduceOp::kMin: return "min";
  }
  return "?";
}

ReduceOp ParseReduceOp(std::string_view name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin})
    if (name == ReduceOpName(op)) return op;
  KILN_THROW(ValueError) << "'" << name << "' is not a reduction: expected one of sum, mean, max, min";
}

void CheckReducible(const char* what, DType dt) {
  if (dt == DType::kBool)
    KILN_THROW(DTypeError) << what << ": cannot reduce bool arrays; cast them to int32 or uint8 first";
}

std::vector<int64_t> SplitCounts(int64_t n, int parts) {
  KILN_CHECK(parts > 0 && n >= 0) << "SplitCounts(" << n << ", " << parts << ")";
  std::vector<int64_t> c(static_cast<size_t>(parts), n / parts);
  for (int64_t i = 0; i < n % parts; ++i) ++c[static_cast<size_t>(i)];
  return c;
}

namespace {

constexpr int64_t kBlock = 1024; // elements per accumulator block (8 KB of doubles: stays in L1)

// Calls f(begin, end) over [0, total) in o.chunks pieces (or one per thread of at least o.grain).
template <class F> void ForChunks(int64_t total, const HostOptions& o, F&& f) {
  if (total <= 0) return;
  int64_t chunks = o.chunks > 0 ? o.chunks
                                : std::min<int64_t>(host::NumThreads(),
                                                    (total + o.grain - 1) / std::max<int64_t>(o.grain, 1));
  chunks = std::clamp<int64_t>(chunks, 1, total);
  if (chunks == 1) return f(int64_t{0}, total);
  host::RunChunks(chunks, [&](int64_t c) { f(total * c / chunks, total * (c + 1) / chunks); });
}

// Walks the pieces of [b, e) of a range made of consecutive parts of sizes `counts`:
// f(part, begin within the part, end within the part, offset of the part).
template <class F> void ForParts(std::span<const int64_t> counts, int64_t b, int64_t e, F&& f) {
  int64_t off = 0;
  for (size_t k = 0; k < counts.size() && off < e; off += counts[k], ++k) {
    int64_t lo = std::max(b, off), hi = std::min(e, off + counts[k]);
    if (lo < hi) f(k, lo - off, hi - off, off);
  }
}

// Values combine as every reduction of the runtime does (cpu/combine.h).
using host::MaxOp;
using host::MinOp;
using host::SumOp;

// out[m][j] = op over d of in[d][j] (device order), for j in [0, n); divides by D for mean.
template <class T, class Op>
void ReduceRun(int D, const T* const* in, int M, T* const* out, int64_t n, bool mean) {
  using C = compute_t<T>;
  C acc[kBlock];
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t len = std::min(kBlock, n - j0);
    const T* s0 = in[0] + j0;
    for (int64_t j = 0; j < len; ++j) acc[j] = static_cast<C>(s0[j]);
    for (int d = 1; d < D; ++d) {
      const T* s = in[d] + j0;
      for (int64_t j = 0; j < len; ++j) acc[j] = Op::Apply(acc[j], static_cast<C>(s[j]));
    }
    if (mean) {
      const C div = static_cast<C>(D);
      for (int64_t j = 0; j < len; ++j) acc[j] = acc[j] / div;
    }
    for (int m = 0; m < M; ++m) {
      T* o = out[m] + j0;
      for (int64_t j = 0; j < len; ++j) o[j] = static_cast<T>(acc[j]);
    }
  }
}

// The same for a few devices known at compile time, in one pass without the accumulator block:
// the common case, and much faster on two devices. Each element sees the same operations in the
// same order as in ReduceRun, so the two give identical bits. The frontend has checked that no
// two buffers overlap (except an output on exactly its own input), hence ivdep.
template <class T, class Op, int D, int M, bool kMean>
void ReduceFixed(const T* const* in, T* const* out, int64_t n) {
  using C = compute_t<T>;
  const T* s[D];
  T* o[M];
  for (int d = 0; d < D; ++d) s[d] = in[d];
  for (int m = 0; m < M; ++m) o[m] = out[m];
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) {
    C acc = static_cast<C>(s[0][j]);
    for (int d = 1; d < D; ++d) acc = Op::Apply(acc, static_cast<C>(s[d][j]));
    if constexpr (kMean) acc = acc / static_cast<C>(D);
    for (int m = 0; m < M; ++m) o[m][j] = static_cast<T>(acc);
  }
}

template <class T, class Op, int D, bool kMean>
bool TryFixed(int M, const T* const* in, T* const* out, int64_t n) {
  if (M == D)
    ReduceFixed<T, Op, D, D, kMean>(in, out, n);
  else if (M == 1)
    ReduceFixed<T, Op, D, 1, kMean>(in, out, n);
  else
    return false;
  return true;
}

template <class T, class Op, bool kMean>
void ReduceWith(int D, const T* const* in, int M, T* const* out, int64_t n) {
  bool done = false;
  switch (D) {
  case 1: done = TryFixed<T, Op, 1, kMean>(M, in, out, n); break;
  case 2: done = TryFixed<T, Op, 2, kMean>(M, in, out, n); break;
  case 3: done = TryFixed<T, Op, 3, kMean>(M, in, out, n); break;
  case 4: done = TryFixed<T, Op, 4, kMean>(M, in, out, n); break;
  default: break;
  }
  if (!done) ReduceRun<T, Op>(D, in, M, out, n, kMean);
}

template <class T> void Reduce(ReduceOp op, int D, const T* const* in, int M, T* const* out, int64_t n) {
  switch (op) {
  case ReduceOp::kSum: return ReduceWith<T, SumOp, false>(D, in, M, out, n);
  case ReduceOp::kMean: return ReduceWith<T, SumOp, true>(D, in, M, out, n);
  case ReduceOp::kMax: return ReduceWith<T, MaxOp, false>(D, in, M, out, n);
  case ReduceOp::kMin: return ReduceWith<T, MinOp, false>(D, in, M, out, n);
  }
}

template <class T> void AllReduceT(const BufferSet& b, ReduceOp op, const HostOptions& o) {
  const int D = b.devices();
  const size_t K = b.numel.size();
  int64_t total = 0;
  for (int64_t n : b.numel) total += n;
  ForChunks(total, o, [&](int64_t lo, int64_t hi) {
    std::vector<T*> ptrs(static_cast<size_t>(D));
    ForParts(b.numel, lo, hi, [&](size_t k, int64_t pb, int64_t pe, int64_t) {
      for (int d = 0; d < D; ++d) ptrs[d] = static_cast<T*>(b.ptrs[d * K + k]) + pb;
      Reduce<T>(op, D, ptrs.data(), D, ptrs.data(), pe - pb);
    });
  });
}

template <class T>
void ReduceScatterT(std::span<const void* const> in, int64_t n, std::span<void* const> out, ReduceOp op,
                    const HostOptions& o) {
  const int D = static_cast<int>(in.size());
  std::vector<int64_t> counts = SplitCounts(n, D);
  ForChunks(n, o, [&](int64_t lo, int64_t hi) {
    std::vector<const T*> src(static_cast<size_t>(D));
    ForParts(counts, lo, hi, [&](size_t part, int64_t pb, int64_t pe, int64_t off) {
      for (int d = 0; d < D; ++d) src[d] = static_cast<const T*>(in[d]) + off + pb;
      T* dst = static_cast<T*>(out[part]) + pb;
      Reduce<T>(op, D, src.data(), 1, &dst, pe - pb);
    });
  });
}

// The profiler's event of a collective: its name, the bytes of one device's buffers, the devices.
profiler::Args CollArgs(DType dt, int64_t elements, int devices) {
  return profiler::Args("bytes", static_cast<double>(elements) * static_cast<double>(DTypeSize(dt)), "devices", devices);
}
int64_t Elements(const BufferSet& b) {
  int64_t n = 0;
  for (int64_t k : b.numel) n += k;
  return n;
}
int64_t Elements(std::span<const int64_t> counts) {
  int64_t n = 0;
  for (int64_t k : counts) n += k;
  return n;
}

} // namespace

void HostAllReduce(const BufferSet& b, ReduceOp op, const HostOptions& o) {
  KILN_CHECK(b.devices() > 0 && b.ptrs.size() == b.numel.size() * static_cast<size_t>(b.devices()))
      << "HostAllReduce: " << b.ptrs.size() << " buffers for " << b.numel.size() << " tensors";
  CheckReducible("allreduce", b.dtype);
  profiler::Scope event(profiler::kCollective, "allreduce", CollArgs(b.dtype, Elements(b), b.devices()));
  if (b.devices() == 1) return; // every op of one device is the identity
  KILN_DISPATCH_ALL(b.dtype, if constexpr (!std::is_same_v<scalar_t, bool>) AllReduceT<scalar_t>(b, op, o));
}

void HostBroadcast(const BufferSet& b, int root, const HostOptions& o) {
  const int D = b.devices();
  KILN_CHECK(root >= 0 && root < D) << "HostBroadcast: root " << root << " of " << D;
  profiler::Scope event(profiler::kCollective, "broadcast", CollArgs(b.dtype, Elements(b), D));
  const size_t K = b.numel.size(), es = DTypeSize(b.dtype);
  int64_t total = 0;
  for (int64_t n : b.numel) total += n;
  ForChunks(total, o, [&](int64_t lo, int64_t hi) {
    ForParts(b.numel, lo, hi, [&](size_t k, int64_t pb, int64_t pe, int64_t) {
      const char* src = static_cast<const char*>(b.ptrs[root * K + k]) + pb * es;
      for (int d = 0; d < D; ++d) {
        char* dst = static_cast<char*>(b.ptrs[d * K + k]) + pb * es;
        if (dst != src) std::memcpy(dst, src, static_cast<size_t>(pe - pb) * es);
      }
    });
  });
}

void HostReduceInto(DType dt, void* dst, const void* src, int64_t n, ReduceOp op) {
  CheckReducible("reduce", dt);
  if (op == ReduceOp::kMean) op = ReduceOp::kSum;
  KILN_DISPATCH_ALL(dt, if constexpr (!std::is_same_v<scalar_t, bool>) {
    const scalar_t* in[2] = {static_cast<const scalar_t*>(dst), static_cast<const scalar_t*>(src)};
    scalar_t* out[1] = {static_cast<scalar_t*>(dst)};
    Reduce<scalar_t>(op, 2, in, 1, out, n);  // the output is exactly its first input: allowed
  });
}

void HostReduceScatter(DType dt, std::span<const void* const> in, int64_t n, std::span<void* const> out,
                       ReduceOp op, const HostOptions& o) {
  KILN_CHECK(!in.empty() && in.size() == out.size())
      << "HostReduceScatter: " << in.size() << " inputs, " << out.size() << " outputs";
  CheckReducible("reduce_scatter", dt);
  profiler::Scope event(profiler::kCollective, "reduce_scatter", CollArgs(dt, n, static_cast<int>(in.size())));
  KILN_DISPATCH_ALL(dt, if constexpr (!std::is_same_v<scalar_t, bool>)
                            ReduceScatterT<scalar_t>(in, n, out, op, o));
}

void HostAllGather(DType dt, std::span<const void* const> in, std::span<const int64_t> counts,
                   std::span<void* const> out, const HostOptions& o) {
  KILN_CHECK(in.size() == counts.size() && in.size() == out.size())
      << "HostAllGather: " << in.size() << " inputs, " << counts.size() << " counts, " << out.size()
      << " outputs";
  profiler::Scope event(profiler::kCollective, "allgather", CollArgs(dt, Elements(counts), static_cast<int>(in.size())));
  const size_t es = DTypeSize(dt);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  ForChunks(total, o, [&](int64_t lo, int64_t hi) {
    ForParts(counts, lo, hi, [&](size_t part, int64_t pb, int64_t pe, int64_t off) {
      const char* src = static_cast<const char*>(in[part]) + pb * es;
      for (void* o_ : out) {
        char* dst = static_cast<char*>(o_) + (off + pb) * es;
        if (dst != src) std::memcpy(dst, src, static_cast<size_t>(pe - pb) * es);
      }
    });
  });
}

// ---- GPUs: through the platform (NCCL on CUDA, in-process collectives on the simulator) --------

void NcclAllReduce(std::span<const Device> devices, const BufferSet& b, ReduceOp op) {
  profiler::Scope event(profiler::kCollective, "nccl allreduce", CollArgs(b.dtype, Elements(b), b.devices()));
  gpurt::Get().AllReduce(devices, b, op);
}
void NcclBroadcast(std::span<const Device> devices, const BufferSet& b, int root) {
  profiler::Scope event(profiler::kCollective, "nccl broadcast", CollArgs(b.dtype, Elements(b), b.devices()));
  gpurt::Get().Broadcast(devices, b, root);
}
void NcclReduceScatter(std::span<const Device> devices, DType dt, std::span<const void* const> in, int64_t n,
                       std::span<void* const> out, ReduceOp op) {
  profiler::Scope event(profiler::kCollective, "nccl reduce_scatter", CollArgs(dt, n, static_cast<int>(in.size())));
  gpurt::Get().ReduceScatter(devices, dt, in, n, out, op);
}
void NcclAllGather(std::span<const Device> devices, DType dt, std::span<const void* const> in,
                   std::span<const int64_t> counts, std::span<void* const> out) {
  profiler::Scope event(profiler::kCollective, "nccl allgather", CollArgs(dt, Elements(counts), static_cast<int>(in.size())));
  gpurt::Get().AllGather(devices, dt, in, counts, out);
}

} // namespace kiln::coll
