// CPU reduction kernels. A reduction is first brought to a canonical plan: size-1 dims dropped,
// kept dims in output order and reduced dims sorted by stride, each group with neighbours merged
// where memory allows (so a permuted contiguous tensor reduces like a contiguous one). Then one
// of two drivers runs:
//  - row: each output reduces a run of reduced elements; a contiguous run takes a vectorized
//    loop with many independent lanes. With fewer outputs than threads (a full reduction, say)
//    each output's run is split across threads and the partial results combined.
//  - column: the innermost kept dim is contiguous and the reduced dims are outer, so whole rows
//    of the input are accumulated into a block of outputs (vectorized along the outputs), the
//    rows split across threads when there are few blocks.
// Float sums accumulate in float lanes flushed into double every few thousand elements (which
// bounds the error of a float32 sum of 1e7 values near 1e-7), ints in int64. float16/bfloat16
// runs are converted to float in blocks first, so that the conversion vectorizes too.
// Argmax/argmin scan one axis with the same row/column split.
#include "kiln/runtime/cpu/reduce.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "kiln/runtime/cpu/combine.h"
#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/error.h"

namespace kiln::host {

namespace {

constexpr int64_t kGrain = 1 << 15; // elements worth handing to a thread
constexpr int64_t kBlock = 1 << 11; // contiguous lanes are flushed to the wide accumulator this often
constexpr int64_t kRowBlock = 32;   // column driver: rows accumulated in lanes before a flush
constexpr int64_t kColBlock = 4096; // column driver: outputs per task (accumulators stay in L1/L2)
constexpr int64_t kShortRow = 32;   // row driver: shorter contiguous rows are vectorized across rows

template <class T> constexpr bool kIsReal = std::is_floating_point_v<compute_t<T>>;
template <class T> constexpr bool kIs16 = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
/// What kernels read: 16-bit floats are converted to float in blocks first.
template <class T> using Read = std::conditional_t<kIs16<T>, float, T>;

/// Returns p[0, n) as Read<T>: p itself, or `buf` filled with the converted values.
template <class T> const Read<T>* Converted(const T* p, int64_t n, float* buf) {
  if constexpr (!kIs16<T>) {
    return p;
  } else {
    int64_t i = 0;
#if defined(__F16C__)
    if constexpr (std::is_same_v<T, Half>)
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))));
#endif
    for (; i < n; ++i) buf[i] = static_cast<float>(p[i]);
    return buf;
  }
}

// ---- the reductions as policies ---------------------------------------------------------------
// Step folds one value (of the compute type C) into an accumulator. Lane: accumulator of the
// vectorized loops. Wide: accumulator of everything else (across blocks, strided runs, threads).

template <class T, class O, bool kMean> struct SumPolicy {
  using C = compute_t<T>;
  using Lane = std::conditional_t<kIsReal<T>, C, int64_t>;
  using Wide = std::conditional_t<kIsReal<T>, double, int64_t>;
  static Lane Init() { return Lane(0); }
  static Wide WideInit() { return Wide(0); }
  static Lane Step(Lane a, C x) { return a + static_cast<Lane>(x); }
  static Wide WideStep(Wide a, C x) { return a + static_cast<Wide>(x); }
  static Lane Merge(Lane a, Lane b) { return a + b; }
  static Wide WideMerge(Wide a, Wide b) { return a + b; }
  static O Finish(Wide a, int64_t n) {
    if constexpr (kMean)
      return static_cast<O>(static_cast<compute_t<O>>(a / static_cast<double>(n)));
    else
      return static_cast<O>(static_cast<compute_t<O>>(a));
  }
};

