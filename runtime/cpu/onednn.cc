// The oneDNN path of the neural-network kernels (onednn.h), in five parts:
//   1. one engine for the process, one stream and growable scratch buffers per thread;
//   2. an LRU cache of primitives keyed by (op, dtype, shapes, attributes), so a repeated call
//      costs a hash lookup instead of a primitive-descriptor creation;
//   3. memory descriptors: plain row-major layouts; a transposed matmul operand is described by
//      its strides, never copied; broadcast batch dims are dims of size 1. Convolutions with a
//      few input channels or more run channels-last, their operands reordered on each call;
//   4. the entry points: trivial (empty) cases, the hand-written kernels of direct_nn.h where
//      they apply, then oneDNN for float32/bfloat16, and the plain loops of reference_nn.cc for
//      other dtypes or where oneDNN has no kernel for the dtype;
//   5. matmul and conv2d with an elementwise epilogue (post-ops), and its fallback loop.
// Primitives use a user-provided scratchpad so one cached primitive can run on several threads.
#include "kiln/runtime/cpu/onednn.h"

#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/cpu/direct_nn.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/error.h"

namespace kiln::host {

namespace {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;
using prop = dnnl::prop_kind;
using alg = dnnl::algorithm;

// ---- 1. engine, streams, buffers ----------------------------------------------------------------

dnnl::engine& Engine() {
  static auto* e = new dnnl::engine(dnnl::engine::kind::cpu, 0); // leaked: workers outlive statics
  return *e;
}

/// The calling thread's stream; on first use it also caps the thread's OpenMP team, which is
/// what oneDNN parallelizes over, at NumThreads() (KILN_NUM_THREADS).
dnnl::stream& Stream() {
  thread_local dnnl::stream s = [] {
    omp_set_num_threads(NumThreads());
    return dnnl::stream(Engine());
  }();
  return s;
}

/// Per-thread 64-byte aligned buffers that only grow: scratchpad, workspace, a temporary, and
/// one per argument that a primitive takes in another layout than the caller's.
enum Slot { kScratchpad, kWorkspace, kTemp, kArg0, kMaxArgs = 8, kNumSlots = kArg0 + kMaxArgs };
void* Buffer(Slot slot, size_t bytes) {
  struct Buf {
    void* p = nullptr;
    size_t n = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf bufs[kNumSlots];
  Buf& b = bufs[slot];
  if (b.n < bytes) {
    std::free(b.p);
    b.n = (bytes + 4095) / 4096 * 4096;
    b.p = std::aligned_alloc(64, b.n);
    KILN_CHECK(b.p) << "out of memory allocating a " << b.n << "-byte oneDNN buffer";
  }
  return b.p;
}

/// A ready-to-run primitive and the descriptors of the arguments callers pass, in their order.
struct Prim {
  dnnl::primitive prim;
  std::vector<std::pair<int, memory::desc>> args;
  memory::desc scratchpad, workspace; // zero-sized when unused
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
  return p;
}

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

bool IsOutput(int arg) {
  return arg == DNNL_ARG_DST || arg == DNNL_ARG_DIFF_SRC || arg == DNNL_ARG_DIFF_WEIGHTS;
}

/// Runs p on the buffers `ptrs` (in the order of p.args) with the thread's scratchpad and
/// workspace. CPU primitives run synchronously, so the buffers may be reused at once.
void Run(const Prim& p, void* const* ptrs) {
  std::unordered_map<int, memory> args;
  for (size_t i = 0; i < p.args.size(); ++i)
    args.emplace(p.args[i].first, memory(p.args[i].second, Engine(), ptrs[i]));
  if (size_t n = p.scratchpad.get_size())
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(p.scratchpad, Engine(), Buffer(kScratchpad, n)));
  if (size_t n = p.workspace.get_size())
    args.emplace(DNNL_ARG_WORKSPACE, memory(p.workspace, Engine(), Buffer(kWorkspace, n)));
  p.prim.execute(Stream(), args);
}

// `work`: multiply-adds (or elements) the primitive does. Below a few hundred thousand, waking
// the OpenMP team costs more than it saves: such calls run on the calling thread alone.
void Execute(const Prim& p, const std::vector<void*>& ptrs, int64_t work = INT64_MAX) {
  constexpr int64_t kSerialWork = 1 << 18;
  KILN_CHECK(p.reorders.size() <= kMaxArgs) << "a oneDNN primitive with " << p.reorders.size() << " arguments";
  if (work < kSerialWork) omp_set_num_threads(1);
  const std::vector<void*>& caller = ptrs;
  std::vector<void*> mine(ptrs); // mine: temporaries where an argument is reordered
  for (size_t i = 0; i < p.reorders.size(); ++i) {
    if (!p.reorders[i]) continue;
    mine[i] = Buffer(Slot(kArg0 + i), p.args[i].second.get_size());
    void* io[] = {caller[i], mine[i]};
    if (!IsOutput(p.args[i].first)) Run(*p.reorders[i], io);
  }
  Run(p, mine.data());
  for (size_t i = 0; i < p.reorders.size(); ++i) {
    void* io[] = {mine[i], caller[i]};
    if (p.reorders[i] && IsOutput(p.args[i].first)) Run(*p.reorders[i], io);
  }
  Stream().wait();
  if (work < kSerialWork) omp_set_num_threads(NumThreads());
}

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
  std::shared_ptr<Prim> Get(const Key& key, const std::function<std::shared_ptr<Prim>()>& make) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = map_.find(key); it != map_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        ++stats_.hits;
        return it->second->second;
      }
    }
    std::shared_ptr<Prim> p = make();
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.misses;
    // oneDNN builds static state lazily with its first primitive of a kind; queued work must
    // finish before that state is destroyed at exit.
    if (uint64_t bit = uint64_t{1} << (key[0] & 63); !(kinds_seen_ & bit)) {
      kinds_seen_ |= bit;
      engine::DrainBeforeExit();
    }
    if (auto it = map_.find(key); it != map_.end()) return it->second->second; // made twice; keep one
    lru_.emplace_front(key, p);
    map_.emplace(key, lru_.begin());
    if (lru_.size() > kCapacity) {
      map_.erase(lru_.back().first);
      lru_.pop_back();
    }
    stats_.size = static_cast<int64_t>(lru_.size());
    return p;
  }
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

