// Tests of the caching allocators (allocator.h): alignment, reuse of freed blocks, statistics,
// the size classes of RoundAllocationSize, EmptyCache, concurrent use, and the host pools' bound
// (trimming above KILN_CPU_POOL_MB, least recently used sizes first).
// Each test takes its own CPU device index (cpu(7) and up) so that its pool starts empty and no
// other test touches it.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"

using kiln::cpu;
using kiln::GetAllocator;
using kiln::RoundAllocationSize;

namespace {
int64_t Rounded(size_t n) { return static_cast<int64_t>(RoundAllocationSize(n)); }
}  // namespace

TEST_CASE("allocator: blocks are 64-byte aligned and writable") {
  kiln::Allocator& a = GetAllocator(cpu(7));
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{64}, size_t{65}, size_t{1000},
                   size_t{4097}, size_t{1} << 20, (size_t{1} << 20) + 1, size_t{3} << 20}) {
    CAPTURE(n);
    void* p = a.Allocate(n);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
    std::memset(p, 0xab, RoundAllocationSize(n));  // the whole size class belongs to the caller
    a.Free(p, n);
  }
  CHECK(&GetAllocator(cpu(7)) == &a);  // one allocator per device
}

TEST_CASE("allocator: a freed block is reused without a system allocation") {
  kiln::Allocator& a = GetAllocator(cpu(8));
  void* p = a.Allocate(1000);
  a.Free(p, 1000);
  int64_t sys = a.Stats().num_system_allocs;
  void* q = a.Allocate(1000);
  CHECK(q == p);
  CHECK(a.Stats().num_system_allocs == sys);
  a.Free(q, 1000);
  // A different request in the same size class (both round to 1024) reuses it too.
  REQUIRE(RoundAllocationSize(900) == RoundAllocationSize(1000));
  void* r = a.Allocate(900);
  CHECK(r == p);
  CHECK(a.Stats().num_system_allocs == sys);
  // A request in another class does not.
  void* s = a.Allocate(5000);
  CHECK(a.Stats().num_system_allocs == sys + 1);
  a.Free(r, 900);
  a.Free(s, 5000);
  // Steady state: a loop of allocate/free reaches the system allocator no more.
  sys = a.Stats().num_system_allocs;
  for (int i = 0; i < 1000; ++i) a.Free(a.Allocate(1000 + i % 3 * 2000), 1000 + i % 3 * 2000);
  CHECK(a.Stats().num_system_allocs <= sys + 2);
}

TEST_CASE("allocator: statistics track bytes in use, peak and cache") {
  kiln::Allocator& a = GetAllocator(cpu(9));
  kiln::AllocatorStats s0 = a.Stats();
  CHECK(s0.bytes_in_use == 0);
  CHECK(s0.bytes_cached == 0);
  CHECK(s0.num_allocs == 0);

  void* p = a.Allocate(100);
  void* q = a.Allocate(size_t{2} << 20);
  kiln::AllocatorStats s = a.Stats();
  CHECK(s.bytes_in_use == Rounded(100) + Rounded(size_t{2} << 20));
  CHECK(s.peak_bytes_in_use == s.bytes_in_use);
  CHECK(s.num_allocs == 2);
  CHECK(s.num_system_allocs == 2);

  a.Free(q, size_t{2} << 20);
  s = a.Stats();
  CHECK(s.bytes_in_use == Rounded(100));
  CHECK(s.bytes_cached == Rounded(size_t{2} << 20));
  CHECK(s.peak_bytes_in_use == Rounded(100) + Rounded(size_t{2} << 20));  // peak stays

  a.ResetPeak();
  CHECK(a.Stats().peak_bytes_in_use == Rounded(100));

  a.Free(p, 100);
  s = a.Stats();
  CHECK(s.bytes_in_use == 0);
  CHECK(s.bytes_cached == Rounded(100) + Rounded(size_t{2} << 20));
  CHECK(s.num_allocs == 2);
}

