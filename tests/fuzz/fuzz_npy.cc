// Fuzzes the .npy reader of the command-line tools (tools::ParseNpy: kiln-run --input). An
// accepted file must hold shape x dtype bytes and write back (NpyBytes) into one that reads equal.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "tools/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  ir::HostTensor t;
  if (!fuzz::Accepts([&] { t = tools::ParseNpy(bytes, "fuzz.npy"); })) return 0;
  fuzz::Require(t.bytes.size() == static_cast<size_t>(t.shape.numel()) * DTypeSize(t.dtype),
                "a tensor holds shape x dtype bytes");
  std::string again;
  fuzz::Require(fuzz::Accepts([&] { again = tools::NpyBytes(t); }), "an accepted array writes back");
  ir::HostTensor back;
  fuzz::Require(fuzz::Accepts([&] { back = tools::ParseNpy(again, "again.npy"); }) && back == t,
                "a written array reads back equal");
  return 0;
}