PrimitiveCache& Cache() {
  static auto* c = new PrimitiveCache(); // leaked like the engine
  return *c;
}

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

void Append(Key& k, const Shape& s) {
  k.push_back(s.rank());
  k.insert(k.end(), s.begin(), s.end());
}

// ---- 3. memory descriptors ----------------------------------------------------------------------

/// The oneDNN type of a dtype kiln runs on oneDNN; false for the others.
bool OneDnnType(DType t, dt* out) {
  switch (t) {
  case DType::kFloat32: *out = dt::f32; return true;
  case DType::kBFloat16: *out = dt::bf16; return true;
  default: return false;
  }
}

memory::dims Dims(const Shape& s) { return memory::dims(s.begin(), s.end()); }

memory::desc Plain(const Shape& s, dt t) {
  static const tag tags[] = {tag::undef, tag::a, tag::ab, tag::abc, tag::abcd};
  KILN_CHECK(s.rank() >= 1 && s.rank() <= 4) << s.str();
  return memory::desc(Dims(s), t, tags[s.rank()]);
}

/// A matmul operand stored row-major as `s`, seen with rank `r` (leading dims of size 1) and the
/// last two dims swapped when `transposed`.
memory::desc MatmulOperand(const Shape& s, int r, bool transposed, dt t) {
  Shape padded;
  for (int i = s.rank(); i < r; ++i) padded.push_back(1);
  for (int64_t d : s) padded.push_back(d);
  Strides st = padded.ContiguousStrides();
  memory::dims dims = Dims(padded), strides = Dims(st);
  if (transposed) {
    std::swap(dims[r - 2], dims[r - 1]);
    std::swap(strides[r - 2], strides[r - 1]);
  }
  return memory::desc(dims, t, strides);
}

/// Weights (O, I/groups, KH, KW) as oneDNN wants them: (G, O/G, I/G, KH, KW) when grouped.
memory::desc ConvWeights(const Shape& w, int64_t groups, dt t) {
  if (groups == 1) return Plain(w, t);
  return memory::desc({groups, w[0] / groups, w[1], w[2], w[3]}, t, tag::goihw);
}

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
bool TryChannelsLast(ConvOp op, const Shape& w) { return w[1] >= (op == ConvOp::kData ? 4 : 2); }

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
                                                        const dnnl::primitive_attr* attr = nullptr) {
  ConvGeometry g(p);
  ConvDescs m(x, w, y, p, t, l);
  auto d = bias ? dnnl::convolution_forward::desc(kind, alg::convolution_direct, m.x, m.w, *bias, m.y, g.strides,
                                                  g.dilates, g.pad_l, g.pad_r)
                : dnnl::convolution_forward::desc(kind, alg::convolution_direct, m.x, m.w, m.y, g.strides,
                                                  g.dilates, g.pad_l, g.pad_r);
  return {d, attr ? *attr : UserScratchpad(), Engine()};
}

std::shared_ptr<Prim> Reorder(const memory::desc& from, const memory::desc& to) {
  dnnl::reorder::primitive_desc pd(Engine(), from, Engine(), to, UserScratchpad());
  return MakePrim<dnnl::reorder>(pd, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
}

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
                                                    alg a, dt t, prop kind) {
  PoolGeometry g(p);
  dnnl::pooling_forward::desc d(kind, a, Plain(x, t), Plain(y, t), g.strides, g.kernel, g.pad_l, g.pad_r);
  return {d, UserScratchpad(), Engine()};
}

