#include "kiln/runtime/storage.h"

#include "kiln/runtime/allocator.h"

namespace kiln {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  ptr_ = GetAllocator(device).Allocate(nbytes);
  var_ = engine::Engine::Get().NewVar();
}

Storage::Storage(size_t nbytes, Device device, Reserve) : nbytes_(nbytes), device_(device), reserved_(true) {
  var_ = engine::Engine::Get().NewVar();
}

void* Storage::Allocated() const {
  std::call_once(allocate_once_, [this] { ptr_ = GetAllocator(device_).Allocate(nbytes_); });
  return ptr_;
}

Storage::Storage(void* ptr, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : ptr_(ptr), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {
  var_ = engine::Engine::Get().NewVar();
}

Storage::~Storage() {
  if (reserved_ && !ptr_) {  // never allocated (an unallocated block of 0 bytes frees nothing either)
    engine::Engine::Get().ReleaseVar(var_);
    return;
  }
  if (device_.is_gpu() && !deleter_ && ptr_) {
    // Queued GPU work may still use the memory (GPU tasks complete by events, engine_gpu.h): the
    // free is a task on the device's compute stream that waits for that work there, so the
    // allocator takes the block back in stream order, without a host wait.
    engine::Var* vs[] = {var_};
    engine::TaskOptions o;
    o.device = device_;
    o.stream = engine::StreamKind::kCompute;
    o.name = "free";
    engine::Engine::Get().Push([p = ptr_, n = nbytes_, d = device_] { GetAllocator(d).Free(p, n); }, {}, vs, o);
    engine::Engine::Get().ReleaseVar(var_);
    return;
  }
  engine::Engine::Get().ReleaseVar(var_);
  if (deleter_) deleter_(ptr_);
  else GetAllocator(device_).Free(ptr_, nbytes_);
}

}  // namespace kiln
