// The GPU caching allocator (allocator.h), as PyTorch's users know it, over the GPU platform
// (gpu.h), so the same code serves CUDA and the simulator.
//
// Size classes: requests round to RoundAllocationSize's classes (512-byte steps up to 1 MiB, an
// eighth of the power of two above), and a freed block waits in its class's pool.
// Stream order: a block remembers the stream it was freed on (the freeing thread's engine
// stream). Work queued on that stream later runs after the work that used the block, so the same
// stream takes it back at once; another stream takes it only once an event recorded on the old
// stream at the free has completed (queried, never waited for). Freeing never synchronizes.
// Out of memory: the cache is emptied (waiting for the blocks' events, then freeing them) and
// the allocation tried once more; then, off the engine's workers, the queued work is waited for
// (it gives back what the user dropped) and the cache emptied for a last try; then a MemoryError
// (Python's OutOfMemoryError) with the statistics.
// CUDA graphs: a graph replays the addresses it was captured with, so a block taken or given back
// while the calling thread captures (cuda::Capturing) could be handed to other work while the
// graph still uses it. Allocating then is a DeviceError (the executor discards the capture and
// launches the plan's kernels one by one); a block freed then is set aside, and pooled (its event
// recorded) at the thread's next allocation or free outside a capture. Nothing here queries or
// records an event during a capture, which would invalidate it.
// What it does not do: split or merge blocks (a block serves one size class), or limit the cache
// below the device's memory.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/profiler.h"

namespace kiln {

namespace {

thread_local int64_t tls_frees_during_capture = 0;

class GpuCachingAllocator final : public Allocator {
 public:
  explicit GpuCachingAllocator(const Device& d) : device_(d), label_("memory " + d.str()) {}

  void* Allocate(size_t nbytes) override {
    CheckAllocationSize(nbytes, device_.str());
    if (cuda::Capturing())
      KILN_THROW(DeviceError) << "allocating " << nbytes << " bytes on " << device_.str()
                              << " while a CUDA graph is being captured: a graph replays the addresses it was "
                                 "captured with, so scratch memory (such as cuDNN's workspace) cannot come from the "
                                 "shared cache then";
    const size_t size = RoundAllocationSize(nbytes);
    auto stream = static_cast<gpurt::Stream>(cuda::CurrentStream());
    PoolSetAside(stream);
    {
      std::lock_guard<std::mutex> g(mu_);
      ++stats_.num_allocs;
      if (void* p = TakeCached(size, stream)) {
        Use(size, nbytes);
        return p;
      }
      ++stats_.num_system_allocs;
    }
    void* p = nullptr;
    try {
      p = cuda::DeviceMalloc(device_, size);
    } catch (const MemoryError&) {  // the device refused
      Count(&AllocatorStats::num_ooms);
      p = Retry(size);
      if (!p) {
        Count(&AllocatorStats::num_ooms);
        AllocatorStats s = Stats();
        KILN_THROW(MemoryError) << "out of memory on " << device_.str() << " allocating " << nbytes << " bytes ("
                                << size << " with rounding) after waiting for queued work and emptying the cache: "
                                << Describe(s) << "; free tensors or use smaller batches";
      }
    }
    std::lock_guard<std::mutex> g(mu_);
    Use(size, nbytes);
    return p;
  }

  // Never throws: it runs in destructors, also while an exception unwinds.
  void Free(void* p, size_t nbytes) override {
    if (!p) return;
    Block b{p, static_cast<gpurt::Stream>(cuda::CurrentStream()), nullptr, nbytes};
    if (b.stream && cuda::Capturing()) {  // recording an event now would join the capture
      ++tls_frees_during_capture;
      std::lock_guard<std::mutex> g(mu_);
      aside_.push_back(b);
      aside_count_.store(aside_.size(), std::memory_order_release);
      return;
    }
    PoolSetAside(b.stream);
    Pool(b);
  }

