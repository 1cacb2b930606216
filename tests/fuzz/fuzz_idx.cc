// Fuzzes the IDX reader (MNIST and Fashion-MNIST files, kiln::ParseIdxHeader and CopyIdxData:
// kiln.data.read_idx, FashionMNIST). An accepted blob's dimensions must describe exactly the
// bytes after its header, which are then copied as read_idx does.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_common.h"
#include "kiln/frontend/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  IdxHeader h;
  if (!fuzz::Accepts([&] { h = ParseIdxHeader(data, size, "fuzz.idx"); })) return 0;
  fuzz::Require(h.type != nullptr && h.data_offset <= size, "the header lies inside the blob");
  unsigned __int128 bytes = h.type->size;
  for (int64_t d : h.dims) {
    fuzz::Require(d >= 0, "dimensions are not negative");
    bytes *= static_cast<uint64_t>(d);
  }
  fuzz::Require(bytes == size - h.data_offset, "the dimensions describe exactly the data");
  std::vector<uint8_t> out(size - h.data_offset);
  CopyIdxData(data, size, h, out.data());
  return 0;
}