template <class T, bool kMax> struct ExtremumPolicy {
  using C = compute_t<T>;
  using Lane = C;
  using Wide = C;
  static C Init() {
    if constexpr (std::is_floating_point_v<C>)
      return kMax ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
    else
      return kMax ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
  }
  static C WideInit() { return Init(); }
  // b wins when it is more extreme or NaN; a NaN already held is never replaced (combine.h).
  static C Merge(C a, C b) { return std::conditional_t<kMax, MaxOp, MinOp>::Apply(a, b); }
  static C Step(C a, C x) { return Merge(a, x); }
  static C WideStep(C a, C x) { return Merge(a, x); }
  static C WideMerge(C a, C b) { return Merge(a, b); }
  static T Finish(C a, int64_t) { return static_cast<T>(a); }
};

// ---- canonical plan ---------------------------------------------------------------------------

struct Group {
  Shape size;
  Strides stride;
  void Add(int64_t n, int64_t s) {
    int r = size.rank();
    if (r > 0 && stride[r - 1] == s * n) { // the previous dim is this one's outer neighbour
      size[r - 1] *= n;
      stride[r - 1] = s;
    } else {
      size.push_back(n);
      stride.push_back(s);
    }
  }
  int rank() const { return size.rank(); }
  int64_t inner_size() const { return size[rank() - 1]; }
  int64_t inner_stride() const { return stride[rank() - 1]; }
};

struct Plan {
  Group kept;    ///< output order
  Group reduced; ///< by decreasing stride; never empty (a (1, 0) dim stands for "nothing")
};

Plan MakePlan(const TensorView& in, std::span<const int> axes) {
  bool is_reduced[kMaxRank] = {};
  for (int a : axes)
    if (a < in.rank()) is_reduced[a] = true;
  Plan p;
  std::vector<std::pair<int64_t, int64_t>> red; // (stride, size)
  for (int i = 0; i < in.rank(); ++i) {
    if (in.shape[i] == 1) continue;
    if (is_reduced[i])
      red.emplace_back(in.strides[i], in.shape[i]);
    else
      p.kept.Add(in.shape[i], in.strides[i]);
  }
  std::stable_sort(red.begin(), red.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (auto [s, n] : red) p.reduced.Add(n, s);
  if (p.reduced.rank() == 0) p.reduced.Add(1, 0);
  return p;
}

/// Walks the dims of a group (all but the `skip_inner` innermost) in row-major order from a
/// flat index, tracking the element offset.
struct Odometer {
  const Group& g;
  int64_t idx[kMaxRank] = {};
  int64_t off = 0;
  Odometer(const Group& grp, int64_t flat, int skip_inner = 0) : g(grp), n_(grp.rank() - skip_inner) {
    for (int d = n_ - 1; d >= 0; --d) {
      idx[d] = flat % g.size[d];
      flat /= g.size[d];
      off += idx[d] * g.stride[d];
    }
  }
  void Next() {
    for (int d = n_ - 1; d >= 0; --d) {
      off += g.stride[d];
      if (++idx[d] < g.size[d]) return;
      off -= g.stride[d] * g.size[d];
      idx[d] = 0;
    }
  }

private:
  int n_;
};

// ---- row driver -------------------------------------------------------------------------------

/// Reduces x[0, n) in kL independent lanes (vectorized); returns the lanes merged.
template <int kL, class P, class S> typename P::Lane ReduceLanes(const S* x, int64_t n) {
  typename P::Lane acc[kL];
  for (int l = 0; l < kL; ++l) acc[l] = P::Init();
  int64_t i = 0;
  for (; i + kL <= n; i += kL)
    for (int l = 0; l < kL; ++l) acc[l] = P::Step(acc[l], static_cast<typename P::C>(x[i + l]));
  for (; i < n; ++i) acc[0] = P::Step(acc[0], static_cast<typename P::C>(x[i]));
  for (int w = kL / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] = P::Merge(acc[l], acc[l + w]);
  return acc[0];
}

template <class P>
constexpr int kLanes = static_cast<int>(256 / sizeof(typename P::Lane)); // four 512-bit registers

template <class T, class P> typename P::Wide ReduceContiguous(const T* x, int64_t n) {
  using W = typename P::Wide;
  static_assert(kBlock % kLanes<P> == 0);
  W total = P::WideInit();
  float buf[kIs16<T> ? kBlock : 1];
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t len = std::min(kBlock, n - b);
    const Read<T>* q = Converted(x + b, len, buf);
    auto part = len < 16          ? ReduceLanes<4, P>(q, len)
                : len < kLanes<P> ? ReduceLanes<16, P>(q, len)
                                  : ReduceLanes<kLanes<P>, P>(q, len);
    total = P::WideMerge(total, static_cast<W>(part));
  }
  return total;
}

