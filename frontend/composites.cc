// Composite ops: compositions of primitives, so their gradients come from the primitives' rules.
// Numerical care lives here: softmax subtracts the (gradient-free) max, sigmoid uses the tanh
// form whose gradient never overflows. batch_norm in training mode is one op (batch_norm_train)
// where its layout allows, the composite elsewhere.
#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/tracer.h"

namespace kiln::nd {

Tensor sigmoid(const Tensor& x) { return add(multiply(tanh(multiply(x, 0.5)), 0.5), 0.5); }

Tensor gelu(const Tensor& x) {  // exact form: x * Phi(x)
  return multiply(multiply(x, 0.5), add(erf(multiply(x, 0.7071067811865476)), 1.0));
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor y = matmul(x, w, false, true);
  return b.defined() ? add(y, b) : y;
}

Tensor global_avg_pool2d(const Tensor& x) {
  if (x.rank() != 4)
    KILN_THROW(ShapeError) << "global_avg_pool2d: expected an NCHW tensor of rank 4, found shape " << x.shape().str();
  return mean(x, {2, 3}, true);
}

// x minus its max along `axis` (without a gradient), for exp not to overflow. A zero-length axis
// has no max (and nothing to overflow): x itself, so the result is empty, as NumPy and PyTorch.
static Tensor ShiftedByMax(const Tensor& x, int64_t axis, const char* op) {
  if (x.rank() > 0 && x.shape()[NormalizeAxis(axis, x.rank(), op)] == 0) return x;
  return subtract(x, stop_gradient(max(x, {axis}, true)));
}

Tensor log_softmax(const Tensor& x, int64_t axis) {
  Tensor shifted = ShiftedByMax(x, axis, "log_softmax");
  return subtract(shifted, log(sum(exp(shifted), {axis}, true)));
}

Tensor softmax(const Tensor& x, int64_t axis) {
  Tensor e = exp(ShiftedByMax(x, axis, "softmax"));
  return divide(e, sum(e, {axis}, true));
}

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, int64_t axis, bool sparse_label) {
  Tensor logp = log_softmax(logits, axis);
  Tensor target;
  if (sparse_label) {
    int ax = NormalizeAxis(axis, logits.rank(), "softmax_cross_entropy");
    if (ax != logits.rank() - 1)
      KILN_THROW(ValueError) << "softmax_cross_entropy: sparse labels need the class axis last, found axis "
                             << axis << " of a rank-" << logits.rank() << " tensor; transpose the logits";
    Shape expect(logits.shape());
    expect.erase(ax);
    Tensor l = labels;
    if (l.shape() != expect) {
      if (l.numel() == expect.numel()) l = reshape(l, expect.vec());
      else
        KILN_THROW(ShapeError) << "softmax_cross_entropy: labels of shape " << labels.shape().str()
                               << " do not match logits " << logits.shape().str() << "; expected labels of shape "
                               << expect.str();
    }
    if (IsFloat(l.dtype())) l = l.AsType(DType::kInt64);
    // labels=true: a label outside [0, classes) is an error, not a zero loss with a zero gradient.
    target = one_hot(l, logits.shape()[ax], 1, 0, logp.dtype(), /*labels=*/true);
  } else {
    if (labels.shape() != logits.shape())
      KILN_THROW(ShapeError) << "softmax_cross_entropy: dense labels of shape " << labels.shape().str()
                             << " must match logits " << logits.shape().str();
    target = labels.AsType(logp.dtype());
  }
  return negative(sum(multiply(target, logp), {axis}));
}

Tensor dropout(const Tensor& x, double p, bool training) {
  if (!(p >= 0 && p < 1))
    KILN_THROW(ValueError) << "dropout: the drop probability must be in [0, 1), found " << p;
  if (!training || p == 0) return x;
  Tensor keep = random::bernoulli(1 - p, x.shape(), x.dtype(), x.device());
  return multiply(x, multiply(keep, 1.0 / (1.0 - p)));
}

