// The oneDNN side of the neural-network kernels (internal to runtime/cpu; see onednn.h for the
// contracts and nn_dispatch.cc for which kernel runs a call):
//   1. one engine for the process, one stream and growable scratch buffers per thread;
//   2. an LRU cache of primitives keyed by (op, dtype, shapes, attributes), so a repeated call
//      costs a hash lookup instead of a primitive-descriptor creation;
//   3. memory descriptors: plain row-major layouts; a transposed matmul operand is described by
//      its strides, never copied; broadcast batch dims are dims of size 1. Convolutions with a
//      few input channels or more run channels-last, their operands reordered on each call;
//   4. per op (declared in onednn_ops.h), the primitive that computes it (onednn.cc), and with
//      an epilogue as post-ops
//      (onednn_epilogue.cc); each returns false (or -1) where oneDNN has no kernel for the case.
// Primitives use a user-provided scratchpad so one cached primitive can run on several threads.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/runtime/cpu/onednn.h"
#include "onednn_ops.h"
#include "kiln/runtime/error.h"

namespace kiln::host::onednn {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;
using prop = dnnl::prop_kind;
using alg = dnnl::algorithm;

// ---- 1. engine, streams, buffers ----------------------------------------------------------------

dnnl::engine& Engine();
/// The calling thread's stream; on first use it also caps the thread's OpenMP team, which is
/// what oneDNN parallelizes over, at NumThreads() (KILN_NUM_THREADS).
dnnl::stream& Stream();
/// Per-thread 64-byte aligned buffers that only grow: scratchpad, workspace, a temporary, and
/// one per argument that a primitive takes in another layout than the caller's.
enum Slot { kScratchpad, kWorkspace, kTemp, kArg0, kMaxArgs = 8, kNumSlots = kArg0 + kMaxArgs };
void* Buffer(Slot slot, size_t bytes);

/// A ready-to-run primitive and the descriptors of the arguments callers pass, in their order.
struct Prim {
  dnnl::primitive prim;
  std::vector<std::pair<int, memory::desc>> args;
  memory::desc scratchpad, workspace; // zero-sized when unused
  std::string impl;                   // oneDNN's implementation, for errors (e.g. "jit_1x1:avx512_core")
  std::shared_ptr<Prim> forward;      // max-pool gradient: the pass that fills the workspace
  /// Per argument (or empty): where the primitive takes the argument in another layout than the
  /// caller's (the channels-last convolutions), the reorder between the two, run into a
  /// per-thread temporary before the primitive (inputs) or out of one after it (outputs).
  std::vector<std::shared_ptr<Prim>> reorders;
  /// Matmul/conv with an epilogue: how many of its steps the primitive applies as post-ops (the
  /// rest run after it, see MakePostOps).
  size_t epilogue_steps = 0;
};

template <class P, class PD>
std::shared_ptr<Prim> MakePrim(const PD& pd, std::vector<std::pair<int, memory::desc>> args) {
  auto p = std::make_shared<Prim>();
  p->prim = P(pd);
  p->args = std::move(args);
  p->scratchpad = pd.scratchpad_desc();
  p->workspace = pd.workspace_desc();
  p->impl = pd.impl_info_str();
  return p;
}

dnnl::primitive_attr UserScratchpad();
bool IsOutput(int arg);
/// Runs p on the buffers `ptrs` (in the order of p.args) with the thread's scratchpad and
/// workspace. CPU primitives run synchronously, so the buffers may be reused at once.
void Run(const Prim& p, void* const* ptrs);
/// Runs p, reordering the arguments it takes in another layout. `work`: multiply-adds (or
/// elements) the primitive does; below a few hundred thousand, waking the OpenMP team costs more
/// than it saves: such calls run on the calling thread alone.
void Execute(const Prim& p, const std::vector<void*>& ptrs, int64_t work = INT64_MAX);

// ---- 2. primitive cache -------------------------------------------------------------------------

using Key = std::vector<int64_t>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull; // FNV-1a over the words
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

class PrimitiveCache {
public:
  /// The cached primitive for `key`, made by `make` on a miss (outside the lock). A null result
  /// (oneDNN has no kernel) is cached too, so the fallback decision is made once.
  std::shared_ptr<Prim> Get(const Key& key, const std::function<std::shared_ptr<Prim>()>& make);
  OneDnnCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

private:
  static constexpr size_t kCapacity = 256;
  std::mutex mu_;
  std::list<std::pair<Key, std::shared_ptr<Prim>>> lru_;
  std::unordered_map<Key, std::list<std::pair<Key, std::shared_ptr<Prim>>>::iterator, KeyHash> map_;
  OneDnnCacheStats stats_;
  uint64_t kinds_seen_ = 0;  // primitive kinds created so far (bit per Kind)
};

PrimitiveCache& Cache();

/// Runs `make`, turning "no implementation for this case" into nullptr (the caller falls back).
template <class F> std::shared_ptr<Prim> TryMake(F&& make) {
  try {
    return make();
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_unimplemented) return nullptr;
    KILN_CHECK(false) << "oneDNN failed to create a primitive: " << e.what();
    return nullptr;
  }
}

enum class Kind : int64_t {
  kMatmul,
  kConv,
  kConvData,
  kConvWeight,
  kMaxPool,
  kMaxPoolGrad,
  kAvgPool,
  kAvgPoolGrad
};

void Append(Key& k, const Shape& s);

// ---- 3. memory descriptors ----------------------------------------------------------------------

