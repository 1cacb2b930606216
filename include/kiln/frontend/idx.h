// The IDX file format (MNIST, Fashion-MNIST): a big-endian magic number 0x0000TTDD (TT the element
// type, DD the number of dimensions), DD big-endian 32-bit dimensions, then the elements, big-endian.
// ParseIdxHeader checks a blob completely against its header before anything is copied; every
// problem is a FormatError that names the blob. Not here: gzip, NumPy arrays (python/src/data.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

/// An element type IDX names in byte 2 of its magic number.
struct IdxType {
  uint8_t code;       ///< 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64
  const char* numpy;  ///< NumPy's name of the stored (big-endian) type: "uint8", ">f4", ...
  size_t size;        ///< bytes per element
};

/// The header of an IDX blob, checked against the blob's length.
struct IdxHeader {
  const IdxType* type = nullptr;
  std::vector<int64_t> dims;  ///< each at most 2^31-1, their product at most 2^40
  size_t data_offset = 0;     ///< where the elements start; the blob holds exactly their bytes after it
};

/// Parses and checks the header of the `n` bytes at `p`: the magic number, the dimensions, and
/// that exactly their elements follow. `name` (a path, or "") names the blob in FormatError.
IdxHeader ParseIdxHeader(const uint8_t* p, size_t n, const std::string& name);

/// Copies the elements of the checked blob `p` to `dst` in native byte order
/// (n - h.data_offset bytes).
void CopyIdxData(const uint8_t* p, size_t n, const IdxHeader& h, uint8_t* dst);

}  // namespace kiln
