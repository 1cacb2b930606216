// CPU movement kernels (see movement.h). Everything here moves bytes: copies dispatch on the
// element size, not the dtype, so eight dtypes cost four instantiations. Only TakeGrad and
// OneHot compute, and they dispatch on the dtype.
#include "kiln/runtime/cpu/movement.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <sstream>

#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/error.h"

namespace kiln::host {

// ---- strided copies ----------------------------------------------------------------------------

namespace {

constexpr int64_t kCopyGrainBytes = 1 << 18;  // below this a copy stays on one thread

/// A copy's iteration space after coalescing: sizes and the strides of both sides.
struct Dims {
  int r = 0;
  int64_t n[kMaxRank], s[kMaxRank], d[kMaxRank];
};

// Drops size-1 axes and merges neighbours that are contiguous with each other on both sides.
Dims Coalesce(const Shape& shape, const Strides& ss, const Strides& ds) {
  Dims c;
  for (int i = 0; i < shape.rank(); ++i) {
    if (shape[i] == 1) continue;
    if (c.r > 0 && c.s[c.r - 1] == ss[i] * shape[i] && c.d[c.r - 1] == ds[i] * shape[i]) {
      c.n[c.r - 1] *= shape[i];
      c.s[c.r - 1] = ss[i];
      c.d[c.r - 1] = ds[i];
    } else {
      c.n[c.r] = shape[i];
      c.s[c.r] = ss[i];
      c.d[c.r] = ds[i];
      ++c.r;
    }
  }
  return c;
}

/// Walks the first `m` axes of `c` in row-major order, tracking both sides' offsets.
struct Walker {
  const Dims& c;
  int m;
  int64_t idx[kMaxRank] = {};
  int64_t so = 0, dof = 0;
  Walker(const Dims& dims, int axes, int64_t linear) : c(dims), m(axes) {
    for (int i = m - 1; i >= 0; --i) {
      idx[i] = linear % c.n[i];
      linear /= c.n[i];
      so += idx[i] * c.s[i];
      dof += idx[i] * c.d[i];
    }
  }
  void Next() {
    for (int i = m - 1; i >= 0; --i) {
      if (++idx[i] < c.n[i]) {
        so += c.s[i];
        dof += c.d[i];
        return;
      }
      so -= (c.n[i] - 1) * c.s[i];
      dof -= (c.n[i] - 1) * c.d[i];
      idx[i] = 0;
    }
  }
};

// Rows of the innermost axis; long rows are cut into pieces so that few rows still use all
// threads. Unit strides on both sides make each piece one memcpy.
template <class T>
void CopyRows(const T* s, T* d, const Dims& c) {
  constexpr int64_t kPiece = 1 << 16;
  int l = c.r - 1;
  int64_t inner = c.n[l], is = c.s[l], id = c.d[l];
  int64_t rows = 1;
  for (int i = 0; i < l; ++i) rows *= c.n[i];
  int64_t pieces = (inner + kPiece - 1) / kPiece;
  int64_t plen = std::min(inner, kPiece);
  bool unit = is == 1 && id == 1;
  int64_t grain = std::max<int64_t>(1, kCopyGrainBytes / static_cast<int64_t>(sizeof(T)) / plen);
  ParallelFor(rows * pieces, grain, [&](int64_t b, int64_t e) {
    Walker w(c, l, b / pieces);
    int64_t p = b % pieces;
    for (int64_t t = b; t < e; ++t) {
      int64_t i0 = p * kPiece, i1 = std::min(inner, i0 + kPiece);
      const T* sp = s + w.so + i0 * is;
      T* dp = d + w.dof + i0 * id;
      if (unit) {
        std::memcpy(dp, sp, static_cast<size_t>(i1 - i0) * sizeof(T));
      } else {
        for (int64_t i = 0; i < i1 - i0; ++i) dp[i * id] = sp[i * is];
      }
      if (++p == pieces) {
        p = 0;
        w.Next();
      }
    }
  });
}

// A transpose: one side is unit-stride along the last axis, the other along axis `k`. Square
// tiles keep both sides' cache lines resident.
template <class T>
void CopyTiled(const T* s, T* d, const Dims& c, int k) {
  constexpr int64_t B = sizeof(T) <= 4 ? 64 : 32;  // a tile of each side fits in L1
  int l = c.r - 1;
  Dims o;  // the remaining axes
  for (int i = 0; i < l; ++i)
    if (i != k) {
      o.n[o.r] = c.n[i];
      o.s[o.r] = c.s[i];
      o.d[o.r] = c.d[i];
      ++o.r;
    }
  int64_t outer = 1;
  for (int i = 0; i < o.r; ++i) outer *= o.n[i];
  int64_t nk = c.n[k], nl = c.n[l], tk = (nk + B - 1) / B, tl = (nl + B - 1) / B;
  int64_t sk = c.s[k], sl = c.s[l], dk = c.d[k], dl = c.d[l];
  bool dst_rows = dl == 1;
  int64_t grain = std::max<int64_t>(1, kCopyGrainBytes / static_cast<int64_t>(sizeof(T)) / (B * B));
  ParallelFor(outer * tk * tl, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t jl = t % tl, jk = (t / tl) % tk;
      Walker w(o, o.r, t / (tl * tk));
      int64_t k0 = jk * B, k1 = std::min(nk, k0 + B), l0 = jl * B, l1 = std::min(nl, l0 + B);
      const T* sb = s + w.so;
      T* db = d + w.dof;
      if (dst_rows) {  // dst unit-stride along l, src along k
        for (int64_t a = k0; a < k1; ++a)
          for (int64_t x = l0; x < l1; ++x) db[a * dk + x] = sb[a + x * sl];
      } else {  // src unit-stride along l, dst along k
        for (int64_t x = l0; x < l1; ++x)
          for (int64_t a = k0; a < k1; ++a) db[a + x * dl] = sb[a * sk + x];
      }
    }
  });
}