  AllocatorStats Stats() const override {
    std::lock_guard<std::mutex> g(mu_);
    return stats_;
  }
  void ResetPeak() override {
    std::lock_guard<std::mutex> g(mu_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
    stats_.peak_bytes_cached = stats_.bytes_cached;
  }

  void EmptyCache() override {
    std::map<size_t, std::vector<Block>> pools;
    {
      std::lock_guard<std::mutex> g(mu_);
      pools.swap(pools_);
      stats_.bytes_cached = 0;
      ++stats_.num_cache_flushes;
      for (const auto& [size, blocks] : pools) stats_.num_system_frees += static_cast<int64_t>(blocks.size());
    }
    for (auto& [size, blocks] : pools)
      for (Block& b : blocks) {
        if (b.ready) {
          gpurt::Get().EventSynchronize(b.ready);
          Recycle(b.ready);
        }
        cuda::DeviceFree(device_, b.p);
      }
  }

 private:
  struct Block {
    void* p;
    gpurt::Stream stream;  // freed on (nullptr: outside any stream)
    gpurt::Event ready;    // recorded on `stream` at the free
    size_t nbytes;         // as requested
  };

  // After the device refused `size` bytes: the cache is given back and the allocation tried again;
  // then, where this thread may wait (not an engine worker, not capturing), the queued work is
  // waited for (tensors the user dropped are given back by tasks queued behind the work that
  // still uses them), the cache given back again and a last try made. nullptr if all refused.
  void* Retry(size_t size) {
    EmptyCache();
    auto attempt = [&]() -> void* {
      try {
        return cuda::DeviceMalloc(device_, size);
      } catch (const MemoryError&) {
        return nullptr;
      }
    };
    if (void* p = attempt()) return p;
    if (cuda::Capturing() || !engine::Engine::Get().Drain()) return nullptr;
    PoolSetAside(static_cast<gpurt::Stream>(cuda::CurrentStream()));
    EmptyCache();
    return attempt();
  }

  // Into its size class's pool, with an event recorded on its stream (other streams may take it
  // once that stream's work on it is done). Where the event cannot be recorded (a sticky device
  // error) the block stays out of the pool: memory kept is better than memory shared too early.
  void Pool(Block b) noexcept {
    if (b.stream) {
      try {
        b.ready = NewEvent();
        gpurt::Get().EventRecord(b.ready, b.stream);
      } catch (...) {
        if (b.ready) Recycle(b.ready);
        return;
      }
    }
    const size_t size = RoundAllocationSize(b.nbytes), nbytes = b.nbytes;
    std::lock_guard<std::mutex> g(mu_);
    pools_[size].push_back(b);
    ++stats_.num_frees;
    stats_.bytes_in_use -= static_cast<int64_t>(size);
    stats_.bytes_requested -= static_cast<int64_t>(nbytes);
    stats_.bytes_cached += static_cast<int64_t>(size);
    stats_.peak_bytes_cached = std::max(stats_.peak_bytes_cached, stats_.bytes_cached);
    Sample();
  }

  // Pools the blocks that `stream`'s thread freed during a capture, now that it is not capturing
  // (their events are recorded on the thread's own stream, never on another thread's).
  void PoolSetAside(gpurt::Stream stream) noexcept {
    // Nearly always none: Allocate and Free then take no lock here. A block set aside by this
    // thread is counted before its capture ends, so the thread itself never misses it.
    if (aside_count_.load(std::memory_order_acquire) == 0 || cuda::Capturing()) return;
    std::vector<Block> mine;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (size_t i = aside_.size(); i-- > 0;)
        if (aside_[i].stream == stream) mine.push_back(aside_[i]), aside_.erase(aside_.begin() + static_cast<std::ptrdiff_t>(i));
      aside_count_.store(aside_.size(), std::memory_order_release);
    }
    for (const Block& b : mine) Pool(b);
  }

  // Under mu_. A block freed on `stream` (or outside streams) first, else one whose event is done.
  void* TakeCached(size_t size, gpurt::Stream stream) {
    auto it = pools_.find(size);
    if (it == pools_.end() || it->second.empty()) return nullptr;
    std::vector<Block>& v = it->second;
    for (size_t i = v.size(); i-- > 0;) {
      if (v[i].stream == stream || !v[i].ready) return Take(v, i, size);
    }
    for (size_t i = 0; i < v.size(); ++i) {
      if (gpurt::Get().EventQuery(v[i].ready)) return Take(v, i, size);
    }
    ++stats_.num_stream_waits;
    return nullptr;
  }
  void* Take(std::vector<Block>& v, size_t i, size_t size) {
    Block b = v[i];
    v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
    if (b.ready) events_.push_back(b.ready);
    stats_.bytes_cached -= static_cast<int64_t>(size);
    return b.p;
  }

  void Use(size_t size, size_t nbytes) {
    stats_.bytes_in_use += static_cast<int64_t>(size);
    stats_.bytes_requested += static_cast<int64_t>(nbytes);
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
    Sample();
  }
  void Sample() {  // under mu_: the profiler's memory counter, in the order of the changes
    if (profiler::Enabled(profiler::kMemory))
      profiler::Counter(profiler::kMemory, label_, "bytes_in_use", static_cast<double>(stats_.bytes_in_use));
  }
  void Count(int64_t AllocatorStats::*field) {
    std::lock_guard<std::mutex> g(mu_);
    ++(stats_.*field);
  }

  gpurt::Event NewEvent() {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!events_.empty()) {
        gpurt::Event e = events_.back();
        events_.pop_back();
        return e;
      }
    }
    gpurt::DeviceGuard guard(device_.index);  // an event of the block's device
    return gpurt::Get().EventCreate(/*timing=*/false);
  }
  void Recycle(gpurt::Event e) {
    std::lock_guard<std::mutex> g(mu_);
    events_.push_back(e);
  }

  static std::string Describe(const AllocatorStats& s) {
    std::ostringstream o;
    o << "in use " << s.bytes_in_use << " bytes (peak " << s.peak_bytes_in_use << "), cached " << s.bytes_cached
      << ", reserved " << s.bytes_reserved() << ", fragmentation " << s.fragmentation() << ", " << s.num_allocs
      << " allocations (" << s.num_system_allocs << " from the device), " << s.num_ooms << " out-of-memory";
    return o.str();
  }

  const Device device_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<Block>> pools_;
  std::vector<gpurt::Event> events_;  // free events for new blocks
  std::vector<Block> aside_;          // freed during a capture, not yet pooled
  std::atomic<size_t> aside_count_{0};  // aside_.size(), read without the lock
  AllocatorStats stats_;
  std::string label_;  // the profiler's counter: "memory gpu(0)"
};

}  // namespace

Allocator* NewGpuCachingAllocator(const Device& d) { return new GpuCachingAllocator(d); }

int64_t GpuFreesDuringCapture() { return tls_frees_during_capture; }

}  // namespace kiln
