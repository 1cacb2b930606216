// The GPU device layer through kiln::cuda: device count, allocator, streams and copies. They run
// on real GPUs and on simulated ones (KILN_GPU_SIM=2, which CTest's "sim2:" run sets); without
// any GPU they report themselves skipped, and CPU work is unaffected.
#include <doctest/doctest.h>

#include <algorithm>

#include "gpu_skip.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cuda.h"
#include "test_util.h"

using namespace kiln;

TEST_CASE("gpu: a missing GPU is a clear DeviceError, not a crash") {
  const int missing = NumGPUs();  // the first index past the GPUs there are (0 without any)
  CHECK_THROWS_AS(Tensor::Empty({2}, DType::kFloat32, gpu(missing)), DeviceError);
  try {
    nd::zeros({2}, DType::kFloat32, gpu(missing));
    FAIL("expected DeviceError");
  } catch (const DeviceError& e) {
    CHECK(std::string(e.what()).find(gpu(missing).str()) != std::string::npos);
  }
  // CPU work still runs.
  CHECK(nd::ones({3}).ToVector<float>() == std::vector<float>{1, 1, 1});
}

TEST_CASE("gpu: host-device round trip through pinned staging") {
  KILN_REQUIRE_GPU();
  std::vector<float> v(1 << 20);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 977);
  Tensor h = Tensor::FromVector(v, {static_cast<int64_t>(v.size())});
  Tensor d = h.To(gpu(0));
  CHECK(d.device() == gpu(0));
  CHECK(d.ToVector<float>() == v);
  Tensor d2 = d.To(gpu(0), /*copy=*/true);  // device to device
  CHECK(d2.ToVector<float>() == v);
}

TEST_CASE("gpu: copies of several staging buffers and a tail keep every byte, both ways") {
  KILN_REQUIRE_GPU();
  // 8 MiB staging buffers: 5 full ones and a partial one; an odd offset into the host storage.
  const int64_t n = 5 * (int64_t{2} << 20) + 12345;
  std::vector<float> v(static_cast<size_t>(n + 1));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 2654435761u) % 100003);
  Tensor h = Tensor::FromVector(v, {n + 1});
  Tensor d = nd::slice(h, {1}, {n + 1}, {1}).To(gpu(0));
  std::vector<float> back = d.To(cpu()).ToVector<float>();
  REQUIRE(back.size() == static_cast<size_t>(n));
  CHECK(std::equal(back.begin(), back.end(), v.begin() + 1));
  // Two copies queued back to back on the same worker reuse its staging buffers safely.
  Tensor d2 = h.To(gpu(0));
  Tensor h2 = d2.To(cpu());
  Tensor d3 = h2.To(gpu(0));
  CHECK(d3.ToVector<float>() == v);
}

TEST_CASE("gpu: caching allocator reuses device blocks") {
  KILN_REQUIRE_GPU();
  Allocator& a = GetAllocator(gpu(0));
  void* p = a.Allocate(1 << 20);
  a.Free(p, 1 << 20);
  int64_t sys = a.Stats().num_system_allocs;
  void* q = a.Allocate(1 << 20);
  CHECK(a.Stats().num_system_allocs == sys);
  a.Free(q, 1 << 20);
}

TEST_CASE("gpu: copies on different streams overlap with CPU work and stay ordered") {
  KILN_REQUIRE_GPU();
  Tensor x = nd::arange(0, 1 << 22);
  Tensor acc = nd::zeros({1 << 22});
  for (int i = 0; i < 8; ++i) {
    Tensor d = x.To(gpu(0));
    Tensor back = d.To(cpu());
    acc = acc + back;  // reads each round trip in order
  }
  CHECK(nd::sum(acc).Item() == doctest::Approx(8.0 * (double(1 << 22) - 1) * (1 << 22) / 2).epsilon(1e-6));
}

