// Hand-written float32 kernels for the NN cases where oneDNN's kernels on kiln's plain NCHW
// layouts are slow (runtime/cpu/direct_nn.cc): convolutions with one input channel (the first
// layer of an MNIST-style network; forward and weight gradient) and non-overlapping average
// pooling. Each returns false, doing nothing, when the case is not one it handles; nn_dispatch.cc
// tries them first. Same contracts as onednn.h: contiguous operands, outputs overwritten. The
// plain loops of reference_nn.cc are what tests compare them against.
#pragma once

#include "kiln/runtime/cpu/onednn.h"

namespace kiln::host::direct {

/// One input channel, no groups, stride 1, no dilation (any padding and kernel size).
bool Conv2d(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p);
bool Conv2dGradWeight(const TensorView& dy, const TensorView& x, const TensorView& dw, const Conv2dParams& p);

/// Windows that tile the input: stride equal to the kernel, no padding (floor mode drops the
/// last rows and columns when they do not fill a window).
bool AvgPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p);
bool AvgPool2dGrad(const TensorView& dy, const TensorView& dx, const Pool2dParams& p);

} // namespace kiln::host::direct
