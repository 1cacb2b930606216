// The oneDNN engine, per-thread streams and buffers, the primitive cache and the memory
// descriptors (sections 1-3 of onednn_prim.h).
#include <omp.h>

#include <cstdlib>
#include <cstring>

#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/engine.h"
#include "onednn_prim.h"

namespace kiln::host::onednn {

// ---- 1. engine, streams, buffers ----------------------------------------------------------------

dnnl::engine& Engine() {
  static auto* e = new dnnl::engine(dnnl::engine::kind::cpu, 0); // leaked: workers outlive statics
  return *e;
}

dnnl::stream& Stream() {
  thread_local dnnl::stream s = [] {
    omp_set_num_threads(NumThreads());
    return dnnl::stream(Engine());
  }();
  return s;
}

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
    b.p = nullptr, b.n = 0;
    CheckAllocationSize(bytes, "cpu");
    size_t n = (bytes + 4095) / 4096 * 4096;
    b.p = std::aligned_alloc(64, n);
    if (!b.p)
      KILN_THROW(MemoryError) << "out of memory on cpu allocating " << n << " bytes for a oneDNN buffer; free "
                              << "tensors or use smaller batches";
    b.n = n;
  }
  return b.p;
}

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

bool IsOutput(int arg) {
  return arg == DNNL_ARG_DST || arg == DNNL_ARG_DIFF_SRC || arg == DNNL_ARG_DIFF_WEIGHTS;
}

// Memory from the CPU pool for the length of one primitive call. Scratchpads and the temporaries
// of reordered arguments come from there, not from buffers each thread keeps at the largest size
// it ever needed: a temporary is given back as soon as the call ends, so the next layer (on any
// thread) reuses it and the activations share the same memory. (Measured: ResNet-18 training at
// batch 256 kept about 1 GB in per-thread buffers.) The workspace stays per-thread: max-pooling's
// backward reads the one its forward rerun wrote.
class PoolTemp {
 public:
  explicit PoolTemp(size_t n = 0) { Reset(n); }
  ~PoolTemp() { Reset(0); }
  PoolTemp(const PoolTemp&) = delete;
  PoolTemp& operator=(const PoolTemp&) = delete;
  void* Reset(size_t n) {
    if (p_) GetAllocator(cpu()).Free(p_, n_);
    p_ = nullptr, n_ = 0;
    if (n) p_ = GetAllocator(cpu()).Allocate(n), n_ = n;
    return p_;
  }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// A scratchpad is followed by a guard of kGuardBytes, checked after each call: a primitive that
// writes past the scratchpad it asked for (oneDNN 2.6's strided 1x1 weight gradient did, with
// more than 8 threads, by up to 8.5 KiB at 64 threads: see onednn.cc) then raises an error
// naming it; an overrun within the guard corrupts nothing. Filling and checking 16 KiB costs
// about a microsecond; calls with a scratchpad take tens at least.
constexpr size_t kGuardBytes = 16384;
constexpr unsigned char kGuardByte = 0xA5;

static void CheckGuard(const Prim& p, const unsigned char* guard, size_t scratch_bytes) {
  static const auto* pattern = [] {
    auto* b = new unsigned char[kGuardBytes];
    std::memset(b, kGuardByte, kGuardBytes);
    return b;
  }();
  if (std::memcmp(guard, pattern, kGuardBytes) == 0) return;
  size_t first = 0;
  while (guard[first] == kGuardByte) ++first;
  size_t last = first;
  for (size_t i = first; i < kGuardBytes; ++i)
    if (guard[i] != kGuardByte) last = i;
  KILN_THROW(InternalError) << "oneDNN's " << p.impl << " primitive wrote past the end of its "
                            << scratch_bytes << "-byte scratchpad (bytes " << first << " to " << last
                            << " after it) with " << NumThreads() << " threads; its result cannot be trusted. "
                            << "Run with fewer threads (KILN_NUM_THREADS=8) and report the shapes of this op";
}

void Run(const Prim& p, void* const* ptrs) {
  std::unordered_map<int, memory> args;
  for (size_t i = 0; i < p.args.size(); ++i)
    args.emplace(p.args[i].first, memory(p.args[i].second, Engine(), ptrs[i]));
  const size_t scratch_bytes = p.scratchpad.get_size();
  PoolTemp scratchpad(scratch_bytes ? scratch_bytes + kGuardBytes : 0);
  unsigned char* guard = static_cast<unsigned char*>(scratchpad.get()) + scratch_bytes;
  if (scratchpad.get()) {
    std::memset(guard, kGuardByte, kGuardBytes);
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(p.scratchpad, Engine(), scratchpad.get()));
  }
  if (size_t n = p.workspace.get_size())
    args.emplace(DNNL_ARG_WORKSPACE, memory(p.workspace, Engine(), Buffer(kWorkspace, n)));
  p.prim.execute(Stream(), args);
  if (scratchpad.get()) {
    Stream().wait();  // done with it before it goes back to the pool
    CheckGuard(p, guard, scratch_bytes);
  }
}