template <class T>
void CopyBits(const void* src, void* dst, const Dims& c) {
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
  if (c.r == 0) {
    *d = *s;
    return;
  }
  int l = c.r - 1;
  // Unit stride on one side only (and not a broadcast): look for the other side's unit axis.
  bool dst_unit = c.d[l] == 1 && c.s[l] != 1 && c.s[l] != 0;
  bool src_unit = c.s[l] == 1 && c.d[l] != 1;
  if (c.n[l] >= 8 && (dst_unit || src_unit)) {
    const int64_t* other = dst_unit ? c.s : c.d;
    for (int k = l - 1; k >= 0; --k)
      if (other[k] == 1 && c.n[k] >= 8) return CopyTiled(s, d, c, k);
  }
  CopyRows(s, d, c);
}

// memcpy with the common small sizes spelled out, so that the compiler inlines them.
inline void CopyBytes(char* dst, const char* src, int64_t n) {
  switch (n) {
    case 2: std::memcpy(dst, src, 2); break;
    case 4: std::memcpy(dst, src, 4); break;
    case 8: std::memcpy(dst, src, 8); break;
    case 16: std::memcpy(dst, src, 16); break;
    default: std::memcpy(dst, src, static_cast<size_t>(n));
  }
}

// `whole` is [outer, R] bytes; part i is [outer, seg[i]] bytes holding columns
// [P[i], P[i] + seg[i]) of it. gather: parts -> whole (concat); else whole -> parts (split).
// One parallel pass over the bytes of `whole`, each thread owning a contiguous range of it.
void SegmentCopy(char* whole, std::span<char* const> parts, std::span<const int64_t> seg, int64_t outer,
                 bool gather) {
  size_t k = parts.size();
  std::vector<int64_t> P(k + 1, 0);
  for (size_t i = 0; i < k; ++i) P[i + 1] = P[i] + seg[i];
  int64_t R = P[k];
  if (R == 0 || outer == 0) return;
  if (seg[0] <= 16 && std::all_of(seg.begin(), seg.end(), [&](int64_t s) { return s == seg[0]; })) {
    // Interleaving a few elements per part (stack along the last axis): plain nested loops.
    int64_t S = seg[0];
    ParallelFor(outer, std::max<int64_t>(1, kCopyGrainBytes / R), [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row)
        for (size_t i = 0; i < k; ++i) {
          char *w = whole + row * R + static_cast<int64_t>(i) * S, *p = parts[i] + row * S;
          if (gather)
            CopyBytes(w, p, S);
          else
            CopyBytes(p, w, S);
        }
    });
    return;
  }
  ParallelFor(outer * R, kCopyGrainBytes, [&](int64_t b, int64_t e) {
    int64_t row = b / R, col = b % R;
    size_t i = static_cast<size_t>(std::upper_bound(P.begin(), P.end(), col) - P.begin()) - 1;
    for (int64_t pos = b; pos < e;) {
      int64_t off = col - P[i], n = std::min(seg[i] - off, e - pos);
      char* p = parts[i] + row * seg[i] + off;
      if (gather)
        CopyBytes(whole + pos, p, n);
      else
        CopyBytes(p, whole + pos, n);
      pos += n;
      col += n;
      if (col == R) {
        col = 0;
        ++row;
        i = 0;
      }
      while (i < k && P[i + 1] <= col) ++i;
    }
  });
}

