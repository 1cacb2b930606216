// Simulated device memory (sim.h): a reserved range the host cannot touch, the same pages mapped
// read-write at an alias for simulated copies and kernels, a first-fit allocator per device, and
// poison on free. Pinned host memory is plain host memory that the simulator remembers.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "sim.h"

namespace kiln::gpusim {

namespace {
constexpr size_t kAlign = 512;               // cudaMalloc's alignment is at least 256
constexpr size_t kPoisonAll = size_t{64} << 20;  // larger blocks: pages given back, ends poisoned
constexpr int kPoison = 0xFF;                // every float and double a NaN

std::string Hex(uintptr_t p) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%zx", static_cast<size_t>(p));
  return b;
}
}  // namespace

Memory::Memory(int devices, size_t bytes_per_device)
    : devices_(devices), per_device_((bytes_per_device + 4095) & ~size_t{4095}), total_(per_device_ * devices),
      slices_(static_cast<size_t>(devices)) {
  void* reserve = mmap(nullptr, total_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserve == MAP_FAILED)
    KILN_THROW(DeviceError) << "KILN_GPU_SIM: cannot reserve " << total_ << " bytes of address space for " << devices
                            << " simulated GPUs; lower KILN_GPU_SIM_MEM";
  void* alias = MAP_FAILED;
  fd_ = memfd_create("kiln-gpusim", MFD_CLOEXEC);
  if (fd_ >= 0 && ftruncate(fd_, static_cast<off_t>(total_)) == 0) {
    // The device view of the same pages, without access; the alias with it.
    mmap(reserve, total_, PROT_NONE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd_, 0);
    alias = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  }
  if (alias == MAP_FAILED)  // no memfd: the device view stays an unbacked reservation
    alias = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (alias == MAP_FAILED)
    KILN_THROW(DeviceError) << "KILN_GPU_SIM: cannot map " << total_ << " bytes of simulated device memory; lower "
                            << "KILN_GPU_SIM_MEM";
  base_ = reinterpret_cast<uintptr_t>(reserve);
  delta_ = static_cast<intptr_t>(reinterpret_cast<uintptr_t>(alias) - base_);
  for (Slice& s : slices_) s.free[0] = per_device_;
  window_ = {base_, base_ + total_, delta_};
  RegisterDeviceMemory(this);
}

// Only unregisters: the mappings and the memfd stay until the process exits (a private platform a
// test destroys leaves its reserved address space and the pages it touched).
Memory::~Memory() { UnregisterDeviceMemory(this); }

void* Memory::Allocate(int device, size_t nbytes) {
  size_t n = (std::max<size_t>(nbytes, 1) + kAlign - 1) & ~(kAlign - 1);
  std::unique_lock<std::shared_mutex> g(mu_);
  Slice& s = slices_[static_cast<size_t>(device)];
  for (auto it = s.free.begin(); it != s.free.end(); ++it) {
    if (it->second < n) continue;
    size_t off = it->first, rest = it->second - n;
    s.free.erase(it);
    if (rest) s.free[off + n] = rest;
    s.in_use += n;
    uintptr_t p = base_ + static_cast<size_t>(device) * per_device_ + off;
    live_[p] = n;
    return reinterpret_cast<void*>(p);
  }
  gpurt::Fail(gpurt::kOutOfMemory, "cudaMalloc on gpu(" + std::to_string(device) + ")",
            std::to_string(nbytes) + " bytes requested, " + std::to_string(s.in_use) + " of " +
                std::to_string(per_device_) + " bytes in use (KILN_GPU_SIM_MEM sets the simulated size)");
}

void Memory::Free(void* ptr) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  size_t n = 0;
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    auto it = live_.find(p);
    if (it == live_.end())
      gpurt::Fail(gpurt::kInvalidValue, "cudaFree",
                Hex(p) + " is not an address cudaMalloc returned (freed twice, or an offset into a block?)");
    n = it->second;
    live_.erase(it);
  }
  char* a = static_cast<char*>(Alias(ptr));
  if (n <= kPoisonAll) {
    std::memset(a, kPoison, n);
  } else {  // give the pages back, keep poison at both ends where reads past a block land
    if (fd_ >= 0) madvise(a, n, MADV_REMOVE);
    std::memset(a, kPoison, 1 << 20);
    std::memset(a + n - (1 << 20), kPoison, 1 << 20);
  }
  std::unique_lock<std::shared_mutex> g(mu_);
  int device = static_cast<int>((p - base_) / per_device_);
  Slice& s = slices_[static_cast<size_t>(device)];
  size_t off = p - base_ - static_cast<size_t>(device) * per_device_;
  s.in_use -= n;
  auto next = s.free.lower_bound(off);
  if (next != s.free.end() && off + n == next->first) n += next->second, next = s.free.erase(next);
  if (next != s.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += n;
      return;
    }
  }
  s.free[off] = n;
}

int Memory::DeviceOf(const void* ptr) const {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  if (p < base_ || p >= base_ + total_) return -1;
  return static_cast<int>((p - base_) / per_device_);
}

bool Memory::IsLive(uintptr_t a, size_t bytes) const {
  std::shared_lock<std::shared_mutex> g(mu_);
  auto it = live_.upper_bound(a);
  if (it == live_.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

void Memory::CheckDeviceRange(const void* p, size_t n, const char* call, const char* what) const {
  if (IsLive(reinterpret_cast<uintptr_t>(p), n)) return;
  gpurt::Fail(gpurt::kInvalidValue, call,
            std::string(what) + " [" + Hex(reinterpret_cast<uintptr_t>(p)) + ", +" + std::to_string(n) +
                ") is not inside one live device allocation" +
                (DeviceOf(p) < 0 ? " (it is host memory: check the copy's direction)" : " (freed, or past its end)"));
}

size_t Memory::BytesInUse(int device) const {
  std::shared_lock<std::shared_mutex> g(mu_);
  return slices_[static_cast<size_t>(device)].in_use;
}

void* Memory::AllocatePinned(size_t nbytes) {
  size_t n = (std::max<size_t>(nbytes, 1) + 4095) & ~size_t{4095};
  void* p = std::aligned_alloc(4096, n);
  if (!p) gpurt::Fail(gpurt::kOutOfMemory, "cudaHostAlloc", std::to_string(nbytes) + " bytes of host memory");
  std::unique_lock<std::shared_mutex> g(mu_);
  pinned_[reinterpret_cast<uintptr_t>(p)] = n;
  return p;
}

void Memory::FreePinned(void* p) {
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    if (!pinned_.erase(reinterpret_cast<uintptr_t>(p)))
      gpurt::Fail(gpurt::kInvalidValue, "cudaFreeHost", "the pointer is not from cudaHostAlloc");
  }
  std::free(p);
}

bool Memory::IsPinned(const void* ptr) const {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::shared_lock<std::shared_mutex> g(mu_);
  auto it = pinned_.upper_bound(p);
  if (it == pinned_.begin()) return false;
  --it;
  return p < it->first + it->second;
}

}  // namespace kiln::gpusim
