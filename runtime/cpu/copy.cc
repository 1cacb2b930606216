#include "kiln/runtime/cpu/copy.h"

#include <cstring>

#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/cpu/movement.h"

namespace kiln::host {

namespace {
template <class S, class D>
void CopyTyped(const TensorView& src, const TensorView& dst) {
  const S* s = src.ptr<S>();
  D* d = dst.ptr<D>();
  if (src.is_contiguous() && dst.is_contiguous()) {
    if constexpr (std::is_same_v<S, D>) {
      int64_t n = src.numel();
      ParallelFor(n, 1 << 18, [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, (e - b) * sizeof(S)); });
    } else {
      ParallelFor(src.numel(), 1 << 15, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) d[i] = static_cast<D>(static_cast<compute_t<S>>(s[i]));
      });
    }
    return;
  }
  StridedFor<2>(src.shape, {src.strides, dst.strides}, [&](const std::array<int64_t, 2>& o) {
    d[o[1]] = static_cast<D>(static_cast<compute_t<S>>(s[o[0]]));
  });
}
}  // namespace

void CopyConvert(const TensorView& src, const TensorView& dst) {
  KILN_CHECK(src.shape == dst.shape) << src.shape.str() << " vs " << dst.shape.str();
  if (src.dtype == dst.dtype && !(src.is_contiguous() && dst.is_contiguous())) {
    CopyStrided(src, dst);  // byte copy with dimension coalescing and tiled transposes
    return;
  }
  KILN_DISPATCH_ALL(src.dtype, {
    using S = scalar_t;
    KILN_DISPATCH_ALL(dst.dtype, { CopyTyped<S, scalar_t>(src, dst); });
  });
}

void Fill(const TensorView& dst, double value) {
  KILN_DISPATCH_ALL(dst.dtype, {
    scalar_t v = static_cast<scalar_t>(static_cast<compute_t<scalar_t>>(value));
    scalar_t* d = dst.ptr<scalar_t>();
    if (dst.is_contiguous()) {
      ParallelFor(dst.numel(), 1 << 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) d[i] = v;
      });
    } else {
      StridedFor<1>(dst.shape, {dst.strides}, [&](const std::array<int64_t, 1>& o) { d[o[0]] = v; });
    }
  });
}

}  // namespace kiln::host
