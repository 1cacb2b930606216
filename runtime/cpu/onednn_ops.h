// The oneDNN kernel of each neural-network op, as the dispatcher (nn_dispatch.cc) calls it:
// false (or -1) where oneDNN has no kernel for the dtype or the case, and the caller falls back.
// Internal to runtime/cpu; includes no dnnl header (onednn_prim.h has the oneDNN machinery).
#pragma once

#include <span>

#include "kiln/runtime/cpu/onednn.h"

namespace kiln::host::onednn {

bool Matmul(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p);
bool Conv2d(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p);
bool Conv2dGradData(const TensorView& dy, const TensorView& w, const TensorView& dx, const Conv2dParams& p);
bool Conv2dGradWeight(const TensorView& dy, const TensorView& x, const TensorView& dw, const Conv2dParams& p);
bool MaxPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p);
bool MaxPool2dGrad(const TensorView& dy, const TensorView& x, const TensorView& dx, const Pool2dParams& p);
bool AvgPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p);
bool AvgPool2dGrad(const TensorView& dy, const TensorView& dx, const Pool2dParams& p);
/// Matmul or conv2d (float32, non-empty, contiguous) with as many of `e`'s first steps as oneDNN
/// takes as post-ops; returns how many it applied (the caller runs the rest), -1 when oneDNN has
/// no kernel for the case.
int MatmulEpilogue(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p,
                   const Epilogue& e, std::span<const TensorView> operands);
int Conv2dEpilogue(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p,
                   const Epilogue& e, std::span<const TensorView> operands);

/// Counters of the primitive cache.
OneDnnCacheStats CacheStats();

}  // namespace kiln::host::onednn
