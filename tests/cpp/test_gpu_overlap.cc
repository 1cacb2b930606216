// d2l.ai's automatic parallelism on a GPU (section 12.3), checked by the order of CUDA event
// timestamps rather than by speed: copying y[i-1] to the host (an engine task on the device's
// device-to-host stream) runs while y[i] is being computed (a task on its compute stream).
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gpu_skip.h"
#include "kiln/codegen/ptx.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/tensor.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/gpu.h"

namespace {

using namespace kiln;

// A task on `stream` of gpu(0) that records `begin`, runs body() and records `end` there.
void PushTimed(engine::StreamKind stream, const char* name, std::vector<engine::Var*> reads,
               std::vector<engine::Var*> writes, gpurt::Event begin, gpurt::Event end, std::function<void()> body) {
  engine::TaskOptions o;
  o.device = gpu(0);
  o.stream = stream;
  o.name = name;
  engine::Engine::Get().Push(
      [=] {
        gpurt::Stream s = static_cast<gpurt::Stream>(cuda::CurrentStream());
        gpurt::Get().EventRecord(begin, s);
        body();
        gpurt::Get().EventRecord(end, s);
      },
      reads, writes, o);
}

}  // namespace

TEST_CASE("gpu: copying the previous result to the host overlaps computing the next (event timestamps)") {
  KILN_REQUIRE_GPU();
  const int64_t n = int64_t{1} << 21;
  codegen::Expr e;  // enough work per element that the computation outlasts the copy's start
  int x = e.Input(0);
  e.Unary(UnaryFn::kTanh, e.Unary(UnaryFn::kExp, e.Unary(UnaryFn::kSin, e.Mul(x, x))));
  int cc = cuda::ComputeCapability(gpu(0));
  codegen::PtxKernel k = codegen::GeneratePtx(e, "sm_" + std::to_string(cc > 90 ? 90 : cc));
  void* fn = cuda::LoadKernel(gpu(0), k.ir, k.ptx, k.name);

  Tensor in = nd::arange(0, static_cast<double>(n), 1, DType::kFloat32, gpu(0));
  Tensor prev = nd::ones({n}, DType::kFloat32, gpu(0));  // y[i-1], computed already
  Tensor next = Tensor::Empty(Shape({n}), DType::kFloat32, gpu(0));
  prev.ToVector<float>();
  std::vector<float> host(static_cast<size_t>(n));
  gpurt::Platform& p = gpurt::Get();
  gpurt::DeviceGuard guard(0);
  gpurt::Event c0 = p.EventCreate(true), c1 = p.EventCreate(true), d0 = p.EventCreate(true), d1 = p.EventCreate(true);
  // y[i] on the compute stream, then y[i-1] to the host on the copy stream: the copy depends on
  // y[i-1] only, so the engine starts it while the kernel runs.
  // A real GPU computes it in microseconds: repeat it so that it lasts milliseconds there too.
  const int repeats = std::string(p.Name()) == "cuda" ? 1000 : 1;
  std::atomic<bool> launched{false};
  PushTimed(engine::StreamKind::kCompute, "compute_y_i", {in.storage()->var()}, {next.storage()->var()}, c0, c1,
            [fn, in, next, n, repeats, &launched] {
              void* out = next.View().data;
              void* a = in.View().data;
              int64_t count = n;
              void* args[] = {&out, &a, &count};
              for (int r = 0; r < repeats; ++r) cuda::LaunchKernel(fn, 512, 256, 0, args);
              launched = true;
            });
  // The copy is pushed once the computation is under way: on a loaded machine the compute worker
  // may otherwise start so late that the copy is over before it (a legal order, but not the one
  // this test is about). If the engine made the copy wait for the kernel, they would not overlap.
  while (!launched) std::this_thread::sleep_for(std::chrono::microseconds(200));
  Tensor copied = nd::zeros({1});  // written by the copy task, so that the test can wait for it
  PushTimed(engine::StreamKind::kCopyD2H, "copy_y_prev", {prev.storage()->var()}, {copied.storage()->var()}, d0, d1,
            [prev, &host, n] {
    cuda::CopyAsync(host.data(), prev.View().data, static_cast<size_t>(n) * 4, cuda::CopyKind::kDeviceToHost);
    cuda::SynchronizeWorkerStream();  // `host` is read by the test below
  });
  next.ToVector<float>();  // waits for the two tasks (not WaitForAll: it reports other tests' errors too)
  copied.ToVector<float>();
  for (gpurt::Event ev : {c0, c1, d0, d1}) p.EventSynchronize(ev);
  const float copy_start_before_compute_end = p.EventElapsedMs(d0, c1);
  const float compute_start_before_copy_end = p.EventElapsedMs(c0, d1);
  MESSAGE("compute " << p.EventElapsedMs(c0, c1) << " ms, copy " << p.EventElapsedMs(d0, d1)
                     << " ms; the copy began " << copy_start_before_compute_end << " ms before the compute ended");
  CHECK(copy_start_before_compute_end > 0);  // the two intervals overlap
  CHECK(compute_start_before_copy_end > 0);
  CHECK(host[static_cast<size_t>(n) - 1] == 1.0f);
  for (gpurt::Event ev : {c0, c1, d0, d1}) p.EventDestroy(ev);
}

