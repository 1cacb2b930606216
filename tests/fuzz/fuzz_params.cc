// Fuzzes the params reader (NAME-0000.params, the safetensors layout, ir::ParseParams: what
// LoadParams, kiln::load and load_parameters read). An accepted file's tensors must hold exactly
// shape x dtype bytes, under distinct names.
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "fuzz_common.h"
#include "kiln/ir/serialize.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::vector<ir::NamedHostTensor> params;
  std::map<std::string, std::string> metadata;
  if (!fuzz::Accepts([&] { params = ir::ParseParams(bytes, "fuzz.params", &metadata); })) return 0;
  std::set<std::string> names;
  size_t total = 0;
  for (const auto& [name, t] : params) {
    fuzz::Require(names.insert(name).second, "names are distinct");
    fuzz::Require(t.bytes.size() == static_cast<size_t>(t.shape.numel()) * DTypeSize(t.dtype),
                  "a tensor holds shape x dtype bytes");
    total += t.bytes.size();
  }
  fuzz::Require(total <= size, "the tensors hold no more bytes than the file");
  return 0;
}
