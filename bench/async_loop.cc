// The d2l.ai "asynchronous computation" loop in C++: y = x + 1 on a 2000x2000 float32 tensor,
// synchronous (each iteration waits for y) against asynchronous (one WaitForAll at the end).
// Prints both times, their ratio (sync / async: above 1 means queuing pays), the ratio against
// the same loop in plain C++ measured in the same run, and the CPU
// allocator's peak during the asynchronous loop next to the bound the engine's backpressure
// limits imply (the memory a fast producer can claim).
//
//   bench_async_loop [--quick]
#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench_util.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/env.h"

namespace {

using kiln::Tensor;
using kiln::bench::Emit;
using kiln::bench::MedianOf;
using kiln::bench::Timer;
using kiln::engine::Engine;

constexpr const char* kBench = "async_loop";
constexpr int64_t kSide = 2000;
constexpr double kMiB = 1 << 20;

double SyncMs(const Tensor& x, const Tensor& one, int iters) {
  Engine::Get().WaitForAll();
  Timer t;
  for (int i = 0; i < iters; ++i) {
    Tensor y = kiln::Invoke1("add", {x, one});
    y.WaitToRead();
  }
  return t.Ms();
}

double AsyncMs(const Tensor& x, const Tensor& one, int iters) {
  Engine::Get().WaitForAll();
  Timer t;
  Tensor y;
  for (int i = 0; i < iters; ++i) y = kiln::Invoke1("add", {x, one});
  Engine::Get().WaitForAll();
  return t.Ms();
}

// The same loop as plain C++ on one thread, writing one preallocated buffer: the memory-bound
// reference the kiln times are compared with.
double CppLoopMs(const std::vector<float>& x, std::vector<float>& y, int iters) {
  Timer t;
  for (int i = 0; i < iters; ++i) {
    const float* __restrict src = x.data();
    float* __restrict dst = y.data();
    for (size_t k = 0; k < x.size(); ++k) dst[k] = src[k] + 1.f;
  }
  double ms = t.Ms();
  volatile float sink = y[y.size() / 2];
  (void)sink;
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = kiln::bench::HasFlag(argc, argv, "--quick");
  const int iters = quick ? 100 : 1000;
  const int repeats = quick ? 3 : 5;

  Tensor x = Tensor::FromVector<float>(std::vector<float>(kSide * kSide, 0.5f), {kSide, kSide});
  Tensor one = Tensor::Scalar(1.0);
  SyncMs(x, one, 10);  // warm-up
  AsyncMs(x, one, 10);

  double sync = MedianOf(repeats, [&] { return SyncMs(x, one, iters); });
  Emit(kBench, "kiln_sync", "ms", sync, "ms");

  kiln::Allocator& alloc = kiln::GetAllocator(kiln::cpu());
  Engine& e = Engine::Get();
  int64_t peak = 0, peak_pending = 0;
  double async = MedianOf(repeats, [&] {
    e.WaitForAll();
    alloc.ResetPeak();
    e.ResetPeak();
    double ms = AsyncMs(x, one, iters);
    peak = std::max(peak, alloc.Stats().peak_bytes_in_use);
    peak_pending = std::max(peak_pending, e.Stats().peak_pending);
    return ms;
  });
  Emit(kBench, "kiln_async", "ms", async, "ms");
  Emit(kBench, "kiln_async/kiln_sync", "speedup", sync / async, "x");

  std::vector<float> hx(kSide * kSide, 0.5f), hy(kSide * kSide);
  double cpp = MedianOf(repeats, [&] { return CppLoopMs(hx, hy, iters); });
  Emit(kBench, "cpp_loop", "ms", cpp, "ms");
  Emit(kBench, "kiln_async/cpp_loop", "speedup", cpp / async, "x");

  // Backpressure admits a task while the pending bytes are within the limit, so the outputs of
  // at most min(max_pending, max_bytes / out_bytes + 1) tasks wait; add the output the loop holds,
  // x and the scalar. Blocks are counted at their rounded size.
  const int64_t out_bytes = kSide * kSide * 4;
  const int64_t max_bytes = kiln::env::GetInt("KILN_ENGINE_MAX_PENDING_MB") << 20;
  const int64_t max_tasks = kiln::env::GetInt("KILN_ENGINE_MAX_PENDING");
  const int64_t waiting = std::min(max_tasks, max_bytes / out_bytes + 1);
  const int64_t block = static_cast<int64_t>(kiln::RoundAllocationSize(out_bytes));
  const int64_t bound = (waiting + 2) * block + static_cast<int64_t>(kiln::RoundAllocationSize(4));
  Emit(kBench, "kiln_async", "peak_mb", peak / kMiB, "MiB");
  Emit(kBench, "kiln_async", "peak_mb_bound", bound / kMiB, "MiB");
  Emit(kBench, "kiln_async", "peak_pending", static_cast<double>(peak_pending), "tasks");
  return 0;
}