alg AvgAlgorithm(const Pool2dParams& p) {
  return p.count_include_pad ? alg::pooling_avg_include_padding : alg::pooling_avg_exclude_padding;
}

Key ConvKey(Kind kind, dt t, const Shape& a, const Shape& b, const Shape& c, const Conv2dParams& p) {
  Key k{static_cast<int64_t>(kind),
        static_cast<int64_t>(t),
        p.stride[0],
        p.stride[1],
        p.padding[0],
        p.padding[1],
        p.dilation[0],
        p.dilation[1],
        p.groups};
  Append(k, a);
  Append(k, b);
  Append(k, c);
  return k;
}

Key PoolKey(Kind kind, dt t, const Shape& x, const Shape& y, const Pool2dParams& p) {
  Key k{static_cast<int64_t>(kind),
        static_cast<int64_t>(t),
        p.kernel[0],
        p.kernel[1],
        p.stride[0],
        p.stride[1],
        p.padding[0],
        p.padding[1],
        p.count_include_pad};
  Append(k, x);
  Append(k, y);
  return k;
}

// ---- 4. entry points ----------------------------------------------------------------------------

/// Checks the contiguity kernels rely on; true (after zero-filling `out` where the result is a sum
/// over nothing) when there is nothing to compute.
bool Trivial(const TensorView& out, std::initializer_list<const TensorView*> ins) {
  KILN_CHECK(out.is_contiguous()) << "NN kernels write contiguous outputs";
  for (const TensorView* v : ins) KILN_CHECK(v->is_contiguous()) << "NN kernels take contiguous inputs";
  if (out.numel() == 0) return true;
  for (const TensorView* v : ins)
    if (v->numel() == 0) {
      Fill(out, 0.0);
      return true;
    }
  return false;
}

} // namespace

OneDnnCacheStats GetOneDnnCacheStats() { return Cache().stats(); }

namespace {
// A few rows times a matrix (a Dense layer at batch 1..4): a streaming pass over b beats
// oneDNN's general matmul, which is tuned for larger M. float32, rank 2, a not transposed.
bool SmallRowsMatmul(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p) {
  if (out.dtype != DType::kFloat32 || a.rank() != 2 || b.rank() != 2 || p.transpose_a) return false;
  const int64_t m = a.shape[0], k = a.shape[1], n = out.shape[1];
  if (m > 4) return false;
  const float* A = static_cast<const float*>(a.data);
  const float* B = static_cast<const float*>(b.data);
  float* C = static_cast<float*>(out.data);
  // Split across threads only when there is enough to do: waking the pool costs tens of us.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(k * m, 1));
  if (p.transpose_b) {  // b is (n, k): each output is a dot product of two contiguous rows
    // Four rows of b at a time: four independent accumulator chains (one would wait on the FMA
    // latency every step) sharing each load of a.
    constexpr int kRows = 4, kLanes = 16;
    ParallelFor(n, grain, [&](int64_t j0, int64_t j1) {
      for (int64_t i = 0; i < m; ++i) {
        const float* ai = A + i * k;
        int64_t j = j0;
        for (; j + kRows <= j1; j += kRows) {
          float acc[kRows][kLanes] = {};
          int64_t t = 0;
          for (; t + kLanes <= k; t += kLanes)
            for (int r = 0; r < kRows; ++r) {
              const float* br = B + (j + r) * k + t;
#pragma omp simd
              for (int l = 0; l < kLanes; ++l) acc[r][l] += ai[t + l] * br[l];
            }
          for (int r = 0; r < kRows; ++r) {
            float sum = 0.f;
            for (int l = 0; l < kLanes; ++l) sum += acc[r][l];
            for (int64_t u = t; u < k; ++u) sum += ai[u] * B[(j + r) * k + u];
            C[i * n + j + r] = sum;
          }
        }
        for (; j < j1; ++j) {
          const float* bj = B + j * k;
          float acc = 0.f;
#pragma omp simd reduction(+ : acc)
          for (int64_t t = 0; t < k; ++t) acc += ai[t] * bj[t];
          C[i * n + j] = acc;
        }
      }
    });
  } else {  // b is (k, n): accumulate rows of b scaled by a's entries
    ParallelFor(n, std::max<int64_t>(64, grain), [&](int64_t j0, int64_t j1) {
      for (int64_t i = 0; i < m; ++i) {
        float* ci = C + i * n;
        for (int64_t j = j0; j < j1; ++j) ci[j] = 0.f;
        for (int64_t t = 0; t < k; ++t) {
          const float at = A[i * k + t];
          const float* bt = B + t * n;
#pragma omp simd
          for (int64_t j = j0; j < j1; ++j) ci[j] += at * bt[j];
        }
      }
    });
  }
  return true;
}
}  // namespace

