// The IDX format's reader (kiln/frontend/idx.h): the header checked against the blob, then the
// elements copied to native byte order. kiln.data.read_idx and parse_idx (python/src/data.cc)
// build NumPy arrays on it; tests/fuzz/fuzz_idx.cc feeds it hostile blobs.
#include "kiln/frontend/idx.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include "kiln/runtime/error.h"

namespace kiln {
namespace {

constexpr IdxType kIdxTypes[] = {{0x08, "uint8", 1}, {0x09, "int8", 1},    {0x0B, ">i2", 2},
                                 {0x0C, ">i4", 4},   {0x0D, ">f4", 4},     {0x0E, ">f8", 8}};
constexpr int kMaxIdxRank = 8;

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string Where(const std::string& name) { return name.empty() ? "IDX data" : "IDX file '" + name + "'"; }

}  // namespace

IdxHeader ParseIdxHeader(const uint8_t* p, size_t n, const std::string& name) {
  const std::string what = Where(name);
  if (n < 4)
    KILN_THROW(FormatError) << what << " is " << n << " bytes, shorter than the 4-byte IDX magic number; "
                            << "the file is truncated or not an IDX file";
  if (p[0] == 0x1f && p[1] == 0x8b)
    KILN_THROW(FormatError) << what << " is gzip-compressed; decompress it first (kiln.data.read_idx "
                            << "reads .gz files)";
  const IdxType* type = nullptr;
  for (const IdxType& t : kIdxTypes)
    if (t.code == p[2]) type = &t;
  int rank = p[3];
  if (p[0] != 0 || p[1] != 0 || !type || rank < 1 || rank > kMaxIdxRank) {
    char magic[16];
    std::snprintf(magic, sizeof magic, "0x%08X", BigEndian32(p));
    KILN_THROW(FormatError) << what << " has magic number " << magic
                            << "; expected 0x00000801 (labels), 0x00000803 (images) or another IDX magic "
                            << "0x0000TTDD (TT a type code 08/09/0B/0C/0D/0E, DD 1-" << kMaxIdxRank
                            << " dimensions); the file is corrupt or not an IDX file";
  }
  size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (n < header)
    KILN_THROW(FormatError) << what << " is truncated inside its header: " << rank << " dimensions need "
                            << header << " bytes, the data has " << n;
  IdxHeader h{type, {}, header};
  // The dimensions other than zero must multiply to at most 2^40 elements (NumPy and kiln refuse
  // absurd shapes even beside a zero). 2^40 times a dimension below 2^31 can pass 2^64: a wrapped
  // count could have matched the data.
  uint64_t nonzero = 1;
  bool zero = false;
  for (int i = 0; i < rank; ++i) {
    uint32_t d = BigEndian32(p + 4 + 4 * i);
    if (d > static_cast<uint32_t>(std::numeric_limits<int32_t>::max()))
      KILN_THROW(FormatError) << what << ": dimension " << i << " is " << d << ", above 2^31-1; the header is corrupt";
    h.dims.push_back(d);
    zero |= d == 0;
    if (d != 0 && (__builtin_mul_overflow(nonzero, uint64_t{d}, &nonzero) || nonzero > (uint64_t{1} << 40)))
      KILN_THROW(FormatError) << what << ": the dimensions promise more than 2^40 elements; the header is corrupt";
  }
  const uint64_t count = zero ? 0 : nonzero;
  uint64_t expected = header + count * type->size;
  if (n != expected) {
    std::ostringstream dims;
    for (int i = 0; i < rank; ++i) dims << (i ? "x" : "") << h.dims[i];
    KILN_THROW(FormatError) << what << " has " << n << " bytes but its header (" << dims.str() << " "
                            << type->numpy << ") promises " << expected << ": "
                            << (n < expected ? "the file is truncated; download it again"
                                             : "trailing bytes follow the data; the file is corrupt");
  }
  return h;
}

void CopyIdxData(const uint8_t* p, size_t n, const IdxHeader& h, uint8_t* dst) {
  const uint8_t* src = p + h.data_offset;
  size_t bytes = n - h.data_offset, w = h.type->size;
  if (bytes == 0) return;  // a zero dimension: `dst` may be null, and memcpy must not see that
  if (w == 1 || std::endian::native == std::endian::big) {
    std::memcpy(dst, src, bytes);
  } else {
    for (size_t i = 0; i < bytes; i += w)
      for (size_t j = 0; j < w; ++j) dst[i + j] = src[i + w - 1 - j];
  }
}

}  // namespace kiln
