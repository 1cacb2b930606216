// A small, strict reader and writer of NumPy's .npy format (versions 1.0, 2.0 and 3.0 headers) for
// the command-line tools: C order only, little-endian '<f2' '<f4' '<f8' '<i4' '<i8' and '|u1'
// '|b1'. Everything else (Fortran order, big-endian data, other dtypes, object arrays, truncated
// or oversized data) is a FormatError that names the file and says what to do. Not here: .npz
// archives, memory mapping, strided or structured arrays.
#pragma once

#include <string>

#include "kiln/ir/serialize.h"

namespace kiln::tools {

/// Reads a .npy file into host bytes (dtype, shape, dense little-endian C-order data).
ir::HostTensor ReadNpy(const std::string& path);
/// Parses the bytes of a .npy file; `source` names it in error messages.
ir::HostTensor ParseNpy(const std::string& bytes, const std::string& source);
/// The bytes of a version 1.0 .npy file holding `t` (bfloat16 has no NumPy dtype: ValueError).
std::string NpyBytes(const ir::HostTensor& t);
/// Writes NpyBytes(t) to `path` atomically.
void WriteNpy(const std::string& path, const ir::HostTensor& t);

}  // namespace kiln::tools