TEST_CASE("allocator: EmptyCache releases the cached blocks") {
  kiln::Allocator& a = GetAllocator(cpu(10));
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(a.Allocate(4096 * (i + 1)));
  void* kept = a.Allocate(777);
  for (int i = 0; i < 8; ++i) a.Free(blocks[i], 4096 * (i + 1));
  CHECK(a.Stats().bytes_cached > 0);
  a.EmptyCache();
  kiln::AllocatorStats s = a.Stats();
  CHECK(s.bytes_cached == 0);
  CHECK(s.bytes_in_use == Rounded(777));  // blocks in use are untouched
  int64_t sys = s.num_system_allocs;
  a.Free(a.Allocate(4096), 4096);
  CHECK(a.Stats().num_system_allocs == sys + 1);  // the cache is gone
  a.Free(kept, 777);
}

TEST_CASE("allocator: RoundAllocationSize size classes") {
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 5000; ++n) sizes.push_back(n);
  for (size_t n = 5000; n < (size_t{5} << 20); n += 4099) sizes.push_back(n);
  for (int b = 10; b < 48; ++b)
    for (int64_t d : {-1, 0, 1, 12345}) sizes.push_back((size_t{1} << b) + d);
  size_t prev_n = 0, prev_r = 0;
  for (size_t n : sizes) {
    size_t r = RoundAllocationSize(n);
    CAPTURE(n);
    CHECK(r >= n);
    CHECK(r >= 64);
    CHECK(r % 64 == 0);
    CHECK(RoundAllocationSize(r) == r);  // a class rounds to itself
    if (n > (size_t{1} << 20)) CHECK((r - n) * 8 <= n);  // at most 12.5% waste above 1 MiB
    else if (n > 64) CHECK(r - n < 512);
    if (n >= prev_n) CHECK(r >= prev_r);  // monotonic
    prev_n = n, prev_r = r;
  }
}

// A request too large to satisfy must fail, never return a small block. Sizes near SIZE_MAX
// come from a negative size converted to size_t (the size class must not wrap around).
TEST_CASE("allocator: an impossible request throws instead of returning a small block") {
  for (size_t n : {std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max() - 4096,
                   (size_t{1} << 63) + 1}) {
    CAPTURE(n);
    size_t r = 0;
    bool threw = false;
    try {
      r = RoundAllocationSize(n);
    } catch (const kiln::Error&) {
      threw = true;
    }
    CHECK((threw || r >= n));
  }
  kiln::Allocator& a = GetAllocator(cpu(11));
  size_t huge = std::numeric_limits<size_t>::max() - 4096;
  void* p = nullptr;
  CHECK_THROWS(p = a.Allocate(huge));
  if (p) a.Free(p, huge);
  CHECK_THROWS(a.Allocate(size_t{1} << 59));  // a valid size class, but no machine has 512 PiB
  CHECK(a.Stats().bytes_in_use == 0);
  a.Free(a.Allocate(100), 100);  // the allocator still works
  CHECK(a.Stats().bytes_in_use == 0);
}

TEST_CASE("allocator: device indices beyond the supported range are rejected") {
  CHECK_THROWS_AS(GetAllocator(cpu(64)), kiln::DeviceError);
  CHECK_THROWS_AS(GetAllocator(cpu(-1)), kiln::DeviceError);
}

TEST_CASE("allocator: concurrent allocate and free keep the statistics consistent") {
  kiln::Allocator& a = GetAllocator(cpu(12));
  constexpr int kThreads = 4, kIters = 5000;
  std::atomic<int> corrupt{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&a, &corrupt, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<void*, size_t>> live;
      for (int i = 0; i < kIters; ++i) {
        if (live.size() < 16 && (live.empty() || rng() % 2)) {
          size_t n = 1 + rng() % 100000;
          auto* p = static_cast<unsigned char*>(a.Allocate(n));
          p[0] = p[n - 1] = static_cast<unsigned char>(t);
          live.emplace_back(p, n);
        } else {
          auto [p, n] = live.back();
          live.pop_back();
          auto* c = static_cast<unsigned char*>(p);
          if (c[0] != t || c[n - 1] != t) ++corrupt;  // the block was handed out twice
          a.Free(p, n);
        }
      }
      for (auto [p, n] : live) a.Free(p, n);
    });
  for (auto& t : threads) t.join();
  CHECK(corrupt == 0);
  kiln::AllocatorStats s = a.Stats();
  CHECK(s.bytes_in_use == 0);
  CHECK(s.peak_bytes_in_use > 0);
  CHECK(s.num_system_allocs <= s.num_allocs);
  // Nothing was released to the system, so every block of the peak now sits in the cache.
  CHECK(s.bytes_cached >= s.peak_bytes_in_use);
}

