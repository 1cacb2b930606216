// DType, Shape and Device helpers.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "kiln/runtime/cuda.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/dtype.h"
#include "kiln/runtime/shape.h"

namespace kiln {

// ---- Half -------------------------------------------------------------------------------------

Half::Half(float f) : bits(f16::FloatToHalfBits(f)) {}

Half::operator float() const { return f16::HalfBitsToFloat(bits); }

// ---- DType ------------------------------------------------------------------------------------

namespace {
struct DTypeInfo {
  const char* name;
  size_t size;
  int rank;  // promotion order within its kind
};
constexpr DTypeInfo kInfo[kNumDTypes] = {
    {"float32", 4, 12}, {"float64", 8, 13}, {"float16", 2, 10}, {"bfloat16", 2, 11},
    {"int32", 4, 3},    {"int64", 8, 4},    {"uint8", 1, 2},    {"bool", 1, 0},
};
}  // namespace

size_t DTypeSize(DType t) { return kInfo[static_cast<int>(t)].size; }
const char* DTypeName(DType t) { return kInfo[static_cast<int>(t)].name; }

DType ParseDType(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (name == kInfo[i].name) return static_cast<DType>(i);
  if (name == "float" || name == "float_") return DType::kFloat32;
  if (name == "double") return DType::kFloat64;
  if (name == "half") return DType::kFloat16;
  if (name == "int" || name == "long") return DType::kInt64;
  // NumPy's and MXNet's integer types that kiln does not have: say what to use instead. (A dtype is
  // a kernel in every op table, on every device: kiln keeps to these eight.)
  if (name == "int8" || name == "int16" || name == "uint16" || name == "uint32" || name == "uint64")
    KILN_THROW(DTypeError) << "unknown dtype '" << name << "': kiln has no " << name
                           << "; its dtypes are float32, float64, float16, bfloat16, int32, int64, uint8, bool. "
                           << "Use int32 (or int64) for signed integers, uint8 for bytes (0..255), float16 or "
                              "bfloat16 for compact floats; convert NumPy data first, e.g. a.astype('int32')";
  KILN_THROW(DTypeError) << "unknown dtype '" << name
                         << "': expected one of float32, float64, float16, bfloat16, int32, "
                            "int64, uint8, bool";
}

bool IsFloat(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}
bool IsInteger(DType t) { return t == DType::kInt32 || t == DType::kInt64 || t == DType::kUInt8; }

DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  // float16 with bfloat16 has no exact common 16-bit type: float32, as PyTorch does.
  if ((a == DType::kFloat16 && b == DType::kBFloat16) ||
      (a == DType::kBFloat16 && b == DType::kFloat16))
    return DType::kFloat32;
  if (IsFloat(a) != IsFloat(b)) return IsFloat(a) ? a : b;
  return kInfo[static_cast<int>(a)].rank >= kInfo[static_cast<int>(b)].rank ? a : b;
}

// ---- Shape ------------------------------------------------------------------------------------

void Shape::Assign(const int64_t* p, size_t n) {
  if (n > static_cast<size_t>(kMaxRank))
    KILN_THROW(ShapeError) << "shape of rank " << n << " is not supported: kiln tensors have at most "
                           << kMaxRank << " dimensions; reshape to fewer dimensions";
  rank_ = static_cast<int>(n);
  for (size_t i = 0; i < n; ++i) d_[i] = p[i];
}

void Shape::push_back(int64_t v) {
  if (rank_ == kMaxRank)
    KILN_THROW(ShapeError) << "shape would exceed " << kMaxRank << " dimensions";
  d_[rank_++] = v;
}

void Shape::insert(int pos, int64_t v) {
  KILN_CHECK(pos >= 0 && pos <= rank_);
  push_back(0);
  for (int i = rank_ - 1; i > pos; --i) d_[i] = d_[i - 1];
  d_[pos] = v;
}

void Shape::erase(int pos) {
  KILN_CHECK(pos >= 0 && pos < rank_);
  for (int i = pos; i + 1 < rank_; ++i) d_[i] = d_[i + 1];
  --rank_;
}

void Shape::resize(int rank, int64_t fill) {
  KILN_CHECK(rank >= 0 && rank <= kMaxRank);
  for (int i = rank_; i < rank; ++i) d_[i] = fill;
  rank_ = rank;
}

int64_t Shape::numel() const {
  int64_t nonzero = 1;
  bool zero = false, overflow = false;
  for (int i = 0; i < rank_; ++i) {
    if (d_[i] == 0) zero = true;
    else overflow |= __builtin_mul_overflow(nonzero, d_[i], &nonzero);
  }
  if (overflow)
    KILN_THROW(ShapeError) << "shape " << str() << " has more elements than fit in 64 bits (at most "
                           << std::numeric_limits<int64_t>::max()
                           << "); expected a shape whose sizes multiply to a representable count";
  return zero ? 0 : nonzero;
}