TEST_CASE("gpu: CPU work and GPU work run at the same time (host times of both)") {
  KILN_REQUIRE_GPU();
  using Clock = std::chrono::steady_clock;
  const int64_t n = int64_t{1} << 21;
  codegen::Expr e;
  int x = e.Input(0);
  e.Unary(UnaryFn::kTanh, e.Unary(UnaryFn::kExp, e.Unary(UnaryFn::kSin, e.Mul(x, x))));
  int cc = cuda::ComputeCapability(gpu(0));
  codegen::PtxKernel k = codegen::GeneratePtx(e, "sm_" + std::to_string(cc > 90 ? 90 : cc));
  void* fn = cuda::LoadKernel(gpu(0), k.ir, k.ptx, k.name);
  Tensor in = nd::arange(0, static_cast<double>(n), 1, DType::kFloat32, gpu(0));
  Tensor out = Tensor::Empty(Shape({n}), DType::kFloat32, gpu(0));
  Tensor c = nd::zeros({1});
  in.ToVector<float>();
  // The GPU's start and end as host times: host functions the stream runs around the kernel.
  static Clock::time_point g[2];
  auto stamp = [](void* i) { g[reinterpret_cast<intptr_t>(i)] = Clock::now(); };
  const int repeats = std::string(gpurt::Get().Name()) == "cuda" ? 1000 : 1;
  engine::TaskOptions o;
  o.device = gpu(0);
  o.name = "gpu_work";
  engine::Engine::Get().Push(
      [=] {
        gpurt::Stream s = static_cast<gpurt::Stream>(cuda::CurrentStream());
        gpurt::Get().LaunchHostFunc(s, stamp, reinterpret_cast<void*>(intptr_t{0}));
        void* o_ = out.View().data;
        void* a = in.View().data;
        int64_t count = n;
        void* args[] = {&o_, &a, &count};
        for (int r = 0; r < repeats; ++r) cuda::LaunchKernel(fn, 512, 256, 0, args);
        gpurt::Get().LaunchHostFunc(s, stamp, reinterpret_cast<void*>(intptr_t{1}));
      },
      std::vector<engine::Var*>{in.storage()->var()}, std::vector<engine::Var*>{out.storage()->var()}, o);
  // CPU work pushed right after, independent of the GPU's.
  Clock::time_point h[2];
  engine::TaskOptions oc;
  oc.device = cpu(0);
  oc.name = "cpu_work";
  engine::Engine::Get().Push(
      [&h] {
        h[0] = Clock::now();
        volatile double acc = 0;
        while (Clock::now() - h[0] < std::chrono::milliseconds(30)) acc = acc + 1;
        h[1] = Clock::now();
      },
      std::vector<engine::Var*>{}, std::vector<engine::Var*>{c.storage()->var()}, oc);
  out.ToVector<float>();  // waits for the two tasks
  c.ToVector<float>();
  cuda::SynchronizeDevice(gpu(0));
  auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  MESSAGE("GPU " << ms(g[0], g[1]) << " ms, CPU " << ms(h[0], h[1]) << " ms; the CPU began "
                 << ms(h[0], g[1]) << " ms before the GPU ended");
  CHECK(h[0] < g[1]);  // the two intervals overlap: neither waited for the other
  CHECK(g[0] < h[1]);
}

#endif  // KILN_WITH_CODEGEN