TEST_CASE("allocator: a tensor's storage returns its block to the device pool") {
  kiln::Allocator& a = GetAllocator(cpu(13));
  {
    kiln::Tensor t = kiln::Tensor::Empty({1000}, kiln::DType::kFloat32, cpu(13));
    CHECK(a.Stats().bytes_in_use == Rounded(4000));
  }
  CHECK(a.Stats().bytes_in_use == 0);
  CHECK(a.Stats().bytes_cached == Rounded(4000));
}

// ---- the host pools' bound ----------------------------------------------------------------------

namespace {
constexpr int64_t kKiB = 1024, kMiB = 1024 * 1024;
}  // namespace

TEST_CASE("allocator: a host pool above its limit gives the least recently used sizes back") {
  auto pool = kiln::NewHostCachingAllocator("cpu(test)", kMiB);
  kiln::Allocator& a = *pool;
  CHECK(a.Stats().cache_limit_bytes == kMiB);
  // Eight distinct sizes of 200..340 KiB, 2.1 MiB together: freed in order, the pool must trim.
  std::vector<size_t> sizes;
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) sizes.push_back(static_cast<size_t>((200 + 20 * i) * kKiB));
  for (size_t n : sizes) blocks.push_back(a.Allocate(n));
  for (size_t i = 0; i < sizes.size(); ++i) {
    a.Free(blocks[i], sizes[i]);
    CHECK(a.Stats().bytes_cached <= kMiB);  // never above the limit, after any free
  }
  kiln::AllocatorStats s = a.Stats();
  CHECK(s.bytes_in_use == 0);
  CHECK(s.num_trims >= 1);
  CHECK(s.num_system_frees >= 1);
  CHECK(s.num_frees == 8);
  CHECK(s.peak_bytes_cached <= kMiB);
  CHECK(s.bytes_cached > 0);  // trimmed to three quarters of the limit, not emptied
  // The size freed last is still cached; the one freed first went back to the system.
  int64_t sys = s.num_system_allocs;
  void* last = a.Allocate(sizes.back());
  CHECK(last == blocks.back());
  CHECK(a.Stats().num_system_allocs == sys);
  void* first = a.Allocate(sizes.front());
  CHECK(a.Stats().num_system_allocs == sys + 1);
  a.Free(first, sizes.front());
  a.Free(last, sizes.back());
}

TEST_CASE("allocator: a size class in use survives a trim that releases idle ones") {
  auto pool = kiln::NewHostCachingAllocator("cpu(test)", 4 * kMiB);
  kiln::Allocator& a = *pool;
  const size_t hot = 1536 * kKiB;  // reused on every step of a loop
  a.Free(a.Allocate(hot), hot);
  for (int i = 0; i < 40; ++i) {  // each step: the hot size, then a size never seen before
    void* p = a.Allocate(hot);
    size_t fresh = static_cast<size_t>((300 + 8 * i) * kKiB);
    void* q = a.Allocate(fresh);
    a.Free(q, fresh);
    a.Free(p, hot);
  }
  kiln::AllocatorStats s = a.Stats();
  CHECK(s.num_trims >= 2);
  CHECK(s.peak_bytes_cached <= 4 * kMiB);
  // The hot block came from the system once and was never trimmed.
  int64_t sys = s.num_system_allocs;
  a.Free(a.Allocate(hot), hot);
  CHECK(a.Stats().num_system_allocs == sys);
  CHECK(s.num_system_allocs == 1 + 40);  // the hot block once, each fresh size once
}