template <class T, class P> typename P::Wide ReduceStrided(const T* x, int64_t n, int64_t s) {
  using W = typename P::Wide;
  using C = typename P::C;
  W a0 = P::WideInit(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a0 = P::WideStep(a0, static_cast<C>(x[i * s]));
    a1 = P::WideStep(a1, static_cast<C>(x[(i + 1) * s]));
    a2 = P::WideStep(a2, static_cast<C>(x[(i + 2) * s]));
    a3 = P::WideStep(a3, static_cast<C>(x[(i + 3) * s]));
  }
  for (; i < n; ++i) a0 = P::WideStep(a0, static_cast<C>(x[i * s]));
  return P::WideMerge(P::WideMerge(a0, a1), P::WideMerge(a2, a3));
}

/// Reduces the flattened reduced elements [b, e) of the output whose data starts at `x`.
template <class T, class P> typename P::Wide ReduceRange(const T* x, const Group& r, int64_t b, int64_t e) {
  int64_t len = r.inner_size(), s = r.inner_stride();
  Odometer rows(r, b / len, 1);
  int64_t c = b % len;
  typename P::Wide total = P::WideInit();
  for (int64_t f = b; f < e; c = 0, rows.Next()) {
    int64_t n = std::min(len - c, e - f);
    const T* p = x + rows.off + c * s;
    total = P::WideMerge(total, s == 1 ? ReduceContiguous<T, P>(p, n) : ReduceStrided<T, P>(p, n, s));
    f += n;
  }
  return total;
}

template <class T, class O, class P> void RowDriver(const T* x, const Plan& p, O* out) {
  int64_t m_total = p.kept.size.numel(), n = p.reduced.size.numel();
  int nt = NumThreads();
  int64_t splits = m_total >= nt ? 1 : std::clamp<int64_t>(n / kGrain, 1, nt);
  if (splits == 1) {
    bool one_run = p.reduced.rank() == 1 && p.reduced.stride[0] == 1;
    // Short contiguous rows one after another: too short for lanes within a row.
    bool short_rows = one_run && n < kShortRow && p.kept.rank() == 1 && p.kept.stride[0] == n;
    ParallelFor(m_total, std::max<int64_t>(1, kGrain / n), [&](int64_t b, int64_t e) {
      if (short_rows) { // vectorized across 64 rows at a time (strided loads)
        typename P::Lane acc[64];
        for (int64_t m0 = b; m0 < e; m0 += 64) {
          int64_t rows = std::min<int64_t>(64, e - m0);
          const T* q = x + m0 * n;
          for (int64_t j = 0; j < rows; ++j) acc[j] = P::Init();
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < rows; ++j)
              acc[j] = P::Step(acc[j], static_cast<typename P::C>(q[j * n + i]));
          for (int64_t j = 0; j < rows; ++j)
            out[m0 + j] = P::Finish(static_cast<typename P::Wide>(acc[j]), n);
        }
        return;
      }
      Odometer k(p.kept, b);
      for (int64_t m = b; m < e; ++m, k.Next())
        out[m] = P::Finish(one_run ? ReduceContiguous<T, P>(x + k.off, n)
                                   : ReduceRange<T, P>(x + k.off, p.reduced, 0, n),
                           n);
    });
    return;
  }
  auto part = std::make_unique<typename P::Wide[]>(m_total * splits); // not vector: may be bool
  ParallelFor(m_total * splits, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t m = t / splits, s = t % splits;
      part[t] =
          ReduceRange<T, P>(x + Odometer(p.kept, m).off, p.reduced, n * s / splits, n * (s + 1) / splits);
    }
  });
  for (int64_t m = 0; m < m_total; ++m) {
    typename P::Wide a = part[m * splits];
    for (int64_t s = 1; s < splits; ++s) a = P::WideMerge(a, part[m * splits + s]);
    out[m] = P::Finish(a, n);
  }
}

