// Fuzzes the kernel cache's reader of its disk files (codegen/kernel_file.cc, what kernel_cache.cc
// reads back from KILN_CACHE_DIR before linking a kernel). The reader compares the header a request
// expects exactly; the one here is fixed (a real one holds a hash of codegen's sources, which
// would leave the checked-in seeds stale), and the seeds are kiln's own cache files under it. An
// accepted file must be exactly what the writer makes of its artifact; a rejected one is a miss.
#include <cstddef>
#include <cstdint>
#include <string>

#include "codegen/kernel_file.h"
#include "fuzz_common.h"

namespace {
constexpr std::string_view kHeader =
    "kiln-kernel 2\nkind elementwise\ntoolchain kiln-codegen fuzz; llvm 19.1.7\ntarget x86_64 avx2\n"
    "form 0:0,0,0,0000000000000000,0,0,0,0;root 0\nsymbol kiln_ew_fuzz\n";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln::codegen::detail;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::string artifact = KernelFileArtifact(bytes, kHeader);
  if (!artifact.empty())
    kiln::fuzz::Require(KernelFileBytes(kHeader, artifact) == bytes, "an accepted file is what the writer makes");
  return 0;
}
