// The C++ op API, mirroring kiln.nd in Python: thin wrappers over Invoke with NumPy-style dtype
// promotion for binary ops and Python-scalar operands, plus the composites of DESIGN.md section 3
// (sigmoid, softmax, log_softmax, cross-entropy, dropout, batch norm, ...), which are built from
// primitives and so get gradients (and, later, fusion) for free.
#pragma once

#include <optional>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/runtime/op_list.h"

namespace kiln::nd {

using Axes = std::vector<int64_t>;

// ---- creation ----
Tensor zeros(const Shape& shape, DType dtype = DType::kFloat32, Device device = cpu());
Tensor ones(const Shape& shape, DType dtype = DType::kFloat32, Device device = cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::kFloat32, Device device = cpu());
Tensor arange(double start, double stop, double step = 1, DType dtype = DType::kFloat32, Device device = cpu());
Tensor zeros_like(const Tensor& x);
Tensor ones_like(const Tensor& x);
namespace random {
Tensor uniform(double low, double high, const Shape& shape, DType dtype = DType::kFloat32, Device device = cpu());
Tensor normal(double mean, double std, const Shape& shape, DType dtype = DType::kFloat32, Device device = cpu());
Tensor bernoulli(double p, const Shape& shape, DType dtype = DType::kFloat32, Device device = cpu());
void seed(uint64_t s);
}  // namespace random

// ---- elementwise ----
// One function per unary and binary op of the op list (kiln/runtime/op_list.h), named as there.
#define KILN_X(Id, name, nd_name, domain, doc) /** doc */ Tensor nd_name(const Tensor& x);
KILN_UNARY_OPS(KILN_X)
#undef KILN_X
Tensor stop_gradient(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor gelu(const Tensor& x);

#define KILN_X(Id, name, nd_name, doc)          \
  Tensor nd_name(const Tensor& a, const Tensor& b); \
  Tensor nd_name(const Tensor& a, double b);        \
  Tensor nd_name(double a, const Tensor& b);
KILN_BINARY_OPS(KILN_X)
#undef KILN_X

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor cast(const Tensor& x, DType dtype);
Tensor clip(const Tensor& x, double lo, double hi);

// ---- reductions ----
Tensor sum(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
Tensor mean(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
Tensor max(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
Tensor min(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
Tensor argmax(const Tensor& x, int64_t axis, bool keepdims = false);
Tensor argmin(const Tensor& x, int64_t axis, bool keepdims = false);

// ---- movement ----
Tensor reshape(const Tensor& x, const Axes& shape);
Tensor transpose(const Tensor& x, const Axes& axes = {});
Tensor slice(const Tensor& x, const Axes& begin, const Axes& end, const Axes& step = {});
Tensor broadcast_to(const Tensor& x, const Axes& shape);
Tensor expand_dims(const Tensor& x, int64_t axis);
Tensor squeeze(const Tensor& x, const Axes& axes = {});
/// (N, d1, d2, ...) -> (N, d1*d2*...), as Gluon's Flatten.
Tensor flatten(const Tensor& x);
Tensor concat(const std::vector<Tensor>& xs, int64_t axis = 0);
Tensor stack(const std::vector<Tensor>& xs, int64_t axis = 0);
/// `sections`: one value N for N equal parts, or the size of each part.
std::vector<Tensor> split(const Tensor& x, const Axes& sections, int64_t axis = 0);
Tensor take(const Tensor& x, const Tensor& indices, int64_t axis = 0);
/// `labels`: the indices are class labels (of a loss); one outside [0, depth) is a ValueError
/// instead of an all-off row (MXNet's one_hot).
Tensor one_hot(const Tensor& indices, int64_t depth, double on_value = 1, double off_value = 0,
               DType dtype = DType::kFloat32, bool labels = false);

// ---- neural network ----
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
/// y = x @ w^T + b (Gluon's Dense); `b` may be undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());
struct Conv2dOptions {
  Axes stride = {1, 1}, padding = {0, 0}, dilation = {1, 1};
  int64_t groups = 1;
};
/// NCHW convolution with OIHW weights; `bias` (O,) may be undefined.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(), const Conv2dOptions& o = {});
Tensor max_pool2d(const Tensor& x, const Axes& kernel, const Axes& stride = {}, const Axes& padding = {0, 0});
Tensor avg_pool2d(const Tensor& x, const Axes& kernel, const Axes& stride = {}, const Axes& padding = {0, 0},
                  bool count_include_pad = true);
Tensor global_avg_pool2d(const Tensor& x);
Tensor softmax(const Tensor& x, int64_t axis = -1);
Tensor log_softmax(const Tensor& x, int64_t axis = -1);
/// Per-sample loss -sum(label * log_softmax(logits)); `labels` are class indices (sparse, any int
/// dtype or float holding integers) or, when `sparse_label` is false, a distribution like logits.
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, int64_t axis = -1,
                             bool sparse_label = true);
/// Zeroes elements with probability p and scales the rest by 1/(1-p) when training;
/// the identity otherwise (or when p is 0).
Tensor dropout(const Tensor& x, double p, bool training);
struct BatchNormOptions {
  int64_t axis = 1;
  double eps = 1e-5;
  double momentum = 0.9;  ///< running = momentum * running + (1 - momentum) * batch (Gluon's)
  bool training = true;
};
/// Batch normalization over every axis but `axis`. In training it normalizes with the batch
/// statistics and updates running_mean / running_var in place (unbiased variance); otherwise it
/// uses the running statistics.
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                  const Tensor& running_var, const BatchNormOptions& o = {});

}  // namespace kiln::nd

namespace kiln {
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& a);
}  // namespace kiln