// ---- column driver ----------------------------------------------------------------------------

/// Splits `cols` into blocks of at most kColBlock outputs, of near-equal width.
struct ColumnBlocks {
  int64_t count, width;
  explicit ColumnBlocks(int64_t cols)
      : count((cols + kColBlock - 1) / kColBlock), width((cols + count - 1) / count) {}
};

template <class T, class O, class P> void ColumnDriver(const T* x, const Plan& p, O* out) {
  using W = typename P::Wide;
  using L = typename P::Lane;
  using C = typename P::C;
  int64_t m_total = p.kept.size.numel(), n = p.reduced.size.numel();
  int64_t cols = p.kept.inner_size();
  ColumnBlocks blk(cols);
  int64_t tasks = m_total / cols * blk.count;
  int nt = NumThreads();
  int64_t work = n * blk.width;
  // Few blocks of outputs: the reduced rows are split across threads too, into partial results.
  int64_t splits = tasks >= nt ? 1 : std::clamp<int64_t>(work / kGrain, 1, (nt + tasks - 1) / tasks);
  auto part = std::make_unique<W[]>(splits > 1 ? m_total * splits : 0); // not vector: W may be bool
  ParallelFor(tasks * splits, std::max<int64_t>(1, kGrain / std::max<int64_t>(work / splits, 1)),
              [&](int64_t b, int64_t e) {
                auto wide = std::make_unique<W[]>(blk.width);
                auto lane = std::make_unique<L[]>(blk.width);
                auto buf = std::make_unique<float[]>(kIs16<T> ? blk.width : 1);
                for (int64_t t = b; t < e; ++t) {
                  int64_t task = t / splits, s = t % splits;
                  int64_t outer = task / blk.count, j0 = task % blk.count * blk.width;
                  int64_t w = std::min(blk.width, cols - j0), first = outer * cols + j0;
                  int64_t rb = n * s / splits, re = n * (s + 1) / splits;
                  const T* base = x + Odometer(p.kept, outer * cols).off + j0;
                  W* a = wide.get();
                  L* l = lane.get();
                  std::fill(a, a + w, P::WideInit());
                  Odometer r(p.reduced, rb);
                  if constexpr (std::is_same_v<L, W>) { // nothing to gain from a narrower accumulator
                    for (int64_t i = rb; i < re; ++i, r.Next()) {
                      const Read<T>* row = Converted(base + r.off, w, buf.get());
                      for (int64_t j = 0; j < w; ++j) a[j] = P::Step(a[j], static_cast<C>(row[j]));
                    }
                  }
                  for (int64_t i0 = rb; !std::is_same_v<L, W> && i0 < re; i0 += kRowBlock) {
                    int64_t i1 = std::min(re, i0 + kRowBlock);
                    std::fill(l, l + w, P::Init());
                    for (int64_t i = i0; i < i1; ++i, r.Next()) {
                      const Read<T>* row = Converted(base + r.off, w, buf.get());
                      for (int64_t j = 0; j < w; ++j) l[j] = P::Step(l[j], static_cast<C>(row[j]));
                    }
                    for (int64_t j = 0; j < w; ++j) a[j] = P::WideMerge(a[j], static_cast<W>(l[j]));
                  }
                  if (splits == 1) {
                    for (int64_t j = 0; j < w; ++j) out[first + j] = P::Finish(a[j], n);
                  } else {
                    std::copy(a, a + w, part.get() + s * m_total + first);
                  }
                }
              });
  for (int64_t m = 0; splits > 1 && m < m_total; ++m) {
    W a = part[m];
    for (int64_t s = 1; s < splits; ++s) a = P::WideMerge(a, part[s * m_total + m]);
    out[m] = P::Finish(a, n);
  }
}

