// kiln._C bindings of the kernel compiler's counters and disk cache (kiln.codegen_stats()).
#include "bind.h"
#if KILN_WITH_CODEGEN
#include "kiln/codegen/elementwise.h"
#endif

namespace kiln::py {

KILN_PY_BIND(60) {
  m.def(
      "codegen_stats",
      [] {
        pyb::dict d;
#if KILN_WITH_CODEGEN
        codegen::CodegenStats s = codegen::GetCodegenStats();
        d["available"] = true;
        d["compiles"] = s.compiles;
        d["cache_hits"] = s.cache_hits;
        d["disk_hits"] = s.disk_hits;
        d["disk_writes"] = s.disk_writes;
        d["compile_ms"] = s.compile_ms;
        d["cache_dir"] = codegen::DiskCacheDir();
#else
        d["available"] = false;
#endif
        return d;
      },
      "Counters of the fused-kernel compiler: compiles (by LLVM), cache_hits (memory), disk_hits and "
      "disk_writes (the KILN_CACHE_DIR cache), compile_ms, cache_dir. available is False when kiln was "
      "built without LLVM.");
}

}  // namespace kiln::py