void Matmul(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p) {
  if (Trivial(out, {&a, &b})) return;
  if (SmallRowsMatmul(a, b, out, p)) return;
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(out.dtype, &t)) {
    Key k{static_cast<int64_t>(Kind::kMatmul), static_cast<int64_t>(t), p.transpose_a, p.transpose_b};
    Append(k, a.shape);
    Append(k, b.shape);
    prim = Cache().Get(k, [&] {
      return TryMake([&] {
        int r = out.rank();
        memory::desc am = MatmulOperand(a.shape, r, p.transpose_a, t);
        memory::desc bm = MatmulOperand(b.shape, r, p.transpose_b, t);
        memory::desc cm = MatmulOperand(out.shape, r, false, t);
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(am, bm, cm), UserScratchpad(), Engine());
        return MakePrim<dnnl::matmul>(pd, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      });
    });
  }
  if (!prim) return reference::Matmul(a, b, out, p);
  int64_t k = a.shape[a.rank() - (p.transpose_a ? 2 : 1)];
  Execute(*prim, {a.data, b.data, out.data}, out.shape.numel() * k);
}

void Conv2d(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p) {
  if (Trivial(y, {&x, &w})) return;
  if (direct::Conv2d(x, w, y, p)) return;
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(y.dtype, &t))
    prim = Cache().Get(ConvKey(Kind::kConv, t, x.shape, w.shape, y.shape, p), [&] {
      return TryMake([&] {
        return ChooseConv(ConvOp::kForward, w.shape, [&](ConvLayout l) {
          auto pd = ConvForwardPD(x.shape, w.shape, y.shape, p, t, prop::forward_inference, l);
          ConvDescs user(x.shape, w.shape, y.shape, p, t, ConvLayout::kPlain);
          return ConvPrim<dnnl::convolution_forward>(pd, l,
                                                     {{DNNL_ARG_SRC, pd.src_desc(), user.x},
                                                      {DNNL_ARG_WEIGHTS, pd.weights_desc(), user.w},
                                                      {DNNL_ARG_DST, pd.dst_desc(), user.y}});
        });
      });
    });
  if (!prim) return reference::Conv2d(x, w, y, p);
  Execute(*prim, {x.data, w.data, y.data});
}

void Conv2dGradData(const TensorView& dy, const TensorView& w, const TensorView& dx, const Conv2dParams& p) {
  if (Trivial(dx, {&dy, &w})) return;
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(dx.dtype, &t))
    prim = Cache().Get(ConvKey(Kind::kConvData, t, dx.shape, w.shape, dy.shape, p), [&] {
      return TryMake([&] {
        return ChooseConv(ConvOp::kData, w.shape, [&](ConvLayout l) {
          auto hint = ConvForwardPD(dx.shape, w.shape, dy.shape, p, t, prop::forward_training, l);
          ConvGeometry g(p);
          ConvDescs m(dx.shape, w.shape, dy.shape, p, t, l);
          ConvDescs user(dx.shape, w.shape, dy.shape, p, t, ConvLayout::kPlain);
          dnnl::convolution_backward_data::desc d(alg::convolution_direct, m.x, m.w, m.y, g.strides,
                                                  g.dilates, g.pad_l, g.pad_r);
          dnnl::convolution_backward_data::primitive_desc pd(d, UserScratchpad(), Engine(), hint);
          return ConvPrim<dnnl::convolution_backward_data>(pd, l,
                                                           {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc(), user.y},
                                                            {DNNL_ARG_WEIGHTS, pd.weights_desc(), user.w},
                                                            {DNNL_ARG_DIFF_SRC, pd.diff_src_desc(), user.x}});
        });
      });
    });
  if (!prim) return reference::Conv2dGradData(dy, w, dx, p);
  Execute(*prim, {dy.data, w.data, dx.data});
}

void Conv2dGradWeight(const TensorView& dy, const TensorView& x, const TensorView& dw,
                      const Conv2dParams& p) {
  if (Trivial(dw, {&dy, &x})) return;
  if (direct::Conv2dGradWeight(dy, x, dw, p)) return;
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(dw.dtype, &t))
    prim = Cache().Get(ConvKey(Kind::kConvWeight, t, x.shape, dw.shape, dy.shape, p), [&] {
      return TryMake([&] {
        return ChooseConv(ConvOp::kWeight, dw.shape, [&](ConvLayout l) {
          auto hint = ConvForwardPD(x.shape, dw.shape, dy.shape, p, t, prop::forward_training, l);
          ConvGeometry g(p);
          ConvDescs m(x.shape, dw.shape, dy.shape, p, t, l);
          ConvDescs user(x.shape, dw.shape, dy.shape, p, t, ConvLayout::kPlain);
          dnnl::convolution_backward_weights::desc d(alg::convolution_direct, m.x, m.w, m.y, g.strides,
                                                     g.dilates, g.pad_l, g.pad_r);
          dnnl::convolution_backward_weights::primitive_desc pd(d, UserScratchpad(), Engine(), hint);
          return ConvPrim<dnnl::convolution_backward_weights>(
              pd, l,
              {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc(), user.y},
               {DNNL_ARG_SRC, pd.src_desc(), user.x},
               {DNNL_ARG_DIFF_WEIGHTS, pd.diff_weights_desc(), user.w}});
        });
      });
    });
  if (!prim) return reference::Conv2dGradWeight(dy, x, dw, p);
  Execute(*prim, {dy.data, x.data, dw.data});
}

void MaxPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p) {
  if (Trivial(y, {&x})) return;
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(y.dtype, &t))
    prim = Cache().Get(PoolKey(Kind::kMaxPool, t, x.shape, y.shape, p), [&] {
      return TryMake([&] {
        auto pd = PoolForwardPD(x.shape, y.shape, p, alg::pooling_max, t, prop::forward_inference);
        return MakePrim<dnnl::pooling_forward>(
            pd, {{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_DST, pd.dst_desc()}});
      });
    });
  if (!prim) return reference::MaxPool2d(x, y, p);
  Execute(*prim, {x.data, y.data});
}

void MaxPool2dGrad(const TensorView& dy, const TensorView& x, const TensorView& dx, const Pool2dParams& p) {
  if (Trivial(dx, {&dy, &x})) return;
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(dx.dtype, &t))
    prim = Cache().Get(PoolKey(Kind::kMaxPoolGrad, t, x.shape, dy.shape, p), [&] {
      return TryMake([&] {
        // oneDNN's max-pool backward reads the forward pass's workspace (where each max was), so
        // the gradient reruns the forward pass in training mode into a temporary first.
        auto fwd = PoolForwardPD(x.shape, dy.shape, p, alg::pooling_max, t, prop::forward_training);
        PoolGeometry g(p);
        dnnl::pooling_backward::desc d(alg::pooling_max, Plain(x.shape, t), Plain(dy.shape, t), g.strides,
                                       g.kernel, g.pad_l, g.pad_r);
        dnnl::pooling_backward::primitive_desc pd(d, UserScratchpad(), Engine(), fwd);
        auto bwd = MakePrim<dnnl::pooling_backward>(
            pd, {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc()}, {DNNL_ARG_DIFF_SRC, pd.diff_src_desc()}});
        bwd->forward = MakePrim<dnnl::pooling_forward>(
            fwd, {{DNNL_ARG_SRC, fwd.src_desc()}, {DNNL_ARG_DST, fwd.dst_desc()}});
        return bwd;
      });
    });
  if (!prim) return reference::MaxPool2dGrad(dy, x, dx, p);
  Execute(*prim->forward, {x.data, Buffer(kTemp, prim->forward->args[1].second.get_size())});
  Execute(*prim, {dy.data, dx.data});
}

void AvgPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p) {
  if (Trivial(y, {&x})) return;
  if (direct::AvgPool2d(x, y, p)) return;
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(y.dtype, &t))
    prim = Cache().Get(PoolKey(Kind::kAvgPool, t, x.shape, y.shape, p), [&] {
      return TryMake([&] {
        auto pd = PoolForwardPD(x.shape, y.shape, p, AvgAlgorithm(p), t, prop::forward_inference);
        return MakePrim<dnnl::pooling_forward>(
            pd, {{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_DST, pd.dst_desc()}});
      });
    });
  if (!prim) return reference::AvgPool2d(x, y, p);
  Execute(*prim, {x.data, y.data});
}

void AvgPool2dGrad(const TensorView& dy, const TensorView& dx, const Pool2dParams& p) {
  if (Trivial(dx, {&dy})) return;
  if (direct::AvgPool2dGrad(dy, dx, p)) return;
  dt t;
  std::shared_ptr<Prim> prim;
  if (OneDnnType(dx.dtype, &t))
    prim = Cache().Get(PoolKey(Kind::kAvgPoolGrad, t, dx.shape, dy.shape, p), [&] {
      return TryMake([&] {
        auto fwd = PoolForwardPD(dx.shape, dy.shape, p, AvgAlgorithm(p), t, prop::forward_training);
        PoolGeometry g(p);
        dnnl::pooling_backward::desc d(AvgAlgorithm(p), Plain(dx.shape, t), Plain(dy.shape, t), g.strides,
                                       g.kernel, g.pad_l, g.pad_r);
        dnnl::pooling_backward::primitive_desc pd(d, UserScratchpad(), Engine(), fwd);
        return MakePrim<dnnl::pooling_backward>(
            pd, {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc()}, {DNNL_ARG_DIFF_SRC, pd.diff_src_desc()}});
      });
    });
  if (!prim) return reference::AvgPool2dGrad(dy, dx, p);
  Execute(*prim, {dy.data, dx.data});
}

