// Per-device caching allocators. Freed blocks are kept in size-class pools and handed out again,
// so steady-state eager code and training loops do not call the system allocator.
// What it does not do: defragment, or return cached memory to the OS (EmptyCache does that).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/runtime/device.h"

namespace kiln {

struct AllocatorStats {
  int64_t bytes_in_use = 0;     ///< bytes handed out and not yet freed (rounded sizes)
  int64_t peak_bytes_in_use = 0;
  int64_t bytes_cached = 0;     ///< bytes held in the pools, free for reuse
  int64_t num_allocs = 0;       ///< calls to Allocate
  int64_t num_system_allocs = 0;  ///< of those, how many reached the system allocator
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  /// Returns at least `nbytes` bytes aligned to 64; never null (throws on exhaustion).
  virtual void* Allocate(size_t nbytes) = 0;
  /// Returns a block from Allocate; `nbytes` is the size that was asked for.
  virtual void Free(void* p, size_t nbytes) = 0;
  virtual AllocatorStats Stats() const = 0;
  virtual void ResetPeak() = 0;
  /// Releases every cached (free) block to the system.
  virtual void EmptyCache() = 0;
};

/// The allocator of a device (created on first use, lives for the process).
Allocator& GetAllocator(const Device& d);
/// Page-locked host memory for fast asynchronous GPU copies (plain host memory without CUDA).
Allocator& GetPinnedAllocator();

/// The size class a request of `nbytes` is rounded to (shared by the CPU and GPU pools).
size_t RoundAllocationSize(size_t nbytes);

}  // namespace kiln