void Execute(const Prim& p, const std::vector<void*>& ptrs, int64_t work) {
  constexpr int64_t kSerialWork = 1 << 18;
  KILN_CHECK(p.reorders.size() <= kMaxArgs) << "a oneDNN primitive with " << p.reorders.size() << " arguments";
  struct Team {  // small calls run on the calling thread alone; the team is restored on any exit
    bool serial;
    explicit Team(bool s) : serial(s) {
      if (serial) omp_set_num_threads(1);
    }
    ~Team() {
      if (serial) omp_set_num_threads(NumThreads());
    }
  } team(work < kSerialWork);
  const std::vector<void*>& caller = ptrs;
  std::vector<void*> mine(ptrs); // mine: temporaries where an argument is reordered
  PoolTemp temps[kMaxArgs];
  for (size_t i = 0; i < p.reorders.size(); ++i) {
    if (!p.reorders[i]) continue;
    mine[i] = temps[i].Reset(p.args[i].second.get_size());
    void* io[] = {caller[i], mine[i]};
    if (!IsOutput(p.args[i].first)) Run(*p.reorders[i], io);
  }
  Run(p, mine.data());
  for (size_t i = 0; i < p.reorders.size(); ++i) {
    void* io[] = {mine[i], caller[i]};
    if (p.reorders[i] && IsOutput(p.args[i].first)) Run(*p.reorders[i], io);
  }
  Stream().wait();
}

// ---- 2. primitive cache -------------------------------------------------------------------------

// Many oneDNN kernels fix their thread count when the primitive is made, from the OpenMP team of
// the thread that makes it (omp_get_max_threads() there), and run on that many threads whatever
// the caller's team is then. A thread that has not run a primitive yet has OpenMP's default team
// (one per core), not NumThreads(), and Execute narrows the team to 1 around small calls. So
// every primitive is made with the team at NumThreads(): KILN_NUM_THREADS bounds the threads of
// every call, whichever thread made the primitive first.
static std::shared_ptr<Prim> MakeAtFullTeam(const std::function<std::shared_ptr<Prim>()>& make) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(NumThreads());
  struct Restore {
    int n;
    ~Restore() { omp_set_num_threads(n); }
  } restore{before};
  return make();
}

std::shared_ptr<Prim> PrimitiveCache::Get(const Key& key, const std::function<std::shared_ptr<Prim>()>& make) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = map_.find(key); it != map_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++stats_.hits;
      return it->second->second;
    }
  }
  std::shared_ptr<Prim> p = MakeAtFullTeam(make);
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

PrimitiveCache& Cache() {
  static auto* c = new PrimitiveCache(); // leaked like the engine
  return *c;
}

OneDnnCacheStats CacheStats() { return Cache().stats(); }

void Append(Key& k, const Shape& s) {
  k.push_back(s.rank());
  k.insert(k.end(), s.begin(), s.end());
}

// ---- 3. memory descriptors ----------------------------------------------------------------------

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

memory::desc ConvWeights(const Shape& w, int64_t groups, dt t) {
  if (groups == 1) return Plain(w, t);
  return memory::desc({groups, w[0] / groups, w[1], w[2], w[3]}, t, tag::goihw);
}

dnnl::convolution_forward::primitive_desc ConvForwardPD(const Shape& x, const Shape& w, const Shape& y,
                                                        const Conv2dParams& p, dt t, prop kind,
                                                        ConvLayout l, const memory::desc* bias,
                                                        const dnnl::primitive_attr* attr) {
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

}  // namespace kiln::host::onednn