/// The oneDNN type of a dtype kiln runs on oneDNN; false for the others.
bool OneDnnType(DType t, dt* out);
memory::dims Dims(const Shape& s);
memory::desc Plain(const Shape& s, dt t);
/// A matmul operand stored row-major as `s`, seen with rank `r` (leading dims of size 1) and the
/// last two dims swapped when `transposed`.
memory::desc MatmulOperand(const Shape& s, int r, bool transposed, dt t);
/// Weights (O, I/groups, KH, KW) as oneDNN wants them: (G, O/G, I/G, KH, KW) when grouped.
memory::desc ConvWeights(const Shape& w, int64_t groups, dt t);

struct ConvGeometry {
  memory::dims strides, dilates, pad_l, pad_r;
  explicit ConvGeometry(const Conv2dParams& p)
      : strides{p.stride[0], p.stride[1]}, dilates{p.dilation[0] - 1,
                                                   p.dilation[1] - 1}, // oneDNN counts the gaps
        pad_l{p.padding[0], p.padding[1]}, pad_r{p.padding[0], p.padding[1]} {}
};

/// The layouts a convolution primitive is asked for. kPlain: the caller's NCHW / OIHW, which
/// oneDNN serves with im2col + GEMM. kChannelsLast: NHWC data and weights in whatever layout
/// oneDNN prefers, which its direct and brgemm kernels serve 1.5-2.2x faster (LeNet's 20->50
/// 5x5 layer at batch 256: 16.0 -> 7.3 ms forward, 15.5 -> 9.5 backward data, 14.2 -> 8.0
/// backward weights on one AVX-512 core) for the price of reordering two operands per call
/// (0.25-0.4 ms each there). Blocked layouts (nChw16c) were slower: 20 and 50 channels pad to
/// 32 and 64.
enum class ConvLayout { kPlain, kChannelsLast };
enum class ConvOp { kForward, kData, kWeight };

/// Whether to try channels-last: with one input channel per group the reorder of the output
/// costs more than it saves, and oneDNN's channels-last backward-data kernel is slow with
/// fewer than four (3 channels, 224x224, 7x7 stride 2: 61 ms against 22 plain).
inline bool TryChannelsLast(ConvOp op, const Shape& w) { return w[1] >= (op == ConvOp::kData ? 4 : 2); }

/// The descriptors of a convolution's data (x), weights (w) and output (y) in layout `l`.
struct ConvDescs {
  memory::desc x, w, y;
  ConvDescs(const Shape& xs, const Shape& ws, const Shape& ys, const Conv2dParams& p, dt t, ConvLayout l) {
    if (l == ConvLayout::kPlain) {
      x = Plain(xs, t), w = ConvWeights(ws, p.groups, t), y = Plain(ys, t);
      return;
    }
    x = memory::desc(Dims(xs), t, tag::nhwc);
    y = memory::desc(Dims(ys), t, tag::nhwc);
    memory::desc plain_w = ConvWeights(ws, p.groups, t);
    w = memory::desc(plain_w.dims(), t, tag::any);
  }
};

/// With `bias` (one value per output channel) and `attr` (post-ops) when given.
dnnl::convolution_forward::primitive_desc ConvForwardPD(const Shape& x, const Shape& w, const Shape& y,
                                                        const Conv2dParams& p, dt t, prop kind,
                                                        ConvLayout l, const memory::desc* bias = nullptr,
                                                        const dnnl::primitive_attr* attr = nullptr);
std::shared_ptr<Prim> Reorder(const memory::desc& from, const memory::desc& to);

/// A convolution primitive over `args` (argument, the primitive's layout, the caller's layout);
/// nullptr when channels-last got no better kernel than the plain layout's (im2col + GEMM, or
/// the reference loops on a CPU without a jit kernel for it).
using ArgDescs = std::vector<std::tuple<int, memory::desc, memory::desc>>;
template <class P, class PD> std::shared_ptr<Prim> ConvPrim(const PD& pd, ConvLayout l, const ArgDescs& args) {
  if (l == ConvLayout::kChannelsLast) {
    std::string impl = pd.impl_info_str();
    if (impl.find("gemm") != std::string::npos || impl.rfind("ref", 0) == 0) return nullptr;
  }
  std::vector<std::pair<int, memory::desc>> mine;
  std::vector<std::shared_ptr<Prim>> reorders;
  for (const auto& [arg, md, user] : args) {
    mine.emplace_back(arg, md);
    reorders.push_back(md == user ? nullptr : IsOutput(arg) ? Reorder(md, user) : Reorder(user, md));
  }
  auto prim = MakePrim<P>(pd, std::move(mine));
  if (std::any_of(reorders.begin(), reorders.end(), [](const auto& r) { return r != nullptr; }))
    prim->reorders = std::move(reorders);
  return prim;
}

/// `make(layout)` for channels-last where that is worth trying and gives a fast kernel, else for
/// the plain layout.
template <class F> std::shared_ptr<Prim> ChooseConv(ConvOp op, const Shape& w, const F& make) {
  if (TryChannelsLast(op, w))
    if (auto p = TryMake([&] { return make(ConvLayout::kChannelsLast); })) return p;
  return make(ConvLayout::kPlain);
}

struct PoolGeometry {
  memory::dims strides, kernel, pad_l, pad_r;
  explicit PoolGeometry(const Pool2dParams& p)
      : strides{p.stride[0], p.stride[1]}, kernel{p.kernel[0], p.kernel[1]},
        pad_l{p.padding[0], p.padding[1]}, pad_r{p.padding[0], p.padding[1]} {}
};

dnnl::pooling_forward::primitive_desc PoolForwardPD(const Shape& x, const Shape& y, const Pool2dParams& p,
                                                    alg a, dt t, prop kind);
alg AvgAlgorithm(const Pool2dParams& p);
Key ConvKey(Kind kind, dt t, const Shape& a, const Shape& b, const Shape& c, const Conv2dParams& p);
Key PoolKey(Kind kind, dt t, const Shape& x, const Shape& y, const Pool2dParams& p);

}  // namespace kiln::host::onednn
