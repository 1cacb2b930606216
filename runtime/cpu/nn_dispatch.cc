// The CPU neural-network kernels' entry points (onednn.h): which kernel runs a call. In order:
// trivial (empty) cases, the hand-written kernels of direct_nn.h where they apply (and the
// streaming few-rows matmul here), then oneDNN (onednn_prim.h) for float32/bfloat16, and the
// plain loops of reference_nn.cc for other dtypes or where oneDNN has no kernel for the case.
// With an epilogue, the steps oneDNN does not take as post-ops run over the output after it.
// oneDNN stays out of this file: it includes no dnnl header.
#include <algorithm>

#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/cpu/direct_nn.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/cpu/onednn.h"
#include "kiln/runtime/error.h"
#include "onednn_ops.h"

namespace kiln::host {


namespace {

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

// The sum of 16 lanes as a tree (halves added, then quarters...): a chain of 16 scalar adds waits
// on the add's latency at every step, and the few-rows matmul ends every output with one.
inline float LaneSum(const float (&v)[16]) {
  float h[8];
#pragma omp simd
  for (int l = 0; l < 8; ++l) h[l] = v[l] + v[l + 8];
  float q[4];
  for (int l = 0; l < 4; ++l) q[l] = h[l] + h[l + 4];
  return (q[0] + q[2]) + (q[1] + q[3]);
}

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
            float sum = LaneSum(acc[r]);
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

}  // namespace

OneDnnCacheStats GetOneDnnCacheStats() { return onednn::CacheStats(); }

void Matmul(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p) {
  if (Trivial(out, {&a, &b})) return;
  if (SmallRowsMatmul(a, b, out, p)) return;
  if (onednn::Matmul(a, b, out, p)) return;
  reference::Matmul(a, b, out, p);
}

void Conv2d(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p) {
  if (Trivial(y, {&x, &w})) return;
  if (direct::Conv2d(x, w, y, p)) return;
  if (onednn::Conv2d(x, w, y, p)) return;
  reference::Conv2d(x, w, y, p);
}

void Conv2dGradData(const TensorView& dy, const TensorView& w, const TensorView& dx, const Conv2dParams& p) {
  if (Trivial(dx, {&dy, &w})) return;
  if (onednn::Conv2dGradData(dy, w, dx, p)) return;
  reference::Conv2dGradData(dy, w, dx, p);
}

void Conv2dGradWeight(const TensorView& dy, const TensorView& x, const TensorView& dw,
                      const Conv2dParams& p) {
  if (Trivial(dw, {&dy, &x})) return;
  if (direct::Conv2dGradWeight(dy, x, dw, p)) return;
  if (onednn::Conv2dGradWeight(dy, x, dw, p)) return;
  reference::Conv2dGradWeight(dy, x, dw, p);
}

void MaxPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p) {
  if (Trivial(y, {&x})) return;
  if (onednn::MaxPool2d(x, y, p)) return;
  reference::MaxPool2d(x, y, p);
}

void MaxPool2dGrad(const TensorView& dy, const TensorView& x, const TensorView& dx, const Pool2dParams& p) {
  if (Trivial(dx, {&dy, &x})) return;
  if (onednn::MaxPool2dGrad(dy, x, dx, p)) return;
  reference::MaxPool2dGrad(dy, x, dx, p);
}

void AvgPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p) {
  if (Trivial(y, {&x})) return;
  if (direct::AvgPool2d(x, y, p)) return;
  if (onednn::AvgPool2d(x, y, p)) return;
  reference::AvgPool2d(x, y, p);
}

void AvgPool2dGrad(const TensorView& dy, const TensorView& dx, const Pool2dParams& p) {
  if (Trivial(dx, {&dy})) return;
  if (direct::AvgPool2dGrad(dy, dx, p)) return;
  if (onednn::AvgPool2dGrad(dy, dx, p)) return;
  reference::AvgPool2dGrad(dy, dx, p);
}

void MatmulEpilogue(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p,
                    const Epilogue& e, std::span<const TensorView> operands) {
  KILN_CHECK(out.dtype == DType::kFloat32) << "matmul epilogues are float32";
  const int r = out.rank();
  const int64_t channels = out.shape[r - 1];
  // A few rows (the streaming kernel) or nothing to compute: the epilogue after the product.
  const bool small = a.rank() == 2 && b.rank() == 2 && !p.transpose_a && a.shape[0] <= 4;
  if (!small && out.numel() > 0 && a.numel() > 0 && b.numel() > 0) {
    KILN_CHECK(out.is_contiguous() && a.is_contiguous() && b.is_contiguous()) << "NN kernels take contiguous operands";
    if (int done = onednn::MatmulEpilogue(a, b, out, p, e, operands); done >= 0)
      return ApplyEpilogueAll(out, 1, channels, e, operands, static_cast<size_t>(done));
  }
  Matmul(a, b, out, p);
  ApplyEpilogueAll(out, 1, channels, e, operands);
}

void Conv2dEpilogue(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p,
                    const Epilogue& e, std::span<const TensorView> operands) {
  KILN_CHECK(y.dtype == DType::kFloat32) << "conv2d epilogues are float32";
  const int64_t inner = y.shape[2] * y.shape[3], channels = y.shape[1];
  if (Trivial(y, {&x, &w})) return ApplyEpilogueAll(y, inner, channels, e, operands);
  if (DirectConv2d(x, w, y, p, e, operands)) return;
  if (int done = onednn::Conv2dEpilogue(x, w, y, p, e, operands); done >= 0)
    return ApplyEpilogueAll(y, inner, channels, e, operands, static_cast<size_t>(done));
  Conv2d(x, w, y, p);
  ApplyEpilogueAll(y, inner, channels, e, operands);
}

}  // namespace kiln::host