int64_t Prod(const Shape& s, int b, int e) {
  int64_t n = 1;
  for (int i = b; i < e; ++i) n *= s[i];
  return n;
}

char* Bytes(const TensorView& v) { return static_cast<char*>(v.data); }

// Calls f(const I* indices) with the index tensor's element type.
template <class F>
void WithIndices(const TensorView& idx, const char* op, F&& f) {
  if (idx.dtype == DType::kInt32)
    f(idx.ptr<const int32_t>());
  else if (idx.dtype == DType::kInt64)
    f(idx.ptr<const int64_t>());
  else
    KILN_THROW(DTypeError) << op << ": indices must be int32 or int64, found " << DTypeName(idx.dtype);
}

// The position of the first index outside [lo, dim), or n when all are inside.
template <class I>
int64_t FirstOutside(const I* ix, int64_t n, int64_t lo, int64_t dim) {
  std::atomic<int64_t> first_bad{n};
  ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      int64_t k = static_cast<int64_t>(ix[j]);
      if (k < lo || k >= dim) {
        int64_t cur = first_bad.load();
        while (j < cur && !first_bad.compare_exchange_weak(cur, j)) {
        }
        return;
      }
    }
  });
  return first_bad.load();
}

// Throws ValueError naming the first index outside [-dim, dim). Checked before any write (and
// outside the parallel region: an exception must not leave an OpenMP thread).
template <class I>
void CheckIndices(const I* ix, int64_t n, int64_t dim, int axis, const char* op) {
  int64_t j = FirstOutside(ix, n, -dim, dim);
  if (j < n) RaiseBadIndex(op, static_cast<int64_t>(ix[j]), j, axis, dim);
}

}  // namespace

void RaiseBadIndex(const char* op, int64_t index, int64_t position, int axis, int64_t dim, const char* found_by) {
  std::ostringstream valid;
  if (dim == 0)
    valid << "an axis of size 0 has no valid index";
  else
    valid << "valid indices are " << -dim << " to " << dim - 1;
  KILN_THROW(ValueError) << op << ": index " << index << " (at position " << position
                         << " of the indices) is out of range for axis " << axis << " of size " << dim << "; "
                         << valid.str() << found_by;
}

void RaiseBadLabel(int64_t label, int64_t position, int64_t classes, const char* found_by) {
  std::ostringstream valid;
  if (classes == 0)
    valid << "there are no classes (depth 0)";
  else
    valid << "labels must be class indices 0 to " << classes - 1;
  KILN_THROW(ValueError) << "one_hot of class labels (softmax_cross_entropy, the losses): label " << label
                         << " (at position " << position << " of the labels) is out of range for " << classes
                         << " classes; " << valid.str() << found_by;
}

namespace {

template <class I>
inline int64_t Wrap(I k, int64_t dim) {
  int64_t v = static_cast<int64_t>(k);
  return v < 0 ? v + dim : v;
}

}  // namespace