// ---- 5. epilogues ---------------------------------------------------------------------------------

bool EpilogueSupports(UnaryFn f) {
  switch (f) {
  case UnaryFn::kRelu: case UnaryFn::kTanh: case UnaryFn::kNeg: case UnaryFn::kAbs: case UnaryFn::kSquare:
  case UnaryFn::kSqrt: case UnaryFn::kExp: case UnaryFn::kLog: return true;
  default: return false;
  }
}

bool EpilogueSupports(BinaryFn f) {
  switch (f) {
  case BinaryFn::kAdd: case BinaryFn::kSub: case BinaryFn::kMul: case BinaryFn::kDiv: case BinaryFn::kMaximum:
  case BinaryFn::kMinimum: return true;
  default: return false;
  }
}

namespace {

/// ApplyEpilogue over all of `y`, split across threads; steps from `first` on.
void ApplyEpilogueAll(const TensorView& y, int64_t inner, int64_t channels, const Epilogue& all,
                      std::span<const TensorView> operands, size_t first = 0) {
  if (first == all.steps.size()) return;
  Epilogue rest;
  if (first) rest.steps.assign(all.steps.begin() + static_cast<ptrdiff_t>(first), all.steps.end());
  const Epilogue& e = first ? rest : all;
  float* py = y.ptr<float>();
  ParallelFor(y.numel(), int64_t{1} << 15,
              [&](int64_t b, int64_t end) { ApplyEpilogue(py, b, end, inner, channels, e, operands); });
}

/// A first per-channel add is the primitive's bias argument.
bool BiasStep(const Epilogue& e) {
  return !e.steps.empty() && e.steps[0].kind == EpilogueStep::kBinary && e.steps[0].binary == BinaryFn::kAdd &&
         e.steps[0].per_channel;
}

alg EltwiseAlg(UnaryFn f, float* alpha) {
  *alpha = 0.f;
  switch (f) {
  case UnaryFn::kRelu: return alg::eltwise_relu;
  case UnaryFn::kTanh: return alg::eltwise_tanh;
  case UnaryFn::kNeg: *alpha = -1.f; return alg::eltwise_linear;
  case UnaryFn::kAbs: return alg::eltwise_abs;
  case UnaryFn::kSquare: return alg::eltwise_square;
  case UnaryFn::kSqrt: return alg::eltwise_sqrt;
  case UnaryFn::kExp: return alg::eltwise_exp;
  case UnaryFn::kLog: return alg::eltwise_log;
  default: KILN_CHECK(false) << "epilogue: unsupported unary function " << static_cast<int>(f); return alg::undef;
  }
}

alg BinaryAlg(BinaryFn f) {
  switch (f) {
  case BinaryFn::kAdd: return alg::binary_add;
  case BinaryFn::kSub: return alg::binary_sub;
  case BinaryFn::kMul: return alg::binary_mul;
  case BinaryFn::kDiv: return alg::binary_div;
  case BinaryFn::kMaximum: return alg::binary_max;
  case BinaryFn::kMinimum: return alg::binary_min;
  default: KILN_CHECK(false) << "epilogue: unsupported binary function " << static_cast<int>(f); return alg::undef;
  }
}

memory::desc Contiguous(const Shape& s, dt t) { return memory::desc(Dims(s), t, Dims(s.ContiguousStrides())); }

/// The epilogue as oneDNN attributes: the bias descriptor (when the first step is one), the
/// post-ops, and the binary post-ops' arguments (id, the primitive's layout, the caller's).
struct PostOps {
  dnnl::primitive_attr attr = UserScratchpad();
  std::optional<memory::desc> bias;
  ArgDescs binaries;
  size_t steps = 0;  ///< the epilogue's first `steps` steps are these; the others run after the primitive
};

/// `conv`: bias of shape (C); else (matmul) of out's rank. `channels_last`: the primitive's
/// output is NHWC, and so are its full-shape binary operands (reordered on each call).
PostOps MakePostOps(const Epilogue& e, const Shape& out, int channel_axis, bool conv, bool channels_last) {
  PostOps r;
  const int64_t channels = out[channel_axis];
  Shape per_channel;
  for (int d = 0; d < out.rank(); ++d) per_channel.push_back(d == channel_axis ? channels : 1);
  size_t first = 0;
  if (BiasStep(e)) {
    r.bias = conv ? memory::desc({channels}, dt::f32, tag::a) : Contiguous(per_channel, dt::f32);
    first = 1;
  }
  dnnl::post_ops po;
  // oneDNN 2.6's x64 kernels give every eltwise post-op of one algorithm the first one's alpha and
  // beta (sigmoid's 0.5 * x, tanh, 0.5 * x + 0.5 came out without the last + 0.5): an algorithm
  // seen before with other parameters ends the post-ops there, and a run of linear steps is one,
  // a1 * (a0 * x + b0) + b1, within an ulp or two of the steps one by one.
  std::vector<std::tuple<alg, float, float>> eltwise;
  auto append_eltwise = [&](alg a, float alpha, float beta) {
    for (const auto& [a0, alpha0, beta0] : eltwise)
      if (a0 == a && (alpha0 != alpha || beta0 != beta)) return false;
    eltwise.emplace_back(a, alpha, beta);
    po.append_eltwise(1.f, a, alpha, beta);
    return true;
  };
  size_t k = first;
  for (bool ok = true; ok && k < e.steps.size(); k += ok) {
    const EpilogueStep& s = e.steps[k];
    switch (s.kind) {
    case EpilogueStep::kUnary: {
      float alpha;
      alg a = EltwiseAlg(s.unary, &alpha);
      ok = append_eltwise(a, alpha, 0.f);
      break;
    }
    case EpilogueStep::kLinear: {
      float alpha = s.alpha, beta = s.beta;
      size_t last = k;
      for (; last + 1 < e.steps.size() && e.steps[last + 1].kind == EpilogueStep::kLinear; ++last) {
        const EpilogueStep& next = e.steps[last + 1];
        alpha *= next.alpha;
        beta = next.alpha * beta + next.beta;
      }
      ok = append_eltwise(alg::eltwise_linear, alpha, beta);
      if (ok) k = last;
      break;
    }
    case EpilogueStep::kBinary: {
      memory::desc user = Contiguous(s.per_channel ? per_channel : out, dt::f32);
      memory::desc mine = channels_last && !s.per_channel ? memory::desc(Dims(out), dt::f32, tag::nhwc) : user;
      r.binaries.emplace_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(po.len()) | DNNL_ARG_SRC_1, mine, user);
      po.append_binary(BinaryAlg(s.binary), mine);
      break;
    }
    }
  }
  r.steps = k;
  r.attr.set_post_ops(po);
  return r;
}

