// Devices: cpu(i) and gpu(i). Several CPU devices exist so that multi-device code (split_and_load,
// data parallelism) runs on machines without GPUs; each has its own engine workers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace kiln {

enum class DeviceType : uint8_t { kCPU = 0, kGPU = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_gpu() const { return type == DeviceType::kGPU; }
  std::string str() const;  // "cpu(0)", "gpu(1)"
  friend bool operator==(const Device&, const Device&) = default;
};

inline Device cpu(int i = 0) { return {DeviceType::kCPU, i}; }
inline Device gpu(int i = 0) { return {DeviceType::kGPU, i}; }

/// Number of CUDA devices usable by this process (0 when kiln is built without CUDA, when no
/// driver is installed, or when no GPU is present).
int NumGPUs();
/// Throws DeviceError when `d` does not exist (gpu(i) with i >= NumGPUs(), negative index).
void CheckDeviceExists(const Device& d);

}  // namespace kiln

template <>
struct std::hash<kiln::Device> {
  size_t operator()(const kiln::Device& d) const noexcept {
    return (static_cast<size_t>(d.type) << 16) ^ static_cast<size_t>(d.index);
  }
};
