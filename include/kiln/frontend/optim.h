// Fused multi-tensor optimizer updates (SGD with momentum, Adam, AdamW) in MXNet's semantics.
//
// One call queues ONE engine task for all the parameters it is given: the task reads the
// gradients and writes the weights and optimizer states in place. All tensors of a call must be
// on one device (kiln.Trainer makes one call per device). On the CPU the update runs over the
// parameters' elements as one flat range split across kiln's CPU threads; on a GPU it is one
// kernel launch per parameter on the device's compute stream.
//
// What it does not do: allocate states (callers pass zero-initialized tensors like the weights),
// mixed precision (weights, gradients and states share one dtype, float32 or float64), or
// learning-rate schedules (callers pass
// the rate of this step).
#pragma once

#include <span>
#include <vector>

#include "kiln/frontend/tensor.h"

namespace kiln::optim {

/// SGD, in MXNet's formulation, per element of parameter i:
///   g = clip(rescale_grad * grad) + wd_i * w
///   momentum > 0:  mom = momentum * mom - lr_i * g;  w += mom
///   momentum == 0: w -= lr_i * g
/// where lr_i = lr * lr_mult[i] and wd_i = wd * wd_mult[i].
struct SGDOptions {
  double lr = 0.01;
  double momentum = 0;
  double wd = 0;
  double rescale_grad = 1;
  double clip_gradient = -1;    ///< clips rescale_grad * grad to [-c, c]; <= 0: no clipping
  std::vector<double> lr_mult;  ///< one per parameter, or empty (all 1)
  std::vector<double> wd_mult;  ///< one per parameter, or empty (all 1)
};

/// Adam (decoupled = false) or AdamW (decoupled = true), bias-corrected as in PyTorch:
///   Adam:  g = clip(rescale_grad * grad + wd_i * w)
///   AdamW: g = clip(rescale_grad * grad);  w -= lr_i * wd_i * w
///   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
///   w -= lr_i / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + epsilon)
/// (Adam clips after adding weight decay, as MXNet's adam_update does.)
struct AdamOptions {
  double lr = 0.001;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double wd = 0;
  double rescale_grad = 1;
  double clip_gradient = -1;  ///< <= 0: no clipping
  int64_t t = 1;              ///< the step number, from 1, for bias correction
  bool decoupled = false;     ///< AdamW's decoupled weight decay
  std::vector<double> lr_mult;
  std::vector<double> wd_mult;
};

/// Updates `weights` (and `moms`, when o.momentum != 0) in place from `grads`, in one engine task.
/// `moms` may be empty when o.momentum == 0. Throws ShapeError, DTypeError, DeviceError or
/// ValueError, naming the parameter's index, when the lists do not match.
void SGDUpdate(std::span<const Tensor> weights, std::span<const Tensor> grads, std::span<const Tensor> moms,
               const SGDOptions& o);

/// Updates `weights`, `means` and `vars` in place from `grads`, in one engine task.
void AdamUpdate(std::span<const Tensor> weights, std::span<const Tensor> grads, std::span<const Tensor> means,
                std::span<const Tensor> vars, const AdamOptions& o);

}  // namespace kiln::optim
