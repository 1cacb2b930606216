// Caching allocators: one pool per CPU device, plus one for pinned host memory, each keeping at
// most KILN_CPU_POOL_MB cached (the least recently used size classes go back to the system first);
// GPUs have their stream-ordered caching allocator in gpu_allocator.cc.
#include "kiln/runtime/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <atomic>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "kiln/runtime/error.h"
#include "kiln/runtime/profiler.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/env.h"

namespace kiln {

void CheckAllocationSize(size_t n, const std::string& where) {
  if (n > kMaxAllocationBytes)
    KILN_THROW(MemoryError) << "cannot allocate " << n << " bytes on " << where << ": expected at most "
                            << kMaxAllocationBytes << " bytes (1 EiB), larger than any machine's memory "
                            << "(a negative size converted to unsigned?)";
}

size_t RoundAllocationSize(size_t n) {
  CheckAllocationSize(n, "any device");
  if (n <= 64) return 64;
  if (n <= (1u << 20)) return (n + 511) & ~size_t{511};
  // Above 1 MiB: round up to an eighth of the enclosing power of two (at most 12.5% waste).
  size_t p = size_t{1} << (63 - __builtin_clzll(n - 1));
  size_t step = p / 8;
  return (n + step - 1) / step * step;
}

namespace {

// The pools' lock: held for a few loads and stores, so a spin lock (one atomic exchange to take,
// a plain store to release) costs less than a mutex (two atomic operations) on every tiny tensor.
class PoolLock {
 public:
  void lock() {
    for (int spins = 0; flag_.exchange(true, std::memory_order_acquire);)
      while (flag_.load(std::memory_order_relaxed))
        if (++spins > 1000) std::this_thread::yield();
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

class CachingAllocator final : public Allocator {
 public:
  using RawAlloc = std::function<void*(size_t)>;
  using RawFree = std::function<void(void*)>;
  // `limit`: the most bytes kept cached (-1: no bound). `host`: its memory comes from malloc, so a
  // trim also asks malloc to hand its free pages back to the operating system.
  CachingAllocator(RawAlloc a, RawFree f, std::string label, int64_t limit, bool host)
      : raw_alloc_(std::move(a)), raw_free_(std::move(f)), label_(std::move(label)), host_(host) {
    stats_.cache_limit_bytes = limit;
  }
  ~CachingAllocator() override {  // the process's pools are never destroyed; a test's are
    EmptyCache();
  }

  void* Allocate(size_t nbytes) override {
    CheckAllocationSize(nbytes, where());
    size_t size = RoundAllocationSize(nbytes);
    {
      std::lock_guard<PoolLock> g(mu_);
      ++stats_.num_allocs;
      SizeClass* c = Find(size);
      if (c && !c->blocks.empty()) {
        void* p = c->blocks.back();
        c->blocks.pop_back();
        c->used = ++tick_;
        stats_.bytes_cached -= static_cast<int64_t>(size);
        Use(size);
        stats_.bytes_requested += static_cast<int64_t>(nbytes);
        return p;
      }
      ++stats_.num_system_allocs;
    }
    void* p = nullptr;
    try {
      p = raw_alloc_(size);
    } catch (const std::bad_alloc&) {
    } catch (const MemoryError&) {  // pinned host memory: the GPU platform's out-of-memory
    }
    if (!p) {
      Count(&AllocatorStats::num_ooms);
      EmptyCache();  // give the cache back and try once more
      try {
        p = raw_alloc_(size);
      } catch (const std::bad_alloc&) {
      } catch (const MemoryError&) {
      }
      if (!p) {
        Count(&AllocatorStats::num_ooms);
        KILN_THROW(MemoryError) << "out of memory on " << where() << " allocating " << nbytes << " bytes ("
                                << size << " with rounding) after emptying the cache; in use "
                                << Stats().bytes_in_use << " bytes; free tensors or use smaller batches";
      }
    }
    std::lock_guard<PoolLock> g(mu_);
    Use(size);
    stats_.bytes_requested += static_cast<int64_t>(nbytes);
    return p;
  }

  void Free(void* p, size_t nbytes) override {
    if (!p) return;
    size_t size = RoundAllocationSize(nbytes);
    std::vector<void*> victims;
    bool trimmed = false;
    {
      std::lock_guard<PoolLock> g(mu_);
      ++stats_.num_frees;
      stats_.bytes_in_use -= static_cast<int64_t>(size);
      stats_.bytes_requested -= static_cast<int64_t>(nbytes);
      Sample();
      if (stats_.cache_limit_bytes == 0) {  // nothing is cached
        ++stats_.num_system_frees;
        victims.push_back(p);
      } else {
        SizeClass* c = Find(size);
        if (!c) c = &pool_[size];
        c->blocks.push_back(p);
        c->used = ++tick_;
        stats_.bytes_cached += static_cast<int64_t>(size);
        if (stats_.bytes_cached > stats_.cache_limit_bytes && stats_.cache_limit_bytes > 0) {
          Trim(&victims);
          trimmed = true;
        }
        stats_.peak_bytes_cached = std::max(stats_.peak_bytes_cached, stats_.bytes_cached);
      }
    }
    if (victims.empty()) return;
    for (void* v : victims) raw_free_(v);
    if (trimmed) ReturnToSystem();
  }

  AllocatorStats Stats() const override {
    std::lock_guard<PoolLock> g(mu_);
    return stats_;
  }
  void ResetPeak() override {
    std::lock_guard<PoolLock> g(mu_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
    stats_.peak_bytes_cached = stats_.bytes_cached;
  }
  void EmptyCache() override {
    std::unordered_map<size_t, SizeClass> pool;
    std::vector<SizeClass> small(kSmallClasses);
    int64_t n = 0;
    {
      std::lock_guard<PoolLock> g(mu_);
      pool.swap(pool_);
      for (size_t i = 0; i < kSmallClasses; ++i) small[i].blocks.swap(small_[i].blocks);
      stats_.bytes_cached = 0;
      ++stats_.num_cache_flushes;
      for (auto& [size, c] : pool) n += static_cast<int64_t>(c.blocks.size());
      for (auto& c : small) n += static_cast<int64_t>(c.blocks.size());
      stats_.num_system_frees += n;
    }
    for (auto& [size, c] : pool)
      for (void* p : c.blocks) raw_free_(p);
    for (auto& c : small)
      for (void* p : c.blocks) raw_free_(p);
    if (n) ReturnToSystem();
  }

 private:
  struct SizeClass {
    std::vector<void*> blocks;
    uint64_t used = 0;  // tick_ when a block of this class was last freed or handed out
  };
  // Size classes up to kSmallMax (64 bytes, then multiples of 512) have a pool in an array; the
  // larger ones live in the map.
  static constexpr size_t kSmallMax = 64 << 10;
  static constexpr size_t kSmallClasses = kSmallMax / 512 + 1;
  SizeClass* Find(size_t size) {
    if (size > kSmallMax) {
      auto it = pool_.find(size);
      return it == pool_.end() ? nullptr : &it->second;
    }
    return &small_[size == 64 ? 0 : size / 512];
  }

  // Under mu_, the cache above its limit: takes blocks of the least recently used classes into
  // `victims` until a quarter of the limit is free again, so that a loop whose cache hovers at
  // the limit trims once per quarter of the limit it frees, not on every free.
  void Trim(std::vector<void*>* victims) {
    const int64_t target = stats_.cache_limit_bytes / 4 * 3;
    std::vector<std::pair<uint64_t, size_t>> order;  // (last use, size) of the classes holding blocks
    for (auto& [size, c] : pool_)
      if (!c.blocks.empty()) order.emplace_back(c.used, size);
    for (size_t i = 0; i < kSmallClasses; ++i)
      if (!small_[i].blocks.empty()) order.emplace_back(small_[i].used, i == 0 ? 64 : i * 512);
    std::sort(order.begin(), order.end());
    for (const auto& [used, size] : order) {
      SizeClass& c = *Find(size);
      while (!c.blocks.empty() && stats_.bytes_cached > target) {
        victims->push_back(c.blocks.back());
        c.blocks.pop_back();
        stats_.bytes_cached -= static_cast<int64_t>(size);
      }
      if (c.blocks.empty() && size > kSmallMax) pool_.erase(size);
      if (stats_.bytes_cached <= target) break;
    }
    ++stats_.num_trims;
    stats_.num_system_frees += static_cast<int64_t>(victims->size());
  }

  // malloc keeps the pages of freed blocks below its mmap threshold; this hands them back.
  void ReturnToSystem() {
#if defined(__GLIBC__)
    if (host_) malloc_trim(0);
#endif
  }

  std::string where() const { return label_.substr(label_.find(' ') + 1); }  // "cpu(0)"
  void Use(size_t size) {
    stats_.bytes_in_use += static_cast<int64_t>(size);
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
    Sample();
  }
  void Sample() {  // under mu_: the profiler's memory counter, in the order of the changes
    if (profiler::Enabled(profiler::kMemory))
      profiler::Counter(profiler::kMemory, label_, "bytes_in_use", static_cast<double>(stats_.bytes_in_use));
  }
  void Count(int64_t AllocatorStats::*field) {
    std::lock_guard<PoolLock> g(mu_);
    ++(stats_.*field);
  }

  RawAlloc raw_alloc_;
  RawFree raw_free_;
  std::string label_;  // the profiler's counter: "memory cpu(0)"
  bool host_;
  mutable PoolLock mu_;
  std::unordered_map<size_t, SizeClass> pool_;  // size classes above kSmallMax
  SizeClass small_[kSmallClasses];
  uint64_t tick_ = 0;
  AllocatorStats stats_;
};

void* HostAlloc(size_t n) {
  void* p = std::aligned_alloc(64, n);  // n is a multiple of 64 after rounding
  if (!p) throw std::bad_alloc();
  return p;
}

constexpr int kMaxDevices = 64;

// Leaked on purpose: engine workers may still free memory while the process exits. The slots
// are read without a lock (every Storage asks, twice); only creating one takes `mu`.
struct Pools {
  std::mutex mu;
  std::atomic<Allocator*> slots[2][kMaxDevices] = {};
};
Pools& GetPools() {
  static Pools& pools = *new Pools();
  return pools;
}

}  // namespace

int64_t CpuPoolLimitBytes() {
  static const int64_t limit = [] {
    int64_t mb = env::GetInt("KILN_CPU_POOL_MB");
    if (mb < 0 || mb > (int64_t{1} << 40))
      KILN_THROW(ValueError) << "KILN_CPU_POOL_MB=" << mb << ": expected the megabytes of freed host memory "
                             << "kiln may keep for reuse: 0 (keep none) up to 2^40; unset it for the default";
    return mb << 20;
  }();
  return limit;
}

std::unique_ptr<Allocator> NewHostCachingAllocator(const std::string& where, int64_t cache_limit_bytes) {
  if (cache_limit_bytes < 0)
    KILN_THROW(ValueError) << "host pool " << where << ": the cache limit must be 0 or more bytes, got "
                           << cache_limit_bytes;
  return std::make_unique<CachingAllocator>(HostAlloc, [](void* p) { std::free(p); }, "memory " + where,
                                            cache_limit_bytes, /*host=*/true);
}

Allocator& GetAllocator(const Device& d) {
  Pools& pools = GetPools();
  if (d.index < 0 || d.index >= kMaxDevices)
    KILN_THROW(DeviceError) << "device " << d.str() << " is out of range: kiln supports indices 0.."
                            << kMaxDevices - 1;
  std::atomic<Allocator*>& slot = pools.slots[static_cast<int>(d.type)][d.index];
  if (Allocator* a = slot.load(std::memory_order_acquire)) return *a;
  std::lock_guard<std::mutex> g(pools.mu);
  if (Allocator* a = slot.load(std::memory_order_acquire)) return *a;
  Allocator* a;
  if (d.is_cpu()) {
    a = NewHostCachingAllocator(d.str(), CpuPoolLimitBytes()).release();
  } else {
    CheckDeviceExists(d);
    a = NewGpuCachingAllocator(d);
  }
  slot.store(a, std::memory_order_release);
  return *a;
}

Allocator& GetPinnedAllocator() {
  static CachingAllocator& pinned = *new CachingAllocator(
      [](size_t n) { return cuda::DeviceCount() > 0 ? cuda::HostMallocPinned(n) : HostAlloc(n); },
      [](void* p) {
        if (cuda::DeviceCount() > 0) cuda::HostFreePinned(p);
        else std::free(p);
      },
      "memory pinned host", CpuPoolLimitBytes(), /*host=*/true);
  return pinned;
}

void EmptyAllCaches() {
  Pools& pools = GetPools();
  for (auto& of_type : pools.slots)
    for (std::atomic<Allocator*>& slot : of_type)
      if (Allocator* a = slot.load(std::memory_order_acquire)) a->EmptyCache();
  GetPinnedAllocator().EmptyCache();
}

}  // namespace kiln

// ---- scratch memory of GPU kernels ------------------------------------------------------------

namespace kiln {

namespace {
thread_local StepScratchRegion* tls_region = nullptr;
constexpr size_t kScratchAlign = 256;  // cuDNN's and cuBLASLt's alignment for workspaces
}  // namespace

StepScratchScope::StepScratchScope(StepScratchRegion* r) : prev_(tls_region) { tls_region = r; }
StepScratchScope::~StepScratchScope() { tls_region = prev_; }

KernelScratch::KernelScratch(const Device& d, size_t bytes) : device_(d), bytes_(bytes), region_(tls_region) {
  if (bytes == 0) {  // nothing to hand out, nothing to give back
    region_ = nullptr;
    return;
  }
  const size_t rounded = (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  if (region_) {
    region_->peak = std::max(region_->peak, region_->demand + rounded);
    if (region_->used + rounded <= region_->bytes) {
      offset_ = region_->used;
      p_ = region_->base + offset_;
      region_->used += rounded;
      region_->demand += rounded;
      taken_ = rounded;
      return;
    }
  }
  p_ = GetAllocator(d).Allocate(bytes);  // may throw: then nothing was counted as held
  if (region_) region_->demand += rounded;
}

KernelScratch::~KernelScratch() {
  if (bytes_ == 0) return;
  if (region_) region_->demand -= (bytes_ + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  if (!taken_) {
    GetAllocator(device_).Free(p_, bytes_);
  } else if (region_->used == offset_ + taken_) {
    region_->used = offset_;  // the last one taken: its bytes are free again
  }  // else released out of order: its bytes stay taken until the call ends (nothing overlaps)
}

}  // namespace kiln
