// Internal to codegen/: the bytes of one kernel cache file (kernel_cache.cc reads and writes the
// files): the header the request expects (format, kind, toolchain, target, form, symbol, one per
// line), a line "object SIZE CHECKSUM" (decimal bytes, 16 hex digits), then the artifact. Kept apart
// from the cache so that its reader is fuzzed alone (tests/fuzz/fuzz_kernel_cache.cc). No LLVM here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::codegen::detail {

/// A 64-bit hash of `b` (FNV-1a, then mixed): a checksum, not security.
uint64_t HashBytes(std::string_view b);

/// splitmix64's step of `v` folded into `h`.
uint64_t Mix(uint64_t h, uint64_t v);

/// The file holding `artifact` under `header` (which ends with a newline).
std::string KernelFileBytes(std::string_view header, std::string_view artifact);

/// The artifact of `bytes` when they start with exactly `header`, the object line is well formed
/// and the artifact that follows has its size and checksum; "" otherwise (a cache miss, never an
/// error: a foreign, truncated or damaged file is rebuilt and rewritten).
std::string KernelFileArtifact(std::string_view bytes, std::string_view header);

} // namespace kiln::codegen::detail
