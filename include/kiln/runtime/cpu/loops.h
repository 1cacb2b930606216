// Loop helpers for CPU kernels: a parallel-for over kiln's fork-join pool, and strided iteration over N-d
// shapes with several operands (each with its own strides; 0 strides broadcast).
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <cstdint>

#include "kiln/runtime/shape.h"

namespace kiln::host {

/// Threads a kernel may use (KILN_NUM_THREADS, or one per core).
int NumThreads();

/// Runs body(c) for every chunk c in [0, chunks) on kiln's fork-join pool (runtime/cpu/parallel.cc);
/// the first exception is rethrown on the calling thread after every chunk has finished.
void RunChunks(int64_t chunks, const std::function<void(int64_t)>& body);

/// Calls f(begin, end) over [0, n) split across threads when n is at least `grain`.
template <class F>
void ParallelFor(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  int nt = NumThreads();
  if (n < grain || nt == 1) {
    f(int64_t{0}, n);
    return;
  }
  int64_t chunks = std::min<int64_t>(nt, (n + grain - 1) / grain);
  RunChunks(chunks, [&](int64_t c) { f(n * c / chunks, n * (c + 1) / chunks); });
}

/// Iterates an N-d `shape` for K operands. f(offsets) is called with each operand's element
/// offset, innermost dimension fastest. Rows (all but the last dim) are split across threads.
template <size_t K, class F>
void StridedFor(const Shape& shape, const std::array<Strides, K>& strides, F&& f, int64_t grain = 32768) {
  int r = shape.rank();
  if (shape.numel() == 0) return;
  if (r == 0) {
    std::array<int64_t, K> off{};
    f(off);
    return;
  }
  int64_t inner = shape[r - 1];
  int64_t rows = shape.numel() / inner;
  ParallelFor(rows, std::max<int64_t>(1, grain / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      std::array<int64_t, K> base{};
      int64_t rem = row;
      for (int d = r - 2; d >= 0; --d) {
        int64_t idx = rem % shape[d];
        rem /= shape[d];
        for (size_t k = 0; k < K; ++k) base[k] += idx * strides[k][d];
      }
      std::array<int64_t, K> off = base;
      for (int64_t i = 0; i < inner; ++i) {
        f(off);
        for (size_t k = 0; k < K; ++k) off[k] += strides[k][r - 1];
      }
    }
  });
}

/// Strides of an input of shape `in` broadcast to `out` (0 where broadcast), given its strides.
inline Strides BroadcastStrides(const Shape& in, const Strides& in_strides, const Shape& out) {
  Strides s;
  s.resize(out.rank(), 0);
  int lead = out.rank() - in.rank();
  for (int i = 0; i < in.rank(); ++i) s[i + lead] = in[i] == 1 && out[i + lead] != 1 ? 0 : in_strides[i];
  return s;
}

}  // namespace kiln::host
