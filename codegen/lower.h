// Internal to codegen/: the target-independent part of lowering an Expr to LLVM IR, shared by the
// x86 JIT (llvm_jit.cc) and the NVPTX backend (nvptx.cc). Includes LLVM headers: only codegen's
// own .cc files include it.
#pragma once

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Triple.h>

#include <string>

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

/// The host the process-wide LLJIT compiles for (llvm_jit.cc), created with the JIT on first use:
/// host kernels are built for it and linked into the JIT (LoadObject).
struct HostTarget {
  llvm::TargetMachine* tm = nullptr;  ///< the JIT's own settings: objects link as its own would
  llvm::Triple triple;
  std::string cpu, features;  ///< for each function's target-cpu / target-features
  bool have_libmvec = false;  ///< glibc's vector math is loaded: the vectorizer may call it
};
const HostTarget& Host();

/// LLVM's default O3 pipeline over `m` with `tm`'s cost model (and the passes the target adds,
/// e.g. NVPTX's NVVMReflect); with `libmvec`, exp/log/sin/cos/pow vectorize through libmvec.
void OptimizeO3(llvm::Module& m, llvm::TargetMachine* tm, bool libmvec);

/// Throws InternalError naming `what` (the expression or program) when `m` is not valid IR.
void CheckModule(llvm::Module& m, const std::string& what);

/// The host object file (ELF) of an optimized module, ready for LoadObject.
std::string EmitHostObject(llvm::Module& m);

}  // namespace kiln::codegen::detail
