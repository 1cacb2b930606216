// kiln._C data helpers: IDX files (MNIST, Fashion-MNIST; the format is frontend/idx.cc) as NumPy
// arrays, and the batch conversion the DataLoader uses (gather uint8 images, scale, normalize, HWC -> CHW, in one pass without the GIL).
// Deliberately not here: gzip (the extension does not link zlib; kiln.data.read_idx decompresses
// with Python's gzip module and hands the bytes to parse_idx), shuffling, threading (Python's).
#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "bind.h"
#include "kiln/frontend/idx.h"
#include "kiln/runtime/error.h"

namespace kiln::py {
namespace {

// A NumPy array (native byte order) holding the IDX blob's values.
pyb::array ParseIdx(const uint8_t* p, size_t n, const std::string& name) {
  IdxHeader h = ParseIdxHeader(p, n, name);
  std::vector<ssize_t> dims(h.dims.begin(), h.dims.end());
  pyb::dtype stored(h.type->numpy);
  pyb::dtype native = stored.attr("newbyteorder")("=");
  pyb::array out(native, dims);
  {
    pyb::gil_scoped_release nogil;
    CopyIdxData(p, n, h, static_cast<uint8_t*>(out.mutable_data()));
  }
  return out;
}

pyb::array ReadIdxFile(const std::string& path) {
  std::string bytes;
  {
    pyb::gil_scoped_release nogil;
    std::ifstream f(path, std::ios::binary);
    if (!f) KILN_THROW(ValueError) << "read_idx: cannot open '" << path << "'";
    std::ostringstream ss;
    ss << f.rdbuf();
    bytes = std::move(ss).str();
  }
  return ParseIdx(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

std::vector<float> PerChannel(const std::vector<double>& v, int64_t channels, const char* what) {
  if (v.size() != 1 && static_cast<int64_t>(v.size()) != channels)
    KILN_THROW(ValueError) << "images_to_batch: " << what << " has " << v.size() << " values; expected 1 or "
                           << channels << " (one per channel)";
  std::vector<float> out(channels);
  for (int64_t c = 0; c < channels; ++c) out[c] = static_cast<float>(v.size() == 1 ? v[0] : v[c]);
  return out;
}

// out[b, c, y, x] = (images[indices[b], y, x, c] * scale - mean[c]) / std[c], as float32.
Tensor ImagesToBatch(const pyb::array& images, const pyb::array& indices, double scale,
                     const std::vector<double>& mean, const std::vector<double>& stdev,
                     std::optional<Device> device) {
  if (images.dtype().kind() != 'u' || images.itemsize() != 1)
    KILN_THROW(DTypeError) << "images_to_batch: expected uint8 images, got " << std::string(pyb::str(images.dtype()));
  if (images.ndim() != 3 && images.ndim() != 4)
    KILN_THROW(ShapeError) << "images_to_batch: expected images of shape (N, H, W) or (N, H, W, C), got rank "
                           << images.ndim();
  if (!(images.flags() & pyb::array::c_style))
    KILN_THROW(ValueError) << "images_to_batch: images must be C-contiguous (np.ascontiguousarray)";
  auto idx = pyb::array_t<int64_t, pyb::array::c_style | pyb::array::forcecast>::ensure(indices);
  if (!idx || idx.ndim() != 1) KILN_THROW(ShapeError) << "images_to_batch: indices must be a 1-d integer array";
  const int64_t n = images.shape(0), h = images.shape(1), w = images.shape(2);
  const int64_t c = images.ndim() == 4 ? images.shape(3) : 1, b = idx.shape(0);
  const std::vector<float> m = PerChannel(mean, c, "mean"), s = PerChannel(stdev, c, "std");
  const int64_t* ix = idx.data();
  for (int64_t i = 0; i < b; ++i)
    if (ix[i] < 0 || ix[i] >= n)
      KILN_THROW(ValueError) << "images_to_batch: index " << ix[i] << " is out of range for " << n << " images";
  Tensor out = Tensor::Empty(Shape{b, c, h, w}, DType::kFloat32, cpu());
  {
    pyb::gil_scoped_release nogil;
    const auto* src = static_cast<const uint8_t*>(images.data());
    float* dst = static_cast<float*>(out.storage()->data());
    const int64_t plane = h * w;
    for (int64_t i = 0; i < b; ++i) {
      const uint8_t* img = src + ix[i] * plane * c;
      for (int64_t ch = 0; ch < c; ++ch) {
        const float k = static_cast<float>(scale) / s[ch], off = -m[ch] / s[ch];
        float* o = dst + (i * c + ch) * plane;
        for (int64_t p = 0; p < plane; ++p) o[p] = static_cast<float>(img[p * c + ch]) * k + off;
      }
    }
  }
  if (device && !device->is_cpu()) {
    pyb::gil_scoped_release nogil;
    return out.To(*device);
  }
  return out;
}

}  // namespace

KILN_PY_BIND(40) {
  m.def("parse_idx", [](const pyb::buffer& data, const std::string& name) {
    pyb::buffer_info info = data.request();
    return ParseIdx(static_cast<const uint8_t*>(info.ptr), static_cast<size_t>(info.size * info.itemsize), name);
  }, pyb::arg("data"), pyb::arg("name") = "",
        "Parses the bytes of an uncompressed IDX file (MNIST's format) into a NumPy array; raises "
        "kiln.FormatError on a bad magic number, a truncated header or data of the wrong length.");
  m.def("read_idx", &ReadIdxFile, pyb::arg("path"),
        "Reads an uncompressed IDX file into a NumPy array (kiln.data.read_idx also reads .gz files).");
  m.def("images_to_batch", &ImagesToBatch, pyb::arg("images"), pyb::arg("indices"),
        pyb::arg("scale") = 1.0 / 255.0, pyb::arg("mean") = std::vector<double>{0.0},
        pyb::arg("std") = std::vector<double>{1.0}, pyb::arg("device") = pyb::none(),
        "Gathers uint8 images (N, H, W[, C]) at `indices` into a float32 (B, C, H, W) NDArray with "
        "(x * scale - mean) / std per channel; the loop runs without the GIL.");
}

}  // namespace kiln::py
