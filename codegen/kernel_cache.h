// Internal to codegen/: the kernel cache's one entry point, used by CompileElementwise,
// CompileRow and GeneratePtx. A caller describes its kernel by an exact form (a string that
// determines the generated code), a target key, and two functions: one that builds the artifact
// (an object file, PTX text) and one that turns an artifact into the kernel object. The cache
// answers from memory, else from disk, else builds and stores. No LLVM here.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kiln/codegen/elementwise.h"
#include "kiln/codegen/kernel_cache.h"

namespace kiln::codegen::detail {

/// How a kernel object was obtained, for its compile_ms() and from_disk().
struct Obtained {
  double ms = 0;          ///< wall time of building or loading (so far, when make runs)
  bool from_disk = false; ///< the artifact came from the disk cache
  /// Owns the linked code (null: none, or code that lives as long as the process): the kernel
  /// object keeps it, so the code goes when the last holder of the kernel does.
  std::shared_ptr<void> code;
};

struct KernelRequest {
  KernelKind kind = KernelKind::kElementwise;
  /// The kernel's exact form: equal forms are the same kernel, in memory and on disk.
  std::string form;
  /// What the code depends on besides the form (TargetKey(), a GPU architecture...).
  std::string target;
  /// Symbols of this kind share one namespace (the process-wide JIT): a symbol is never defined
  /// twice, so a hash collision or a failed link gets a fresh name (and no disk cache).
  bool unique_symbols = true;
  /// The kernel's symbol when the cache does not choose one (unique_symbols false).
  std::string symbol;
  /// Builds the artifact that defines `symbol`; writes the optimized IR to `ir`.
  std::function<std::string(const std::string& symbol, std::string* ir)> build;
  /// Makes the artifact defining `symbol` (built now or read from disk) usable: links a host
  /// object into the process-wide JIT and returns the function's address (PTX: nullptr), setting
  /// `code` to the owner of the linked code (LoadObject). Throws InternalError when it cannot (a
  /// file from disk is then built again under a fresh name).
  std::function<void*(std::string_view artifact, const std::string& symbol, std::shared_ptr<void>* code)> link;
  /// Wraps what link returned into the kernel object the caller returns (never fails).
  std::function<std::shared_ptr<void>(void* linked, std::string_view artifact, const std::string& symbol,
                                      const Obtained&)>
      make;
};

/// The kernel of `r`: from the memory cache, else loaded from the disk cache, else built (and
/// stored on disk). The memory cache keeps the KILN_KERNEL_CACHE_SIZE most recently used kernels;
/// an evicted kernel's code is removed from the JIT once nothing else holds the kernel. Thread-safe; one kernel is never built twice at once. InternalError from
/// build or link propagates (the caller turns it into UnsupportedError); disk failures never do.
std::shared_ptr<void> GetOrBuild(const KernelRequest& r);

template <class K> std::shared_ptr<K> GetOrBuildAs(const KernelRequest& r) {
  return std::static_pointer_cast<K>(GetOrBuild(r));
}

/// The disk cache file of a kernel of `kind` with this form and target; "" when the cache is off.
std::string DiskCacheFileOf(KernelKind kind, const std::string& form, const std::string& target);

/// The optimized IR of the most recently built kernel of `kind` ("" when it came from disk).
std::string LastIR(KernelKind kind);

/// The exact form of `e` (constants as bit patterns) for KernelRequest::form.
std::string ExactForm(const Expr& e);

} // namespace kiln::codegen::detail
