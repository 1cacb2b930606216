// A bound epilogue group (DESIGN.md section 9): a matmul or conv2d library call with the chain of
// steps its library applies to the output (onednn.h's Epilogue), as a plan's step runs it. The
// plan builder fills it from the chain that passes/epilogue_fusion.h decided.
#pragma once

#include <span>

#include "kiln/runtime/cpu/onednn.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::host {

struct EpilogueCall {
  enum Anchor { kMatmul, kConv2d } anchor = kMatmul;
  MatmulParams matmul;
  Conv2dParams conv;
  Epilogue epilogue;
};

/// Runs `call`: `in` are the anchor's two inputs followed by the epilogue's operands, `out` the
/// output of the chain's last op.
void RunEpilogueCall(const EpilogueCall& call, std::span<const TensorView> in, const TensorView& out);

}  // namespace kiln::host
