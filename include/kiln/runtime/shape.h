// Shape: up to kMaxRank dimensions stored inline (no heap allocation on the dispatch path).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "kiln/runtime/error.h"

namespace kiln {

inline constexpr int kMaxRank = 8;

/// A list of up to kMaxRank int64 values: used for shapes and for strides (in elements).
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { Assign(dims.begin(), dims.size()); }
  explicit Shape(std::span<const int64_t> dims) { Assign(dims.data(), dims.size()); }
  explicit Shape(const std::vector<int64_t>& dims) { Assign(dims.data(), dims.size()); }

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + rank_; }
  int64_t* begin() { return d_.data(); }
  int64_t* end() { return d_.data() + rank_; }
  int64_t back() const { return d_[rank_ - 1]; }
  void push_back(int64_t v);
  void insert(int pos, int64_t v);
  void erase(int pos);
  void resize(int rank, int64_t fill = 1);
  std::vector<int64_t> vec() const { return {begin(), end()}; }

  /// Product of the dimensions (1 for rank 0). Throws ShapeError when the product of the
  /// non-zero dimensions overflows int64 (NumPy refuses such shapes even with a zero dimension).
  int64_t numel() const;
  /// numel() * itemsize, the bytes of a contiguous tensor; ShapeError when it overflows int64.
  int64_t NumBytes(int64_t itemsize) const;
  /// Row-major contiguous strides for this shape, in elements.
  Shape ContiguousStrides() const;
  std::string str() const;  // "(2, 3)"

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.d_[i] != b.d_[i]) return false;
    return true;
  }

 private:
  void Assign(const int64_t* p, size_t n);
  std::array<int64_t, kMaxRank> d_{};
  int rank_ = 0;
};

using Strides = Shape;

/// NumPy broadcasting of two shapes; throws ShapeError naming `op` when they do not broadcast.
Shape BroadcastShapes(const Shape& a, const Shape& b, const char* op);
/// Normalizes a possibly negative axis against `rank`; throws ShapeError naming `op`.
int NormalizeAxis(int64_t axis, int rank, const char* op);

/// One axis of a slice after NumPy normalization: `len` elements, the first at `begin`, `step`
/// apart (begin is 0 when len is 0).
struct SliceAxis {
  int64_t begin = 0;
  int64_t step = 1;
  int64_t len = 0;
};

/// NumPy slicing of the leading axes of `shape`: begin/end/step may each be shorter than the
/// rank (a missing entry takes the whole axis, a missing step is 1); negative indices count from
/// the end and out-of-range bounds clamp, so INT64_MIN / INT64_MAX stand for "from the start" /
/// "to the end" in either direction. Returns one entry per axis of `shape`. Throws ValueError
/// for a zero step and ShapeError for more entries than axes, both naming `op`.
std::vector<SliceAxis> NormalizeSlice(const Shape& shape, std::span<const int64_t> begin,
                                      std::span<const int64_t> end, std::span<const int64_t> step,
                                      const char* op);

}  // namespace kiln
