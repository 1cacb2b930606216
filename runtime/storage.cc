#include "kiln/runtime/storage.h"

#include "kiln/runtime/allocator.h"

namespace kiln {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  ptr_ = GetAllocator(device).Allocate(nbytes);
  var_ = engine::Engine::Get().NewVar();
}

Storage::Storage(void* ptr, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : ptr_(ptr), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {
  var_ = engine::Engine::Get().NewVar();
}

Storage::~Storage() {
  engine::Engine::Get().ReleaseVar(var_);
  if (deleter_) deleter_(ptr_);
  else GetAllocator(device_).Free(ptr_, nbytes_);
}

}  // namespace kiln
