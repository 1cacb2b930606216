// Internal to codegen/: the LLVM half of CompileElementwise (codegen/llvm_jit.cc), kept behind
// plain functions so that only one translation unit includes LLVM's headers. Compiling and
// loading are separate steps so that the object code can be kept in the disk cache in between.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "kiln/codegen/elementwise.h"

namespace kiln::codegen::detail {

/// Lowers a validated `e` to a function named `name`, optimizes it at O3 for the host CPU and
/// returns the relocatable object file (ELF) that defines it. Writes the optimized IR to `ir`
/// when not null. Not thread-safe by itself: CompileElementwise serializes calls.
std::string CompileObject(const Expr& e, const std::string& name, std::string* ir);

/// Links an object file from CompileObject (of this process or an earlier one) into the
/// process-wide LLJIT and returns its function `name`. Throws InternalError with LLVM's message
/// when the object cannot be linked; `name` is then unusable in this process.
CompiledKernel::Fn LoadObject(std::string_view object, const std::string& name);
/// As above, the object in a resource tracker of its own: `*code` owns the code, which leaves the
/// JIT (and `name` may be defined again) when the last copy of `*code` is destroyed.
CompiledKernel::Fn LoadObject(std::string_view object, const std::string& name, std::shared_ptr<void>* code);

/// What the code CompileObject emits depends on besides the expression: LLVM's version, the
/// target triple, CPU and features. Part of the disk cache's key.
const std::string& TargetKey();

}  // namespace kiln::codegen::detail
