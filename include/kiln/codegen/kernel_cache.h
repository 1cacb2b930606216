// The one cache of every kernel codegen generates (DESIGN.md section 9): elementwise and row
// kernels for the host, PTX for NVIDIA GPUs. Each kernel is kept in memory (the
// KILN_KERNEL_CACHE_SIZE most recently used) and on disk (KILN_CACHE_DIR) for the next one, keyed by its exact structure, its target and the
// toolchain (LLVM's version and a hash of codegen's own sources). codegen/kernel_cache.cc says how
// files are written and read. This header declares what callers outside codegen see: the kinds
// and their counters. It includes no LLVM header.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::codegen {

/// The kinds of generated kernel, counted apart.
enum class KernelKind : uint8_t {
  kElementwise, ///< CompileElementwise (host)
  kRow,         ///< CompileRow (host)
  kPtx,         ///< GeneratePtx (NVIDIA GPUs)
};
inline constexpr int kNumKernelKinds = 3;

/// "elementwise", "row", "ptx".
const char* KernelKindName(KernelKind kind);

/// Counters of the kernel cache, for one kind of kernel or all of them.
struct CodegenStats {
  int64_t compiles = 0;    ///< kernels built by LLVM
  int64_t cache_hits = 0;  ///< requests answered from the memory cache
  int64_t disk_hits = 0;   ///< kernels loaded from the disk cache instead of compiled
  int64_t disk_writes = 0; ///< kernels stored in the disk cache
  double compile_ms = 0;   ///< wall time spent compiling and loading kernels
  int64_t evictions = 0;   ///< kernels dropped from the memory cache (KILN_KERNEL_CACHE_SIZE)

  CodegenStats& operator+=(const CodegenStats& o) {
    compiles += o.compiles, cache_hits += o.cache_hits, disk_hits += o.disk_hits;
    disk_writes += o.disk_writes, compile_ms += o.compile_ms, evictions += o.evictions;
    return *this;
  }
};

/// The counters of one kind of kernel.
CodegenStats GetKernelStats(KernelKind kind);
/// The counters of every kind together (what kiln.codegen_stats() reports at its top level).
CodegenStats GetAllKernelStats();

/// The disk cache's directory (KILN_CACHE_DIR, or $XDG_CACHE_HOME/kiln, or ~/.cache/kiln), or
/// "" when it is off (KILN_CACHE_DIR=off).
std::string DiskCacheDir();

/// What the cache's keys hold besides a kernel's structure and target: the format, LLVM's version
/// and the hash of codegen's sources this library was built from ("kiln-codegen <hash>; llvm 19.1.7").
const std::string& ToolchainKey();

} // namespace kiln::codegen