template <class T, class O, class P>
void Drive(const TensorView& in, std::span<const int> axes, const TensorView& out) {
  KILN_CHECK(out.dtype == DTypeOf<O>::value) << "reduce: output dtype " << DTypeName(out.dtype);
  Plan p = MakePlan(in, axes);
  bool column = p.kept.rank() > 0 && p.kept.inner_stride() == 1 && p.reduced.inner_stride() != 1;
  if (column)
    ColumnDriver<T, O, P>(in.ptr<T>(), p, out.ptr<O>());
  else
    RowDriver<T, O, P>(in.ptr<T>(), p, out.ptr<O>());
}

template <class T>
void ReduceTyped(ReduceKind kind, const TensorView& in, std::span<const int> axes, const TensorView& out) {
  switch (kind) {
  case ReduceKind::kSum:
    if constexpr (std::is_same_v<T, bool>)
      return Drive<T, int64_t, SumPolicy<T, int64_t, false>>(in, axes, out);
    else
      return Drive<T, T, SumPolicy<T, T, false>>(in, axes, out);
  case ReduceKind::kMean:
    if constexpr (kIsReal<T>) return Drive<T, T, SumPolicy<T, T, true>>(in, axes, out);
    KILN_THROW(DTypeError) << "mean: expected a floating dtype, found " << DTypeName(in.dtype);
    return;
  case ReduceKind::kMax: return Drive<T, T, ExtremumPolicy<T, true>>(in, axes, out);
  case ReduceKind::kMin: return Drive<T, T, ExtremumPolicy<T, false>>(in, axes, out);
  }
}

// ---- argmax / argmin --------------------------------------------------------------------------

