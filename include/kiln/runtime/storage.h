// Storage: a reference-counted buffer on one device plus the engine variable that orders every
// read and write of it. Tensors (frontend/) are views into a Storage.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>

#include "kiln/runtime/device.h"
#include "kiln/runtime/engine.h"

namespace kiln {

class Storage {
 public:
  /// Allocates `nbytes` on `device` from its caching allocator.
  Storage(size_t nbytes, Device device);
  /// Wraps memory owned elsewhere (DLPack, host arrays); `deleter` runs when the storage dies.
  Storage(void* ptr, size_t nbytes, Device device, std::function<void(void*)> deleter);
  /// Reserves `nbytes` on `device`: the first data() allocates them. A compiled call's saved
  /// values are made so: when the backward joins the call (frontend/deferred.h) they live in the
  /// joined plan's arena instead, and their storage is never allocated nor freed.
  struct Reserve {};
  Storage(size_t nbytes, Device device, Reserve);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return reserved_ ? Allocated() : ptr_; }
  size_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }
  engine::Var* var() const { return var_; }
  /// Something knows this storage by address or weak reference (autograd's record of in-place
  /// writes): it must not be handed out again as a new tensor's storage while alive (see
  /// CachedGraph's reuse of outputs).
  void KeepIdentity() const { keep_identity_.store(true, std::memory_order_relaxed); }
  bool keeps_identity() const { return keep_identity_.load(std::memory_order_relaxed); }

 private:
  void* Allocated() const;
  mutable void* ptr_ = nullptr;
  bool reserved_ = false;          // allocated by the first data()
  mutable std::once_flag allocate_once_;
  mutable std::atomic<bool> keep_identity_{false};
  size_t nbytes_ = 0;
  Device device_;
  engine::Var* var_ = nullptr;
  std::function<void(void*)> deleter_;  // empty: return to the device allocator
};

using StoragePtr = std::shared_ptr<Storage>;

}  // namespace kiln
