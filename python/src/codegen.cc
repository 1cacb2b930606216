// kiln._C bindings of the kernel cache's counters and directory (kiln.codegen_stats()).
#include "bind.h"
#if KILN_WITH_CODEGEN
#include "kiln/codegen/kernel_cache.h"
#endif

namespace kiln::py {

#if KILN_WITH_CODEGEN
namespace {
void Put(pyb::dict& d, const codegen::CodegenStats& s) {
  d["compiles"] = s.compiles;
  d["cache_hits"] = s.cache_hits;
  d["disk_hits"] = s.disk_hits;
  d["disk_writes"] = s.disk_writes;
  d["compile_ms"] = s.compile_ms;
  d["evictions"] = s.evictions;
}
} // namespace
#endif

KILN_PY_BIND(60) {
  m.def(
      "codegen_stats",
      [] {
        pyb::dict d;
#if KILN_WITH_CODEGEN
        d["available"] = true;
        Put(d, codegen::GetAllKernelStats());
        pyb::dict kinds;
        for (int k = 0; k < codegen::kNumKernelKinds; ++k) {
          pyb::dict one;
          auto kind = static_cast<codegen::KernelKind>(k);
          Put(one, codegen::GetKernelStats(kind));
          kinds[codegen::KernelKindName(kind)] = one;
        }
        d["kinds"] = kinds;
        d["cache_dir"] = codegen::DiskCacheDir();
        d["toolchain"] = codegen::ToolchainKey();
#else
        d["available"] = false;
#endif
        return d;
      },
      "Counters of the kernel cache, over every generated kernel: compiles (by LLVM), cache_hits "
      "(memory), disk_hits and disk_writes (the KILN_CACHE_DIR cache), compile_ms, evictions (from memory: "
      "KILN_KERNEL_CACHE_SIZE); the same per kind "
      "under kinds ('elementwise', 'row', 'ptx'); cache_dir; toolchain (what the cache's keys hold "
      "besides a kernel and its target). available is False when kiln was built without LLVM.");
}

} // namespace kiln::py