void AppendEpilogue(Key& k, const Epilogue& e) {
  k.push_back(-1);  // after the shapes: no key without an epilogue ends this way
  for (const EpilogueStep& s : e.steps) {
    uint32_t alpha, beta;
    std::memcpy(&alpha, &s.alpha, 4);
    std::memcpy(&beta, &s.beta, 4);
    k.insert(k.end(), {s.kind, static_cast<int64_t>(s.unary), static_cast<int64_t>(s.binary), s.per_channel,
                       static_cast<int64_t>(alpha), static_cast<int64_t>(beta)});
  }
}

/// The buffers of the primitive's arguments after (src, weights, dst): bias, then binary operands
/// of the steps it applies.
void AppendOperands(std::vector<void*>& ptrs, const Prim& prim, const Epilogue& e,
                    std::span<const TensorView> operands) {
  for (size_t k = 0; k < prim.epilogue_steps; ++k)
    if (e.steps[k].kind == EpilogueStep::kBinary) {
      const TensorView& o = operands[static_cast<size_t>(e.steps[k].operand)];
      KILN_CHECK(o.dtype == DType::kFloat32 && o.is_contiguous()) << "epilogue operands are contiguous float32";
      ptrs.push_back(o.data);
    }
}

TensorView Images(const TensorView& t, int64_t n0, int64_t n1) {
  TensorView s = t;
  s.data = t.ptr<float>() + n0 * (t.numel() / t.shape[0]);
  s.shape[0] = n1 - n0;
  s.strides = s.shape.ContiguousStrides();
  return s;
}

/// The hand-written convolution image by image, each image's epilogue run while its output is in
/// cache; false when that kernel does not handle the case.
bool DirectConv2d(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p,
                  const Epilogue& e, std::span<const TensorView> operands) {
  const int64_t n = x.shape[0], per_image = y.numel() / n, inner = y.shape[2] * y.shape[3], c = y.shape[1];
  if (!direct::Conv2d(Images(x, 0, 1), w, Images(y, 0, 1), p)) return false;
  ApplyEpilogue(y.ptr<float>(), 0, per_image, inner, c, e, operands);
  ParallelFor(n - 1, 1, [&](int64_t b, int64_t end) {
    for (int64_t i = b + 1; i < end + 1; ++i) {
      direct::Conv2d(Images(x, i, i + 1), w, Images(y, i, i + 1), p);
      ApplyEpilogue(y.ptr<float>(), i * per_image, (i + 1) * per_image, inner, c, e, operands);
    }
  });
  return true;
}

} // namespace