TEST_CASE("gpu: without a usable GPU the error says why, for this build") {
  try {
    Tensor::Empty({1}, DType::kFloat32, gpu(NumGPUs()));
    FAIL("expected DeviceError");
  } catch (const DeviceError& e) {
    std::string m = e.what();
    // A CUDA build on a machine without a GPU says the device does not exist; a CPU-only build
    // says it was built without CUDA. Either way the message names what to do.
    if (cuda::CompiledWithCuda() || NumGPUs() > 0) CHECK(m.find("does not exist") != std::string::npos);
    else CHECK(m.find("without CUDA") != std::string::npos);
    CHECK(m.find("kiln.cpu()") != std::string::npos);
  }
}

// ---- the driver and kernels: what a real GPU reports (PTX needs the real driver) ----
namespace {
// A kernel that does nothing, in PTX old enough for every driver kiln supports.
const char* kNoopPtx = R"(.version 7.0
.target sm_75
.address_size 64
.visible .entry kiln_noop()
{
  ret;
}
)";
// The same kernel as NVPTX IR (what kiln's codegen hands the platform beside the PTX; the
// simulator runs the IR, a real GPU loads the PTX).
const char* kNoopIr = R"(target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"
define ptx_kernel void @kiln_noop() {
  ret void
}
)";
}  // namespace

TEST_CASE("gpu: the driver and the device describe themselves") {
  KILN_REQUIRE_GPU();
  CHECK(cuda::DriverVersion() >= 12000);  // the simulator stands for a CUDA 13.0 driver
  CHECK(cuda::ComputeCapability(gpu(0)) >= 75);
  std::string d = cuda::DeviceDescription(gpu(0));
  MESSAGE("gpu(0): " << d << "; driver CUDA " << cuda::DriverVersion());
  CHECK(d.find("sm_") != std::string::npos);
}

TEST_CASE("gpu: kernel modules load once, launch, and report the driver's errors") {
  KILN_REQUIRE_GPU();
  void* fn = cuda::LoadKernel(gpu(0), kNoopIr, kNoopPtx, "kiln_noop");
  CHECK(cuda::LoadKernel(gpu(0), kNoopIr, kNoopPtx, "kiln_noop") == fn);
  cuda::LaunchKernel(fn, 4, 256, 0, nullptr);
  cuda::SynchronizeDevice(gpu(0));
  // Block size above the device's 1024 threads: the driver refuses the launch.
  CHECK(testing::Contains(testing::ErrorOf<DeviceError>([&] { cuda::LaunchKernel(fn, 1, 2048, 0, nullptr); }),
                          "CUDA_ERROR_INVALID_VALUE"));
  // Dynamic shared memory above 48 KiB without the per-kernel opt-in is refused as well.
  CHECK(testing::Contains(testing::ErrorOf<DeviceError>([&] { cuda::LaunchKernel(fn, 1, 32, 64 << 10, nullptr); }),
                          "CUDA_ERROR_INVALID_VALUE"));
  cuda::SynchronizeDevice(gpu(0));  // a refused launch leaves the context usable
  cuda::LaunchKernel(fn, 1, 32, 0, nullptr);
  cuda::SynchronizeDevice(gpu(0));
  std::string msg = testing::ErrorOf<DeviceError>([] { cuda::LoadKernel(gpu(0), kNoopIr, kNoopPtx, "kiln_missing"); });
  CHECK(testing::Contains(msg, "kiln_missing"));
}

TEST_CASE("gpu: PTX the driver cannot compile is an error with its JIT log") {
  KILN_REQUIRE_REAL_GPU();  // the driver's PTX compiler: only a real GPU has one
  void* fn = cuda::LoadKernel(gpu(0), kNoopPtx, "kiln_noop");
  CHECK(fn != nullptr);
  std::string msg = testing::ErrorOf<DeviceError>([] { cuda::LoadKernel(gpu(0), kNoopPtx, "kiln_missing"); });
  CHECK(testing::Contains(msg, "no kernel 'kiln_missing'"));
  msg = testing::ErrorOf<DeviceError>([] { cuda::LoadKernel(gpu(0), ".version 7.0\n.target sm_75\nnot ptx;\n", "k"); });
  CHECK(testing::Contains(msg, "cuModuleLoadDataEx"));
  CHECK(testing::Contains(msg, "JIT log"));
}

