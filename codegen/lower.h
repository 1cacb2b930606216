// Internal to codegen/: the target-independent part of lowering an Expr to LLVM IR, shared by the
// x86 JIT (llvm_jit.cc) and the NVPTX backend (nvptx.cc). Includes LLVM headers: only codegen's
// own .cc files include it.
#pragma once

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <vector>

#include "kiln/codegen/elementwise.h"

namespace kiln::codegen::detail {

/// Where the functions that are not single LLVM instructions come from.
enum class MathLib {
  kHost,       ///< LLVM intrinsics (exp, log, sin, cos, pow) and libm (tanhf, erff, log1pf, expm1f)
  kLibdevice,  ///< NVIDIA's libdevice (__nv_expf, ...), linked into the module afterwards
};

/// How a kernel reads input array k at element i of the output.
struct InputRead {
  enum Kind : uint8_t {
    kIndexed,  ///< ptr[i], or ptr[(i / inner) % outer] for a broadcast input node
    kDirect,   ///< ptr[i] whatever the node says (the caller has offset ptr for this stretch of i)
    kValue,    ///< `value`, loaded by the caller (constant over the stretch of i being computed)
  } kind = kIndexed;
  llvm::Value* ptr = nullptr;
  llvm::Value* value = nullptr;
};

/// Emits the float32 value of element `i` (an i64) of `e`'s output at the builder's insert point,
/// reading input k as `inputs[k]` says. Sets contraction on the builder (a*b + c may become one
/// FMA, < 1 ulp from the unfused kernels). Throws UnsupportedError for a function it cannot lower.
llvm::Value* EmitExpr(llvm::IRBuilder<>& b, llvm::Module& m, const Expr& e, MathLib lib, llvm::Value* i,
                      const std::vector<InputRead>& inputs);

}  // namespace kiln::codegen::detail