void CopyStrided(const TensorView& src, const TensorView& dst) {
  KILN_CHECK(src.shape == dst.shape && src.dtype == dst.dtype)
      << DTypeName(src.dtype) << src.shape.str() << " -> " << DTypeName(dst.dtype) << dst.shape.str();
  if (src.numel() == 0) return;
  Dims c = Coalesce(src.shape, src.strides, dst.strides);
  switch (DTypeSize(src.dtype)) {
    case 1: CopyBits<uint8_t>(src.data, dst.data, c); break;
    case 2: CopyBits<uint16_t>(src.data, dst.data, c); break;
    case 4: CopyBits<uint32_t>(src.data, dst.data, c); break;
    case 8: CopyBits<uint64_t>(src.data, dst.data, c); break;
    default: KILN_CHECK(false) << "element size " << DTypeSize(src.dtype);
  }
}

// ---- concat / split ------------------------------------------------------------------------------

void Concat(std::span<const TensorView> in, const TensorView& out, int axis) {
  int64_t es = static_cast<int64_t>(DTypeSize(out.dtype));
  bool flat = out.is_contiguous();
  for (const TensorView& v : in) flat = flat && v.is_contiguous();
  if (flat) {
    int64_t after = Prod(out.shape, axis + 1, out.rank());
    std::vector<char*> parts;
    std::vector<int64_t> seg;
    for (const TensorView& v : in) {
      parts.push_back(Bytes(v));
      seg.push_back(v.shape[axis] * after * es);
    }
    SegmentCopy(Bytes(out), parts, seg, Prod(out.shape, 0, axis), true);
    return;
  }
  int64_t pos = 0;
  for (const TensorView& v : in) {
    TensorView dst = out;
    dst.data = Bytes(out) + pos * out.strides[axis] * es;
    dst.shape = v.shape;
    CopyStrided(v, dst);
    pos += v.shape[axis];
  }
}

void Split(const TensorView& in, std::span<const TensorView> out, int axis) {
  int64_t es = static_cast<int64_t>(DTypeSize(in.dtype));
  bool flat = in.is_contiguous();
  for (const TensorView& v : out) flat = flat && v.is_contiguous();
  if (flat) {
    int64_t after = Prod(in.shape, axis + 1, in.rank());
    std::vector<char*> parts;
    std::vector<int64_t> seg;
    for (const TensorView& v : out) {
      parts.push_back(Bytes(v));
      seg.push_back(v.shape[axis] * after * es);
    }
    SegmentCopy(Bytes(in), parts, seg, Prod(in.shape, 0, axis), false);
    return;
  }
  int64_t pos = 0;
  for (const TensorView& v : out) {
    TensorView src = in;
    src.data = Bytes(in) + pos * in.strides[axis] * es;
    src.shape = v.shape;
    CopyStrided(src, v);
    pos += v.shape[axis];
  }
}

// ---- take / take_grad / one_hot ------------------------------------------------------------------

void Take(const TensorView& x, const TensorView& indices, const TensorView& out, int axis) {
  KILN_CHECK(x.is_contiguous() && indices.is_contiguous() && out.is_contiguous());
  int64_t outer = Prod(x.shape, 0, axis), dim = x.shape[axis], inner = Prod(x.shape, axis + 1, x.rank());
  int64_t n = indices.numel();
  int64_t rb = inner * static_cast<int64_t>(DTypeSize(x.dtype));  // bytes per gathered row
  WithIndices(indices, "take", [&](const auto* ix) {
    CheckIndices(ix, n, dim, axis, "take");
    if (outer * n * rb == 0) return;
    const char* src = static_cast<const char*>(x.data);
    char* dst = Bytes(out);
    auto gather = [&](auto unit) {  // rows of exactly one element of type decltype(unit)
      using U = decltype(unit);
      const U* s = reinterpret_cast<const U*>(src);
      U* d = reinterpret_cast<U*>(dst);
      ParallelFor(outer * n, 1 << 15, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) d[t] = s[(t / n) * dim + Wrap(ix[t % n], dim)];
      });
    };
    switch (rb) {
      case 1: return gather(uint8_t{});
      case 2: return gather(uint16_t{});
      case 4: return gather(uint32_t{});
      case 8: return gather(uint64_t{});
      default: break;
    }
    ParallelFor(outer * n, std::max<int64_t>(1, kCopyGrainBytes / rb), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / n, j = t % n;
        std::memcpy(dst + t * rb, src + (o * dim + Wrap(ix[j], dim)) * rb, static_cast<size_t>(rb));
      }
    });
  });
}