int64_t Shape::NumBytes(int64_t itemsize) const {
  int64_t bytes;
  if (__builtin_mul_overflow(numel(), itemsize, &bytes))
    KILN_THROW(ShapeError) << "shape " << str() << " of " << itemsize << "-byte elements needs more bytes "
                           << "than fit in 64 bits (at most " << std::numeric_limits<int64_t>::max()
                           << "); expected a shape of fewer elements";
  return bytes;
}

Shape Shape::ContiguousStrides() const {
  Shape s;
  s.rank_ = rank_;
  int64_t acc = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    s.d_[i] = acc;
    // On overflow the outer strides are never used for an element (numel() refuses the shape
    // before any storage exists); wrap without undefined behaviour.
    if (__builtin_mul_overflow(acc, d_[i], &acc)) acc = 0;
  }
  return s;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < rank_; ++i) os << (i ? ", " : "") << d_[i];
  if (rank_ == 1) os << ",";
  os << ")";
  return os.str();
}

Shape BroadcastShapes(const Shape& a, const Shape& b, const char* op) {
  int r = std::max(a.rank(), b.rank());
  Shape out;
  out.resize(r);
  for (int i = 0; i < r; ++i) {
    int ia = a.rank() - r + i, ib = b.rank() - r + i;
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      KILN_THROW(ShapeError) << op << ": shapes " << a.str() << " and " << b.str()
                             << " do not broadcast (dimension " << i << " is " << da << " vs "
                             << db << "); each dimension must match or be 1";
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int NormalizeAxis(int64_t axis, int rank, const char* op) {
  if (axis < -rank || axis >= std::max(rank, 1))
    KILN_THROW(ShapeError) << op << ": axis " << axis << " is out of range for a tensor of rank "
                           << rank << "; expected an axis in [" << -rank << ", "
                           << std::max(rank, 1) - 1 << "]";
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

// ---- slice arithmetic --------------------------------------------------------------------------

std::vector<SliceAxis> NormalizeSlice(const Shape& shape, std::span<const int64_t> begin,
                                      std::span<const int64_t> end, std::span<const int64_t> step,
                                      const char* op) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  size_t n = std::max({begin.size(), end.size(), step.size()});
  if (n > static_cast<size_t>(shape.rank()))
    KILN_THROW(ShapeError) << op << ": " << n << " sliced axes given for an input of shape " << shape.str()
                           << " (rank " << shape.rank()
                           << "); give at most one begin/end/step entry per axis";
  std::vector<SliceAxis> out(shape.rank());
  for (int i = 0; i < shape.rank(); ++i) {
    size_t u = static_cast<size_t>(i);
    int64_t dim = shape[i];
    int64_t st = u < step.size() ? step[u] : 1;
    if (st == 0)
      KILN_THROW(ValueError) << op << ": the step of axis " << i << " is 0; steps must be non-zero";
    st = std::max(st, -kMax);  // so that -st is representable
    int64_t b = u < begin.size() ? begin[u] : (st > 0 ? kMin : kMax);
    int64_t e = u < end.size() ? end[u] : (st > 0 ? kMax : kMin);
    int64_t len;
    if (st > 0) {  // clamp to [0, dim]
      b = b < 0 ? std::max<int64_t>(b + dim, 0) : std::min(b, dim);
      e = e < 0 ? std::max<int64_t>(e + dim, 0) : std::min(e, dim);
      len = e > b ? (e - b - 1) / st + 1 : 0;
    } else {  // clamp to [-1, dim - 1]; -1 is "before the first element"
      b = b < 0 ? std::max<int64_t>(b + dim, -1) : std::min(b, dim - 1);
      e = e < 0 ? std::max<int64_t>(e + dim, -1) : std::min(e, dim - 1);
      len = b > e ? (b - e - 1) / -st + 1 : 0;
    }
    out[i] = {len ? b : 0, st, len};
  }
  return out;
}

// ---- Device -----------------------------------------------------------------------------------

std::string Device::str() const { return std::string(is_cpu() ? "cpu(" : "gpu(") + std::to_string(index) + ")"; }

void CheckDeviceExists(const Device& d) {
  if (d.index < 0)
    KILN_THROW(DeviceError) << "device index must be non-negative, found " << d.str();
  if (d.is_gpu() && NumGPUs() == 0 && !cuda::CompiledWithCuda())
    KILN_THROW(DeviceError) << d.str() << " is not available: kiln was built without CUDA "
                            << "(KILN_CUDA=OFF); use kiln.cpu(), rebuild with the CUDA toolkit installed, or "
                            << "run with KILN_GPU_SIM=2 for two simulated GPUs";
  if (d.is_gpu() && d.index >= NumGPUs())
    KILN_THROW(DeviceError) << d.str() << " does not exist: this process sees " << NumGPUs()
                            << " GPU(s); use kiln.cpu() or a GPU index below " << NumGPUs();
}

}  // namespace kiln