void MatmulEpilogue(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p,
                    const Epilogue& e, std::span<const TensorView> operands) {
  KILN_CHECK(out.dtype == DType::kFloat32) << "matmul epilogues are float32";
  const int r = out.rank();
  const int64_t channels = out.shape[r - 1];
  // A few rows (the streaming kernel) or nothing to compute: the epilogue after the product.
  const bool small = a.rank() == 2 && b.rank() == 2 && !p.transpose_a && a.shape[0] <= 4;
  std::shared_ptr<Prim> prim;
  if (!small && out.numel() > 0 && a.numel() > 0 && b.numel() > 0) {
    KILN_CHECK(out.is_contiguous() && a.is_contiguous() && b.is_contiguous()) << "NN kernels take contiguous operands";
    Key k{static_cast<int64_t>(Kind::kMatmul), static_cast<int64_t>(dt::f32), p.transpose_a, p.transpose_b};
    Append(k, a.shape);
    Append(k, b.shape);
    AppendEpilogue(k, e);
    prim = Cache().Get(k, [&] {
      return TryMake([&] {
        memory::desc am = MatmulOperand(a.shape, r, p.transpose_a, dt::f32);
        memory::desc bm = MatmulOperand(b.shape, r, p.transpose_b, dt::f32);
        memory::desc cm = MatmulOperand(out.shape, r, false, dt::f32);
        PostOps po = MakePostOps(e, out.shape, r - 1, false, false);
        auto d = po.bias ? dnnl::matmul::desc(am, bm, *po.bias, cm) : dnnl::matmul::desc(am, bm, cm);
        dnnl::matmul::primitive_desc pd(d, po.attr, Engine());
        std::vector<std::pair<int, memory::desc>> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
        if (po.bias) args.emplace_back(DNNL_ARG_BIAS, *po.bias);
        for (const auto& [arg, md, user] : po.binaries) args.emplace_back(arg, md);
        auto prim = MakePrim<dnnl::matmul>(pd, std::move(args));
        prim->epilogue_steps = po.steps;
        return prim;
      });
    });
  }
  if (!prim) {
    Matmul(a, b, out, p);
    return ApplyEpilogueAll(out, 1, channels, e, operands);
  }
  std::vector<void*> ptrs{a.data, b.data, out.data};
  AppendOperands(ptrs, *prim, e, operands);
  Execute(*prim, ptrs, out.shape.numel() * a.shape[a.rank() - (p.transpose_a ? 2 : 1)]);
  ApplyEpilogueAll(out, 1, channels, e, operands, prim->epilogue_steps);
}

void Conv2dEpilogue(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p,
                    const Epilogue& e, std::span<const TensorView> operands) {
  KILN_CHECK(y.dtype == DType::kFloat32) << "conv2d epilogues are float32";
  const int64_t inner = y.shape[2] * y.shape[3], channels = y.shape[1];
  if (Trivial(y, {&x, &w})) return ApplyEpilogueAll(y, inner, channels, e, operands);
  if (DirectConv2d(x, w, y, p, e, operands)) return;
  std::shared_ptr<Prim> prim;
  Key key = ConvKey(Kind::kConv, dt::f32, x.shape, w.shape, y.shape, p);
  AppendEpilogue(key, e);
  prim = Cache().Get(key, [&] {
    return TryMake([&] {
      return ChooseConv(ConvOp::kForward, w.shape, [&](ConvLayout l) {
        PostOps po = MakePostOps(e, y.shape, 1, true, l == ConvLayout::kChannelsLast);
        auto pd = ConvForwardPD(x.shape, w.shape, y.shape, p, dt::f32, prop::forward_inference, l,
                                po.bias ? &*po.bias : nullptr, &po.attr);
        ConvDescs user(x.shape, w.shape, y.shape, p, dt::f32, ConvLayout::kPlain);
        ArgDescs args{{DNNL_ARG_SRC, pd.src_desc(), user.x},
                      {DNNL_ARG_WEIGHTS, pd.weights_desc(), user.w},
                      {DNNL_ARG_DST, pd.dst_desc(), user.y}};
        if (po.bias) args.emplace_back(DNNL_ARG_BIAS, *po.bias, *po.bias);
        args.insert(args.end(), po.binaries.begin(), po.binaries.end());
        auto prim = ConvPrim<dnnl::convolution_forward>(pd, l, args);
        if (prim) prim->epilogue_steps = po.steps;
        return prim;
      });
    });
  });
  if (!prim) {
    Conv2d(x, w, y, p);
    return ApplyEpilogueAll(y, inner, channels, e, operands);
  }
  std::vector<void*> ptrs{x.data, w.data, y.data};
  AppendOperands(ptrs, *prim, e, operands);
  Execute(*prim, ptrs);
  ApplyEpilogueAll(y, inner, channels, e, operands, prim->epilogue_steps);
}

} // namespace kiln::host
