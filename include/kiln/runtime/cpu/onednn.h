// CPU kernels of the neural-network ops: matmul, 2-D convolution and 2-D pooling on contiguous
// row-major tensors (NCHW data, OIHW weights). float32 (and bfloat16 where this CPU has a oneDNN
// kernel for it) run on oneDNN, whose primitives are cached by shape, attributes and dtype, or
// on the hand-written kernels of direct_nn.h where oneDNN is slow; float64 and float16 run the
// plain loops of runtime/cpu/reference_nn.cc, which are also the reference that tests compare
// against. Outputs are overwritten, never accumulated into.
// oneDNN stays behind this header: nothing here includes dnnl.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kiln/runtime/scalar_fn.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::host {

struct MatmulParams {
  bool transpose_a = false; ///< a is stored (..., K, M)
  bool transpose_b = false; ///< b is stored (..., N, K)
};

struct Conv2dParams {
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};  ///< on both sides
  int64_t dilation[2] = {1, 1}; ///< 1: dense kernel
  int64_t groups = 1;
};

struct Pool2dParams {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};   ///< on both sides; padded cells never win a max
  bool count_include_pad = true; ///< average pooling: divide by the whole window
};

/// out (..., M, N) = op(a) @ op(b); batch dims broadcast NumPy-style (out's rank is the larger).
void Matmul(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p);
/// y (N, O, OH, OW) = x (N, C, H, W) cross-correlated with w (O, C/groups, KH, KW).
void Conv2d(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p);
/// dx (N, C, H, W) from dy and w.
void Conv2dGradData(const TensorView& dy, const TensorView& w, const TensorView& dx, const Conv2dParams& p);
/// dw (O, C/groups, KH, KW) from dy and x.
void Conv2dGradWeight(const TensorView& dy, const TensorView& x, const TensorView& dw, const Conv2dParams& p);
void MaxPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p);
/// dx from dy and x: each dy goes to the first maximum of its window (recomputed from x).
void MaxPool2dGrad(const TensorView& dy, const TensorView& x, const TensorView& dx, const Pool2dParams& p);
void AvgPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p);
void AvgPool2dGrad(const TensorView& dy, const TensorView& dx, const Pool2dParams& p);

/// An elementwise epilogue of a float32 matmul or conv2d: steps applied in order to each output
/// element x before it is stored. oneDNN runs it as post-ops of the same primitive (a first
/// per-channel add as the primitive's own bias); where oneDNN is not used (the hand-written
/// kernels, or no kernel with these post-ops), the steps run over the output in blocks while it is
/// in cache. The channel axis is 1 for conv2d (NCHW) and the last axis for matmul.
struct EpilogueStep {
  enum Kind : uint8_t { kUnary, kLinear, kBinary } kind = kUnary;
  UnaryFn unary = UnaryFn::kIdentity;  ///< kUnary: one of those EpilogueSupports accepts
  float alpha = 1, beta = 0;           ///< kLinear: alpha * x + beta
  BinaryFn binary = BinaryFn::kAdd;    ///< kBinary: x op operand (x on the left)
  bool per_channel = false;            ///< kBinary: the operand holds one value per channel, else the output's shape
  int operand = 0;                     ///< kBinary: index into the call's operands
};
struct Epilogue {
  std::vector<EpilogueStep> steps;
};
/// The functions an epilogue step may apply (those oneDNN has an eltwise or binary algorithm for).
bool EpilogueSupports(UnaryFn f);
bool EpilogueSupports(BinaryFn f);
/// Matmul and Conv2d, float32, followed by `e` over `operands` (contiguous float32).
void MatmulEpilogue(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p,
                    const Epilogue& e, std::span<const TensorView> operands);
void Conv2dEpilogue(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p,
                    const Epilogue& e, std::span<const TensorView> operands);
/// `e` over elements [begin, end) of the float32 buffer `y` whose channel axis has `channels`
/// entries each `inner` elements apart (the fallback of the two above, and tests' reference).
void ApplyEpilogue(float* y, int64_t begin, int64_t end, int64_t inner, int64_t channels, const Epilogue& e,
                   std::span<const TensorView> operands);

/// Counters of the oneDNN primitive cache (process-wide).
struct OneDnnCacheStats {
  int64_t hits = 0;
  int64_t misses = 0; ///< primitive descriptors created
  int64_t size = 0;
};
OneDnnCacheStats GetOneDnnCacheStats();

/// The plain-loop kernels: every float dtype, same contracts as above.
namespace reference {
void Matmul(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p);
void Conv2d(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p);
void Conv2dGradData(const TensorView& dy, const TensorView& w, const TensorView& dx, const Conv2dParams& p);
void Conv2dGradWeight(const TensorView& dy, const TensorView& x, const TensorView& dw, const Conv2dParams& p);
void MaxPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p);
void MaxPool2dGrad(const TensorView& dy, const TensorView& x, const TensorView& dx, const Pool2dParams& p);
void AvgPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p);
void AvgPool2dGrad(const TensorView& dy, const TensorView& dx, const Pool2dParams& p);
} // namespace reference

} // namespace kiln::host