TEST_CASE("allocator: a steady loop under the limit never trims") {
  auto pool = kiln::NewHostCachingAllocator("cpu(test)", 8 * kMiB);
  kiln::Allocator& a = *pool;
  const size_t sizes[] = {100, 5000, 300 * kKiB, 2 * kMiB};
  for (int i = 0; i < 2000; ++i) {
    void* p[4];
    for (int k = 0; k < 4; ++k) p[k] = a.Allocate(sizes[k]);
    for (int k = 0; k < 4; ++k) a.Free(p[k], sizes[k]);
  }
  kiln::AllocatorStats s = a.Stats();
  CHECK(s.num_trims == 0);
  CHECK(s.num_system_allocs == 4);
  CHECK(s.num_system_frees == 0);
  CHECK(s.num_frees == 8000);
}

TEST_CASE("allocator: a host pool with limit 0 caches nothing") {
  auto pool = kiln::NewHostCachingAllocator("cpu(test)", 0);
  kiln::Allocator& a = *pool;
  for (int i = 0; i < 10; ++i) {
    void* p = a.Allocate(1000);
    std::memset(p, 1, 1000);
    a.Free(p, 1000);
    CHECK(a.Stats().bytes_cached == 0);
  }
  kiln::AllocatorStats s = a.Stats();
  CHECK(s.num_system_allocs == 10);
  CHECK(s.num_system_frees == 10);
  CHECK(s.peak_bytes_cached == 0);
  CHECK_THROWS_AS(kiln::NewHostCachingAllocator("cpu(test)", -1), kiln::ValueError);
}

TEST_CASE("allocator: concurrent use of a small pool keeps it within its limit") {
  auto pool = kiln::NewHostCachingAllocator("cpu(test)", 2 * kMiB);
  kiln::Allocator& a = *pool;
  constexpr int kThreads = 4, kIters = 4000;
  std::atomic<int> corrupt{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&a, &corrupt, t] {
      std::mt19937 rng(100 + t);
      std::vector<std::pair<void*, size_t>> live;
      for (int i = 0; i < kIters; ++i) {
        if (live.size() < 8 && (live.empty() || rng() % 2)) {
          size_t n = 1 + rng() % (400 * 1024);
          auto* p = static_cast<unsigned char*>(a.Allocate(n));
          p[0] = p[n - 1] = static_cast<unsigned char>(t);
          live.emplace_back(p, n);
        } else {
          auto [p, n] = live.back();
          live.pop_back();
          auto* c = static_cast<unsigned char*>(p);
          if (c[0] != t || c[n - 1] != t) ++corrupt;  // handed out twice, or freed while in use
          a.Free(p, n);
        }
      }
      for (auto [p, n] : live) a.Free(p, n);
    });
  for (auto& t : threads) t.join();
  CHECK(corrupt == 0);
  kiln::AllocatorStats s = a.Stats();
  CHECK(s.bytes_in_use == 0);
  CHECK(s.num_trims > 0);
  CHECK(s.peak_bytes_cached <= 2 * kMiB);
  CHECK(s.num_frees == s.num_allocs);
  // Every block from the system is either cached or was given back.
  a.EmptyCache();
  kiln::AllocatorStats e = a.Stats();
  CHECK(e.bytes_cached == 0);
  CHECK(e.num_system_frees == e.num_system_allocs);
}

TEST_CASE("allocator: the CPU pools are bounded by KILN_CPU_POOL_MB and EmptyAllCaches empties them") {
  kiln::Allocator& a = GetAllocator(cpu(13));
  CHECK(a.Stats().cache_limit_bytes == kiln::CpuPoolLimitBytes());
  CHECK(kiln::CpuPoolLimitBytes() == kiln::env::GetInt("KILN_CPU_POOL_MB") * kMiB);
  if (!std::getenv("KILN_CPU_POOL_MB")) CHECK(kiln::CpuPoolLimitBytes() == 1024 * kMiB);  // the default
  kiln::EmptyAllCaches();  // what earlier test cases of this process left in cpu(13)'s pool
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(a.Allocate(static_cast<size_t>((i + 1) * 100 * kKiB)));
  for (int i = 0; i < 4; ++i) a.Free(blocks[static_cast<size_t>(i)], static_cast<size_t>((i + 1) * 100 * kKiB));
  CHECK(a.Stats().bytes_cached > 0);
  int64_t frees = a.Stats().num_system_frees;
  kiln::EmptyAllCaches();
  CHECK(a.Stats().bytes_cached == 0);
  CHECK(a.Stats().num_system_frees == frees + 4);
}
