// The GPU caching allocator (runtime/gpu_allocator.cc) on real or simulated GPUs (CTest's sim2:
// run): stream-ordered reuse through events, out-of-memory retried after emptying the cache, then
// a MemoryError with the statistics.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "gpu_skip.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/gpu.h"
#include "test_util.h"

using namespace kiln;

namespace {

// A thread bound to a stream of gpu(0), as an engine worker is, running what it is given.
class StreamThread {
 public:
  explicit StreamThread(int kind) {
    thread_ = std::thread([this, kind] {
      cuda::BindWorkerThread(gpu(0), kind);
      for (;;) {
        std::function<void()> f;
        {
          std::unique_lock<std::mutex> g(mu_);
          cv_.wait(g, [&] { return !work_.empty(); });
          f = std::move(work_.front());
          work_.pop_front();
        }
        if (!f) return;
        f();
      }
    });
  }
  ~StreamThread() {
    Post(nullptr);
    thread_.join();
  }
  template <class F>
  auto Run(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    Post([&task] { task(); });
    return result.get();
  }

 private:
  void Post(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> g(mu_);
      work_.push_back(std::move(f));
    }
    cv_.notify_one();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> work_;
  std::thread thread_;
};

void Hold(void* flag) {
  while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
}

}  // namespace

TEST_CASE("gpu allocator: a block freed on one stream is reused on another only after its event") {
  KILN_REQUIRE_GPU();
  Allocator& a = GetAllocator(gpu(0));
  const size_t n = (size_t{3} << 20) + 12345;  // a size class of its own in this test binary
  StreamThread sa(0), sb(1);
  std::atomic<bool> go{false};
  void* p = sa.Run([&] {
    void* p = a.Allocate(n);
    // The stream is still busy (with work that could be using p) when p is freed.
    gpurt::Get().LaunchHostFunc(static_cast<gpurt::Stream>(cuda::CurrentStream()), Hold, &go);
    a.Free(p, n);  // no synchronization: an event is recorded behind the pending work
    return p;
  });
  const int64_t waits = a.Stats().num_stream_waits;
  void* q = sb.Run([&] { return a.Allocate(n); });
  CHECK(q != p);  // the other stream may not have it yet
  CHECK(a.Stats().num_stream_waits == waits + 1);
  // The same stream takes it back at once: its later work runs after the pending work.
  void* r = sa.Run([&] { return a.Allocate(n); });
  CHECK(r == p);
  sa.Run([&] { a.Free(r, n); });
  go = true;
  sa.Run([] { cuda::SynchronizeWorkerStream(); });
  void* s = sb.Run([&] { return a.Allocate(n); });
  CHECK(s == p);  // the event has completed: any stream may have it
  sb.Run([&] {
    a.Free(s, n);
    a.Free(q, n);
  });
}

TEST_CASE("gpu allocator: out of memory empties the cache and retries, then raises with statistics") {
  KILN_REQUIRE_GPU();
  Allocator& a = GetAllocator(gpu(1 % NumGPUs()));
  const size_t total = gpurt::Get().Properties(1 % NumGPUs()).total_memory;
  a.EmptyCache();
  const AllocatorStats before = a.Stats();
  void* big = a.Allocate(total / 4 * 3);
  a.Free(big, total / 4 * 3);  // cached: three quarters of the device stay reserved
  CHECK(a.Stats().bytes_cached >= static_cast<int64_t>(total / 4 * 3));
  void* half = a.Allocate(total / 2);  // fits only once the cache is given back
  const AllocatorStats after = a.Stats();
  CHECK(after.num_ooms == before.num_ooms + 1);
  CHECK(after.num_cache_flushes == before.num_cache_flushes + 1);
  CHECK(after.bytes_cached == 0);
  CHECK(after.bytes_in_use >= static_cast<int64_t>(total / 2));
  CHECK(after.fragmentation() >= 0.0);
  std::string msg = testing::ErrorOf<MemoryError>([&] { a.Allocate(total); });
  CHECK(testing::Contains(msg, "out of memory on gpu("));
  CHECK(testing::Contains(msg, "after waiting for queued work and emptying the cache"));
  CHECK(testing::Contains(msg, "in use "));
  CHECK(testing::Contains(msg, "fragmentation"));
  CHECK(a.Stats().num_ooms == after.num_ooms + 2);
  a.Free(half, total / 2);
  a.EmptyCache();
}

TEST_CASE("gpu: a refused DeviceMalloc is a MemoryError naming the device and the size") {
  KILN_REQUIRE_GPU();
  const size_t total = gpurt::Get().Properties(0).total_memory;
  const size_t n = total + (size_t{1} << 30);  // more than the device has: no cache can help
  std::string msg = testing::ErrorOf<MemoryError>([&] { cuda::DeviceMalloc(gpu(0), n); });
  CHECK(testing::Contains(msg, "out of memory on gpu(0) allocating " + std::to_string(n) + " bytes"));
  void* p = cuda::DeviceMalloc(gpu(0), 4096);  // the device still works
  cuda::DeviceFree(gpu(0), p);
}
