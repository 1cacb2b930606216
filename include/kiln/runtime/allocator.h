// Per-device caching allocators. Freed blocks are kept in size-class pools and handed out again,
// so steady-state eager code and training loops do not call the system allocator.
// The host pools (each CPU device, pinned host memory) keep at most KILN_CPU_POOL_MB cached: a
// free that goes above it gives the least recently used size classes back to the system.
// What it does not do: defragment, or bound the GPU pools' cache (EmptyCache empties them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kiln/runtime/device.h"

namespace kiln {

struct AllocatorStats {
  int64_t bytes_in_use = 0;     ///< bytes handed out and not yet freed (rounded sizes)
  int64_t peak_bytes_in_use = 0;
  int64_t bytes_cached = 0;     ///< bytes held in the pools, free for reuse
  int64_t num_allocs = 0;       ///< calls to Allocate
  int64_t num_system_allocs = 0;  ///< of those, how many reached the system allocator
  int64_t bytes_requested = 0;  ///< bytes asked for by the blocks in use (before rounding)
  int64_t num_ooms = 0;         ///< allocations the system refused (each retried once after EmptyCache)
  int64_t num_cache_flushes = 0;  ///< EmptyCache calls, by the user or after an out-of-memory
  int64_t num_stream_waits = 0;   ///< GPU: blocks not reused on another stream because their event was pending
  int64_t num_frees = 0;          ///< calls to Free
  int64_t num_system_frees = 0;   ///< blocks given back to the system (trims, EmptyCache, a pool limit of 0)
  int64_t num_trims = 0;          ///< host pools: times the cache went above its limit and was trimmed
  int64_t peak_bytes_cached = 0;  ///< the most bytes the pool ever held cached (since ResetPeak)
  int64_t cache_limit_bytes = -1; ///< host pools: the bound of bytes_cached (KILN_CPU_POOL_MB); -1: none

  /// Bytes taken from the system: in use plus cached.
  int64_t bytes_reserved() const { return bytes_in_use + bytes_cached; }
  /// Share of the reserved bytes that is not holding data: cached blocks plus rounding waste.
  double fragmentation() const {
    int64_t r = bytes_reserved();
    return r ? static_cast<double>(r - bytes_requested) / static_cast<double>(r) : 0.0;
  }
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  /// Returns at least `nbytes` bytes aligned to 64; never null (throws on exhaustion).
  virtual void* Allocate(size_t nbytes) = 0;
  /// Returns a block from Allocate; `nbytes` is the size that was asked for.
  virtual void Free(void* p, size_t nbytes) = 0;
  virtual AllocatorStats Stats() const = 0;
  /// Resets the peaks (bytes in use, bytes cached) to the current values.
  virtual void ResetPeak() = 0;
  /// Releases every cached (free) block to the system.
  virtual void EmptyCache() = 0;
};

/// The allocator of a device (created on first use, lives for the process).
Allocator& GetAllocator(const Device& d);
/// The GPU caching allocator of device `d` (GetAllocator creates one per GPU): size classes,
/// stream-ordered reuse (a block freed on one stream is handed to another only once an event
/// recorded at the free has completed; no synchronizing free), out-of-memory retried once after
/// the cache is emptied, then a MemoryError with the statistics. See runtime/gpu_allocator.cc.
Allocator* NewGpuCachingAllocator(const Device& d);
/// How many blocks the calling thread has given back to a GPU allocator while capturing a CUDA
/// graph (cuda::Capturing). A graph captured across such a free replays memory the cache may
/// hand out again, so the executor discards it.
int64_t GpuFreesDuringCapture();
/// The region of a compiled GPU plan's arena its steps take scratch memory from (library
/// workspaces, recomputed operands): stream-ordered like the arena, so a CUDA graph captured
/// across the steps allocates nothing. The executor sets it for the calling thread while a plan's
/// steps run in order on one stream (StepScratchScope); `peak` is the most the steps wanted at
/// once, served or not, from which the executor sizes the region of the next call.
struct StepScratchRegion {
  uint8_t* base = nullptr;
  size_t bytes = 0;  ///< the region's size (0 on a plan's first call: every request measured)
  size_t used = 0;   ///< bytes handed out now
  size_t demand = 0, peak = 0;  ///< bytes asked for now (served or not), and the most at once
};
/// Makes `r` the calling thread's region until the scope ends (nullptr: none, as in lanes).
class StepScratchScope {
 public:
  explicit StepScratchScope(StepScratchRegion* r);
  ~StepScratchScope();
  StepScratchScope(const StepScratchScope&) = delete;
  StepScratchScope& operator=(const StepScratchScope&) = delete;

 private:
  StepScratchRegion* prev_;
};

/// Device memory for one GPU kernel's scratch data while it queues its work: from the running
/// plan's region when it has room (its bytes free again when the last one taken ends; one ended
/// out of order keeps them until the call ends), else a block of the device's caching allocator
/// given back when this ends (stream-ordered reuse). Zero bytes: a null pointer.
class KernelScratch {
 public:
  KernelScratch(const Device& d, size_t bytes);
  ~KernelScratch();
  KernelScratch(const KernelScratch&) = delete;
  KernelScratch& operator=(const KernelScratch&) = delete;
  void* data() const { return p_; }

 private:
  Device device_;
  size_t bytes_, taken_ = 0, offset_ = 0;  // taken_: bytes of the region at offset_ (0: a cache block)
  StepScratchRegion* region_;
  void* p_ = nullptr;
};

/// Page-locked host memory for fast asynchronous GPU copies (plain host memory without CUDA).
Allocator& GetPinnedAllocator();
/// A new host caching allocator (std::aligned_alloc) keeping at most `cache_limit_bytes` cached
/// (0: none, every free goes back to the system); owned by the caller. GetAllocator makes the CPU
/// devices' pools with this and CpuPoolLimitBytes().
std::unique_ptr<Allocator> NewHostCachingAllocator(const std::string& where, int64_t cache_limit_bytes);
/// KILN_CPU_POOL_MB in bytes: the cache bound of each host pool (read once).
int64_t CpuPoolLimitBytes();
/// Empties every pool created so far: each CPU device's, pinned host memory's and each GPU's
/// (kiln.empty_cache()). Host memory freed this way is handed back to the operating system.
void EmptyAllCaches();

/// The largest request any pool accepts (1 EiB): a larger one is a wrapped or negative size.
inline constexpr size_t kMaxAllocationBytes = size_t{1} << 60;
/// Throws MemoryError naming `where` (a device) when `nbytes` exceeds kMaxAllocationBytes.
void CheckAllocationSize(size_t nbytes, const std::string& where);
/// The size class a request of `nbytes` is rounded to (shared by the CPU and GPU pools).
size_t RoundAllocationSize(size_t nbytes);

}  // namespace kiln