template <class T, bool kMax> void ArgTyped(const TensorView& in, int axis, int64_t* out) {
  using C = compute_t<T>;
  using Extremum = ExtremumPolicy<T, kMax>;
  // b replaces the best a when strictly better, or when it is the first NaN.
  auto better = [](C b, C a) {
    if constexpr (kMax)
      return b > a || (b != b && a == a);
    else
      return b < a || (b != b && a == a);
  };
  const T* x = in.ptr<T>();
  int64_t len = 1, sa = 0;
  Group kept;
  for (int i = 0; i < in.rank(); ++i) {
    if (i == axis) {
      len = in.shape[i];
      sa = in.strides[i];
    } else if (in.shape[i] != 1) {
      kept.Add(in.shape[i], in.strides[i]);
    }
  }
  int64_t m_total = kept.size.numel();
  if (kept.rank() > 0 && kept.inner_stride() == 1 && sa != 1 && len > 1) { // column: scan rows
    int64_t cols = kept.inner_size();
    ColumnBlocks blk(cols);
    int64_t tasks = m_total / cols * blk.count;
    ParallelFor(tasks, std::max<int64_t>(1, kGrain / (len * blk.width)), [&](int64_t b, int64_t e) {
      auto best = std::make_unique<C[]>(blk.width);             // not vector: C may be bool
      std::vector<int32_t> arg(static_cast<size_t>(blk.width)); // int32 halves the index traffic
      std::vector<float> buf(kIs16<T> ? blk.width : 1);
      for (int64_t t = b; t < e; ++t) {
        int64_t outer = t / blk.count, j0 = t % blk.count * blk.width, w = std::min(blk.width, cols - j0);
        const T* base = x + Odometer(kept, outer * cols).off + j0;
        const Read<T>* row0 = Converted(base, w, buf.data());
        for (int64_t j = 0; j < w; ++j) {
          best[j] = static_cast<C>(row0[j]);
          arg[j] = 0;
        }
        if (len <= std::numeric_limits<int32_t>::max()) {
          for (int32_t l = 1; l < len; ++l) {
            const Read<T>* row = Converted(base + l * sa, w, buf.data());
            for (int64_t j = 0; j < w; ++j) { // branch-free so that it vectorizes
              C v = static_cast<C>(row[j]);
              bool take = better(v, best[j]);
              best[j] = take ? v : best[j];
              arg[j] = take ? l : arg[j];
            }
          }
          std::copy(arg.begin(), arg.begin() + w, out + outer * cols + j0);
        } else {
          for (int64_t j = 0; j < w; ++j) {
            int64_t a = 0;
            for (int64_t l = 1; l < len; ++l)
              if (better(static_cast<C>(base[l * sa + j]), static_cast<C>(base[a * sa + j]))) a = l;
            out[outer * cols + j0 + j] = a;
          }
        }
      }
    });
    return;
  }
  ParallelFor(m_total, std::max<int64_t>(1, kGrain / len), [&](int64_t b, int64_t e) {
    float buf[kIs16<T> ? kBlock : 1];
    Odometer k(kept, b);
    for (int64_t m = b; m < e; ++m, k.Next()) {
      const T* p = x + k.off;
      C best = static_cast<C>(p[0]);
      int64_t arg = 0;
      if (sa == 1) {
        // The extremum of each block, vectorized; only a block that improves on the best is
        // scanned again for the position.
        for (int64_t b0 = 0; b0 < len && best == best; b0 += kBlock) {
          int64_t n = std::min(kBlock, len - b0);
          const Read<T>* q = Converted(p + b0, n, buf);
          C v = n < 64 ? ReduceLanes<4, Extremum>(q, n) : ReduceLanes<64, Extremum>(q, n);
          if (!better(v, best)) continue;
          best = v;
          for (int64_t i = 0;; ++i) {
            C u = static_cast<C>(q[i]);
            if (u == v || (u != u && v != v)) {
              arg = b0 + i;
              break;
            }
          }
        }
      } else {
        for (int64_t l = 1; l < len && best == best; ++l) {
          C v = static_cast<C>(p[l * sa]);
          if (better(v, best)) {
            best = v;
            arg = l;
          }
        }
      }
      out[m] = arg;
    }
  });
}

} // namespace

void Reduce(ReduceKind kind, const TensorView& in, std::span<const int> axes, const TensorView& out) {
  KILN_CHECK(out.is_contiguous()) << "reduce: the output must be contiguous";
  if (out.numel() == 0) return;
  int64_t n = 1;
  for (int a : axes)
    if (a < in.rank()) n *= in.shape[a];
  if (n == 0) {
    KILN_CHECK(kind == ReduceKind::kSum || kind == ReduceKind::kMean) << "max/min of an empty reduction";
    Fill(out, kind == ReduceKind::kSum ? 0.0 : std::numeric_limits<double>::quiet_NaN());
    return;
  }
  KILN_DISPATCH_ALL(in.dtype, ReduceTyped<scalar_t>(kind, in, axes, out));
}

void ArgReduce(bool max, const TensorView& in, int axis, const TensorView& out) {
  KILN_CHECK(out.is_contiguous() && out.dtype == DType::kInt64)
      << "argreduce: output must be contiguous int64";
  if (out.numel() == 0) return;
  KILN_CHECK(in.rank() == 0 || in.shape[axis] > 0) << "argreduce over a zero-size axis";
  int64_t* o = out.ptr<int64_t>();
  if (max) {
    KILN_DISPATCH_ALL(in.dtype, ArgTyped<scalar_t, true>(in, axis, o));
  } else {
    KILN_DISPATCH_ALL(in.dtype, ArgTyped<scalar_t, false>(in, axis, o));
  }
}

} // namespace kiln::host