void TakeGrad(const TensorView& dy, const TensorView& indices, const TensorView& dx, int axis) {
  KILN_CHECK(dy.is_contiguous() && indices.is_contiguous() && dx.is_contiguous());
  int64_t outer = Prod(dx.shape, 0, axis), dim = dx.shape[axis], inner = Prod(dx.shape, axis + 1, dx.rank());
  int64_t n = indices.numel();
  Fill(dx, 0.0);
  WithIndices(indices, "take_grad", [&](const auto* ix) {
    CheckIndices(ix, n, dim, axis, "take_grad");
    if (outer * n * inner == 0) return;
    KILN_DISPATCH_FLOAT(dx.dtype, "take_grad", {
      using C = compute_t<scalar_t>;
      const scalar_t* g = dy.ptr<const scalar_t>();
      scalar_t* d = dx.ptr<scalar_t>();
      // dx row (o, k) columns [c0, c1) += dy row (o, j) for every j with indices[j] == k, when
      // k is in [k0, k1). Each thread owns a disjoint block of dx: no atomics, and repeated
      // indices accumulate in order.
      auto accumulate = [&](int64_t o0, int64_t o1, int64_t k0, int64_t k1, int64_t c0, int64_t c1) {
        for (int64_t o = o0; o < o1; ++o)
          for (int64_t j = 0; j < n; ++j) {
            int64_t k = Wrap(ix[j], dim);
            if (k < k0 || k >= k1) continue;
            const scalar_t* gr = g + (o * n + j) * inner;
            scalar_t* dr = d + (o * dim + k) * inner;
            for (int64_t c = c0; c < c1; ++c)
              dr[c] = static_cast<scalar_t>(static_cast<C>(dr[c]) + static_cast<C>(gr[c]));
          }
      };
      int nt = NumThreads();
      int64_t work = outer * n * inner;
      if (outer >= 2 * nt || (dim < nt && inner < 64)) {
        ParallelFor(outer, std::max<int64_t>(1, (1 << 15) * outer / work),
                    [&](int64_t b, int64_t e) { accumulate(b, e, 0, dim, 0, inner); });
      } else if (dim >= nt) {  // split dx's rows; every thread scans all the indices
        ParallelFor(dim, work < (1 << 15) ? dim : 1,
                    [&](int64_t b, int64_t e) { accumulate(0, outer, b, e, 0, inner); });
      } else {  // split the columns
        ParallelFor(inner, std::max<int64_t>(16, (1 << 15) * inner / work),
                    [&](int64_t b, int64_t e) { accumulate(0, outer, 0, dim, b, e); });
      }
    });
  });
}

void OneHot(const TensorView& indices, const TensorView& out, double on, double off, bool labels) {
  KILN_CHECK(indices.is_contiguous() && out.is_contiguous());
  int64_t depth = out.shape.back(), n = indices.numel();
  WithIndices(indices, "one_hot", [&](const auto* ix) {
    if (labels) {
      int64_t j = FirstOutside(ix, n, 0, depth);
      if (j < n) RaiseBadLabel(static_cast<int64_t>(ix[j]), j, depth);
    }
    if (n * depth == 0) return;
    KILN_DISPATCH_ALL(out.dtype, {
      using C = compute_t<scalar_t>;
      scalar_t von = static_cast<scalar_t>(static_cast<C>(on)),
               voff = static_cast<scalar_t>(static_cast<C>(off));
      scalar_t* y = out.ptr<scalar_t>();
      ParallelFor(n, std::max<int64_t>(1, (1 << 15) / depth), [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) {
          scalar_t* row = y + j * depth;
          std::fill(row, row + depth, voff);
          int64_t k = static_cast<int64_t>(ix[j]);
          if (k >= 0 && k < depth) row[k] = von;
        }
      });
    });
  });
}

}  // namespace kiln::host
