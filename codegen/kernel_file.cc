// The kernel cache file's bytes (kernel_file.h): writing one, and reading one back strictly.
#include "kernel_file.h"

#include <cinttypes>
#include <cstdio>

namespace kiln::codegen::detail {

uint64_t Mix(uint64_t h, uint64_t v) {
  v += 0x9e3779b97f4a7c15ULL + h;
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
  return v ^ (v >> 31);
}

uint64_t HashBytes(std::string_view b) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : b) h = (h ^ c) * 0x100000001b3ULL;
  return Mix(h, b.size());
}

std::string KernelFileBytes(std::string_view header, std::string_view artifact) {
  char sum[17];
  std::snprintf(sum, sizeof sum, "%016" PRIx64, HashBytes(artifact));
  std::string bytes(header);
  bytes.append("object ").append(std::to_string(artifact.size())).append(" ").append(sum).append("\n");
  bytes.append(artifact);
  return bytes;
}

std::string KernelFileArtifact(std::string_view bytes, std::string_view header) {
  if (bytes.substr(0, header.size()) != header) return {};
  std::string_view rest = bytes.substr(header.size());
  size_t eol = rest.find('\n');
  if (eol == std::string_view::npos || rest.substr(0, 7) != "object ") return {};
  std::string_view line = rest.substr(7, eol - 7);
  uint64_t size = 0, sum = 0;
  size_t i = 0;
  // Digits only: at most 19 (below 2^63, more than any file), then one space and 16 hex digits.
  for (; i < line.size() && i < 19 && line[i] >= '0' && line[i] <= '9'; ++i) size = size * 10 + (line[i] - '0');
  // Only the form the writer makes: no leading zero (fuzz_kernel_cache found "01064" accepted).
  if (i == 0 || (line[0] == '0' && i > 1) || line.size() != i + 1 + 16 || line[i] != ' ') return {};
  for (char c : line.substr(i + 1)) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return {};
    sum = sum << 4 | static_cast<uint64_t>(d);
  }
  std::string_view artifact = rest.substr(eol + 1);
  if (artifact.size() != size || HashBytes(artifact) != sum) return {};
  return std::string(artifact);
}

} // namespace kiln::codegen::detail
