// Caching allocators: one pool per CPU device, plus one for pinned host memory; GPUs have their
// stream-ordered caching allocator in gpu_allocator.cc.
#include "kiln/runtime/allocator.h"

#include <cstdlib>
#include <memory>
#include <atomic>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/runtime/error.h"
#include "kiln/runtime/profiler.h"
#include "kiln/runtime/cuda.h"

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
  CachingAllocator(RawAlloc a, RawFree f, std::string label)
      : raw_alloc_(std::move(a)), raw_free_(std::move(f)), label_(std::move(label)) {}
  ~CachingAllocator() override = default;  // process lifetime: cached blocks die with it

  void* Allocate(size_t nbytes) override {
    CheckAllocationSize(nbytes, where());
    size_t size = RoundAllocationSize(nbytes);
    {
      std::lock_guard<PoolLock> g(mu_);
      ++stats_.num_allocs;
      std::vector<void*>* blocks = Find(size);
      if (blocks && !blocks->empty()) {
        void* p = blocks->back();
        blocks->pop_back();
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
      {
        std::lock_guard<PoolLock> g(mu_);
        ++stats_.num_ooms;
      }
      EmptyCache();  // give the cache back and try once more
      try {
        p = raw_alloc_(size);
      } catch (const std::bad_alloc&) {
        { std::lock_guard<PoolLock> g(mu_); ++stats_.num_ooms; }
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
    std::lock_guard<PoolLock> g(mu_);
    std::vector<void*>* blocks = Find(size);
    (blocks ? *blocks : pool_[size]).push_back(p);
    stats_.bytes_in_use -= static_cast<int64_t>(size);
    stats_.bytes_requested -= static_cast<int64_t>(nbytes);
    stats_.bytes_cached += static_cast<int64_t>(size);
    Sample();
  }

  AllocatorStats Stats() const override {
    std::lock_guard<PoolLock> g(mu_);
    return stats_;
  }
  void ResetPeak() override {
    std::lock_guard<PoolLock> g(mu_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  void EmptyCache() override {
    std::unordered_map<size_t, std::vector<void*>> pool;
    std::vector<std::vector<void*>> small(kSmallClasses);
    {
      std::lock_guard<PoolLock> g(mu_);
      pool.swap(pool_);
      for (size_t i = 0; i < kSmallClasses; ++i) small[i].swap(small_[i]);
      stats_.bytes_cached = 0;
      ++stats_.num_cache_flushes;
    }
    for (auto& [size, blocks] : pool)
      for (void* p : blocks) raw_free_(p);
    for (auto& blocks : small)
      for (void* p : blocks) raw_free_(p);
  }

 private:
  // Size classes up to kSmallMax (64 bytes, then multiples of 512) have a pool in an array; the
  // larger ones live in the map.
  static constexpr size_t kSmallMax = 64 << 10;
  static constexpr size_t kSmallClasses = kSmallMax / 512 + 1;
  std::vector<void*>* Find(size_t size) {
    if (size > kSmallMax) {
      auto it = pool_.find(size);
      return it == pool_.end() ? nullptr : &it->second;
    }
    return &small_[size == 64 ? 0 : size / 512];
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

  RawAlloc raw_alloc_;
  RawFree raw_free_;
  std::string label_;  // the profiler's counter: "memory cpu(0)"
  mutable PoolLock mu_;
  std::unordered_map<size_t, std::vector<void*>> pool_;  // size classes above kSmallMax
  std::vector<void*> small_[kSmallClasses];
  AllocatorStats stats_;
};

void* HostAlloc(size_t n) {
  void* p = std::aligned_alloc(64, n);  // n is a multiple of 64 after rounding
  if (!p) throw std::bad_alloc();
  return p;
}

constexpr int kMaxDevices = 64;

}  // namespace

Allocator& GetAllocator(const Device& d) {
  // Leaked on purpose: engine workers may still free memory while the process exits. The slots
  // are read without a lock (every Storage asks, twice); only creating one takes it.
  static std::mutex& mu = *new std::mutex();
  struct Pools {
    std::atomic<Allocator*> slots[2][kMaxDevices] = {};
  };
  static Pools& pools = *new Pools();
  if (d.index < 0 || d.index >= kMaxDevices)
    KILN_THROW(DeviceError) << "device " << d.str() << " is out of range: kiln supports indices 0.."
                            << kMaxDevices - 1;
  std::atomic<Allocator*>& slot = pools.slots[static_cast<int>(d.type)][d.index];
  if (Allocator* a = slot.load(std::memory_order_acquire)) return *a;
  std::lock_guard<std::mutex> g(mu);
  if (Allocator* a = slot.load(std::memory_order_acquire)) return *a;
  Allocator* a;
  if (d.is_cpu()) {
    a = new CachingAllocator(HostAlloc, [](void* p) { std::free(p); }, "memory " + d.str());
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
      "memory pinned host");
  return pinned;
}

}  // namespace kiln
