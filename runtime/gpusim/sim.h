// The simulated GPUs' parts (internal to runtime/gpusim/): device memory (sim_memory.cc), streams
// as worker threads and events (sim_stream.cc); the Platform over them is sim_platform.cc.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/runtime/gpu.h"
#include "kiln/runtime/gpusim/seam_internal.h"

namespace kiln::gpusim {

/// Device memory of a platform's simulated GPUs: one reserved range the host cannot touch (PROT_NONE),
/// whose pages are mapped again read-write at `address + alias_delta` (a memfd mapped twice).
/// Each device owns a slice of `bytes_per_device` with a first-fit allocator; freed blocks are
/// poisoned (0xFF: NaN as float) so that a read after free shows.
class Memory final : public DeviceMemory {
 public:
  /// Registers itself with the seam (seam_internal.h) for its life.
  Memory(int devices, size_t bytes_per_device);
  ~Memory();
  /// GpuError kOutOfMemory when the device's slice has no room.
  void* Allocate(int device, size_t nbytes);
  /// Frees an address Allocate returned; GpuError kInvalidValue for any other.
  void Free(void* p);
  /// The device whose slice holds `p`, or -1 for host memory.
  int DeviceOf(const void* p) const;
  /// True when [address, address + bytes) lies inside one live allocation.
  bool IsLive(uintptr_t address, size_t bytes) const override;
  const MemoryWindow& window() const override { return window_; }
  /// GpuError kInvalidValue naming `call` unless [p, p + n) lies inside one live allocation.
  void CheckDeviceRange(const void* p, size_t n, const char* call, const char* what) const;
  void* Alias(const void* device_address) const {
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(device_address) + delta_);
  }
  size_t BytesInUse(int device) const;
  size_t bytes_per_device() const { return per_device_; }
  uintptr_t begin() const { return base_; }
  uintptr_t end() const { return base_ + total_; }
  intptr_t delta() const { return delta_; }

  void* AllocatePinned(size_t nbytes);
  void FreePinned(void* p);
  bool IsPinned(const void* p) const;

 private:
  struct Slice {
    std::map<size_t, size_t> free;  // offset -> size, coalesced
    size_t in_use = 0;
  };
  int devices_;
  size_t per_device_, total_;
  uintptr_t base_ = 0;
  intptr_t delta_ = 0;
  MemoryWindow window_;
  int fd_ = -1;
  mutable std::shared_mutex mu_;
  std::vector<Slice> slices_;
  std::map<uintptr_t, size_t> live_;    // device address -> size
  std::map<uintptr_t, size_t> pinned_;  // host address -> size
};

struct EventState {
  int device = 0;
  bool timing = true;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;  // generations: the latest record, the latest finished one
  std::chrono::steady_clock::time_point when{};
  bool captured = false;  ///< recorded into a capture (not yet usable outside it)
};

class SimDevice;

/// A stream: a worker thread running its queue in order. An operation that fails on the device
/// (a kernel fault) sets the device's sticky error, as a real GPU does.
class StreamImpl {
 public:
  StreamImpl(SimDevice* device, int index);
  ~StreamImpl();  ///< finishes the queue
  void Enqueue(std::function<void()> op);
  /// Waits until everything enqueued before the call has run.
  void Drain();
  bool Idle();
  SimDevice* device() const { return device_; }
  int index() const { return index_; }

  // Capture (global mode): while capturing, operations become nodes of the graph being built.
  std::atomic<bool> capturing{false};
  std::atomic<bool> capture_invalidated{false};
  std::thread::id capture_thread;
  std::mutex capture_mu;  // `captured`: any thread may issue work to a capturing stream
  std::vector<std::function<void(gpurt::Stream)>> captured;
  void Capture(std::function<void(gpurt::Stream)> node) {
    std::lock_guard<std::mutex> g(capture_mu);
    captured.push_back(std::move(node));
  }

 private:
  void Loop();
  SimDevice* device_;
  int index_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

/// One simulated GPU: its streams, its sticky error, the captures running on it.
class SimDevice {
 public:
  explicit SimDevice(int index) : index(index) {}
  const int index;
  std::mutex mu;          // the sticky message
  std::mutex streams_mu;  // the stream list; held while synchronizing (stream work never takes it)
  std::vector<StreamImpl*> streams;  // live streams (owned by their handles)
  std::unique_ptr<StreamImpl> default_stream;
  std::atomic<int> sticky{0};
  std::string sticky_message;
  std::atomic<int> capturing{0};
  std::vector<bool> peer_enabled;

  /// Throws the sticky error (a kernel fault) as every later call on the device does in CUDA.
  void CheckSticky(const char* call);
  void SetSticky(int code, const std::string& message);
  /// Waits for every stream of the device.
  void Synchronize();
};

/// A library handle as LibraryHandle left it: which library, bound to which stream of which device.
struct LibraryBinding {
  bool found = false;  ///< false: not a handle of this platform
  gpurt::Library lib = gpurt::Library::kBlasLt;
  int device = -1;
  gpurt::Stream stream = nullptr;
};

/// The GEMM of gpu.h on simulated stream `s` (the resolved `h`; sim_blas.cc): the handle's checks
/// (a cuBLASLt handle, bound to `h`), cuBLAS's argument checks (CheckGemm), the stream of the
/// thread's `current_device`, every operand in live memory of the stream's device (else GpuError
/// kIllegalAddress); the product then runs on the stream's worker thread (or becomes a node of the
/// graph being captured) over the CPU's sgemm.
void EnqueueGemm(const Memory& memory, StreamImpl* s, gpurt::Stream h, int current_device, const LibraryBinding& bound,
                 const gpurt::GemmArgs& g);

// TF32 as tensor cores read a float32: the mantissa rounded to its top 10 bits (to nearest even);
// NaN and infinity pass unchanged (sim_blas.cc's GEMMs and sim_dnn.cc's convolutions).
inline float RoundTf32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return f;
  u += 0xfffu + ((u >> 13) & 1u);
  u &= ~0x1fffu;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace kiln::gpusim
