// The CUDA device layer: device count, allocator, streams and copies. Without a GPU (or when
// built without CUDA) these report themselves skipped, and CPU work is unaffected.
#include <doctest/doctest.h>

#include "gpu_skip.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cuda.h"

using namespace kiln;

TEST_CASE("gpu: a missing GPU is a clear DeviceError, not a crash") {
  if (NumGPUs() > 0) return;
  CHECK_THROWS_AS(Tensor::Empty({2}, DType::kFloat32, gpu(0)), DeviceError);
  try {
    nd::zeros({2}, DType::kFloat32, gpu(0));
    FAIL("expected DeviceError");
  } catch (const DeviceError& e) {
    CHECK(std::string(e.what()).find("gpu(0)") != std::string::npos);
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
  if (NumGPUs() > 0) return;
  try {
    Tensor::Empty({1}, DType::kFloat32, gpu(0));
    FAIL("expected DeviceError");
  } catch (const DeviceError& e) {
    std::string m = e.what();
    // A CUDA build on a machine without a GPU says the device does not exist; a CPU-only build
    // says it was built without CUDA. Either way the message names what to do.
    if (cuda::CompiledWithCuda()) CHECK(m.find("does not exist") != std::string::npos);
    else CHECK(m.find("without CUDA") != std::string::npos);
    CHECK(m.find("kiln.cpu()") != std::string::npos);
  }
}
