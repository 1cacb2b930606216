// Internal to codegen/: the LLVM half of CompileElementwise (codegen/llvm_jit.cc), kept behind a
// plain function so that only one translation unit includes LLVM's headers.
#pragma once

#include <string>

#include "kiln/codegen/elementwise.h"

namespace kiln::codegen::detail {

/// Lowers a validated `e` to LLVM IR, optimizes it at O3 for the host CPU and JITs it through the
/// process-wide LLJIT (created on first use). Writes the optimized IR to `ir` when not null.
/// Not thread-safe by itself: CompileElementwise serializes calls.
CompiledKernel::Fn JitElementwise(const Expr& e, std::string* ir);

}  // namespace kiln::codegen::detail