namespace {

// Whether training-mode batch norm of x runs as one batch_norm_train op: (N, C) or (N, C, H, W)
// data normalized over axis 1 with values in every channel, parameters of x's dtype, on a device
// whose kernel takes that dtype (the GPU's: float32 through cuDNN; the CPU's: float32, float64).
// Elsewhere the composite below runs; also on a CPU under hybridize, where the composite's
// reductions and elementwise steps fuse with the ops around it (a following relu, its backward)
// and beat the op (4 BatchNorm+ReLU layers of the small ResNet's shapes, forward and backward, on
// 2 cores: hybridized composite 1.7-1.8 ms, op 2.4 ms; eager op 2.3-2.4 ms, composite 4.5-4.6 ms).
bool UseBatchNormOp(const Tensor& x, int ax, const Tensor& gamma, const Tensor& beta) {
  if ((x.rank() != 2 && x.rank() != 4) || ax != 1 || x.numel() == 0) return false;
  if (x.device().is_cpu() && trace::Active()) return false;
  for (const Tensor* p : {&gamma, &beta})
    if (p->defined() && p->dtype() != x.dtype()) return false;
  const KernelBinding* kb = KernelTable::Get().Find(op::kBatchNormTrain, x.device().type);
  return kb && (kb->dtypes & DTypeBit(x.dtype())) != 0;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                  const Tensor& running_var, const BatchNormOptions& o) {
  int ax = NormalizeAxis(o.axis, x.rank(), "batch_norm");
  int64_t c = x.shape()[ax];
  for (const Tensor* p : {&gamma, &beta, &running_mean, &running_var})
    if (p->defined() && p->numel() != c)
      KILN_THROW(ShapeError) << "batch_norm: parameters must have " << c << " elements (the size of axis " << ax
                             << " of input " << x.shape().str() << "), found shape " << p->shape().str();
  Axes reduce, bshape(x.rank(), 1);
  bshape[ax] = c;
  for (int i = 0; i < x.rank(); ++i)
    if (i != ax) reduce.push_back(i);
  auto b = [&](const Tensor& t) { return reshape(t, bshape); };
  Tensor y;
  if (o.training && UseBatchNormOp(x, ax, gamma, beta)) {
    // One op; absent gamma/beta (scale/center off) are ones/zeros, whose gradients nobody reads.
    Tensor g = gamma.defined() ? reshape(gamma, {c}) : ones({c}, x.dtype(), x.device());
    Tensor bt = beta.defined() ? reshape(beta, {c}) : zeros({c}, x.dtype(), x.device());
    Tensor in[3] = {x, g, bt};
    std::vector<Tensor> r = Invoke(op::kBatchNormTrain, in, {{"axis", int64_t{1}}, {"eps", o.eps}});
    if (running_mean.defined() && running_var.defined()) {
      autograd::PauseScope pause(true);
      int64_t n = x.numel() / std::max<int64_t>(c, 1);
      double unbias = n > 1 ? static_cast<double>(n) / (n - 1) : 1.0;
      // The biased variance from inv_std = 1 / sqrt(var + eps).
      Tensor m = r[1].Detach();
      Tensor v = subtract(reciprocal(square(r[2].Detach())), o.eps);
      Tensor new_mean = add(multiply(running_mean, o.momentum), multiply(m, 1 - o.momentum));
      Tensor new_var = add(multiply(running_var, o.momentum), multiply(v, (1 - o.momentum) * unbias));
      new_mean.AsType(running_mean.dtype()).CopyTo(running_mean);
      new_var.AsType(running_var.dtype()).CopyTo(running_var);
    }
    return r[0];
  }
  if (o.training) {
    Tensor mu = mean(x, reduce, true);
    Tensor centered = subtract(x, mu);
    Tensor var = mean(square(centered), reduce, true);
    y = multiply(centered, rsqrt(add(var, o.eps)));
    if (running_mean.defined() && running_var.defined()) {
      autograd::PauseScope pause(true);
      int64_t n = x.numel() / std::max<int64_t>(c, 1);
      double unbias = n > 1 ? static_cast<double>(n) / (n - 1) : 1.0;
      Tensor m = reshape(mu.Detach(), {c});
      Tensor v = reshape(var.Detach(), {c});
      Tensor new_mean = add(multiply(running_mean, o.momentum), multiply(m, 1 - o.momentum));
      Tensor new_var = add(multiply(running_var, o.momentum), multiply(v, (1 - o.momentum) * unbias));
      new_mean.AsType(running_mean.dtype()).CopyTo(running_mean);
      new_var.AsType(running_var.dtype()).CopyTo(running_var);
    }
  } else {
    y = multiply(subtract(x, b(running_mean)), rsqrt(add(b(running_var), o.eps)));
  }
  if (gamma.defined()) y = multiply(y, b(gamma));
  if (beta.defined()) y = add(y, b(beta));
  return y;
}

}  // namespace kiln::nd
