// The engine on GPUs (real or simulated: CTest's sim2: run): GPU tasks issue work to per-device
// streams and complete without waiting for it; the next GPU task waits for it on its own stream
// (an event), CPU tasks and sync points wait on the host.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "gpu_skip.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/gpu.h"

using namespace kiln;

namespace {

struct Flags {
  std::atomic<bool> go{false};
  std::atomic<int> step{0};
  std::atomic<int> b_saw{-1}, c_saw{-1}, d_saw{-1};
};

void Hold(void* f) {
  auto* x = static_cast<Flags*>(f);
  while (!x->go.load()) std::this_thread::yield();
  x->step = 1;
}

bool WaitUntil(const std::function<bool()>& done) {
  for (int i = 0; i < 5000 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done();
}

}  // namespace

TEST_CASE("gpu engine: GPU tasks are ordered by events on their streams, not by host waits") {
  KILN_REQUIRE_GPU();
  engine::Engine& e = engine::Engine::Get();
  if (e.IsNaive()) return;  // KILN_ENGINE=naive synchronizes every task by design
  e.WaitForAll();
  engine::Var* x = e.NewVar();
  engine::Var* y = e.NewVar();
  engine::Var* z = e.NewVar();
  Flags f;
  const int64_t done0 = e.Stats().completed;
  engine::TaskOptions o;
  o.device = gpu(0);
  o.stream = engine::StreamKind::kCompute;
  o.name = "hold";
  // A: long GPU work writing x (a host function holds its stream until `go`).
  e.Push([&f] { gpurt::Get().LaunchHostFunc(static_cast<gpurt::Stream>(cuda::CurrentStream()), Hold, &f); }, {},
         std::span<engine::Var* const>(&x, 1), o);
  // B: GPU work on another stream (copy in) reading x, writing y.
  o.stream = engine::StreamKind::kCopyH2D;
  o.name = "after";
  e.Push([&f] {
    gpurt::Get().LaunchHostFunc(static_cast<gpurt::Stream>(cuda::CurrentStream()),
                                [](void* p) { static_cast<Flags*>(p)->b_saw = static_cast<Flags*>(p)->step.load(); },
                                &f);
  }, std::span<engine::Var* const>(&x, 1), std::span<engine::Var* const>(&y, 1), o);
  // D: GPU work on the second device reading y (a wait across devices).
  o.device = gpu(1 % NumGPUs());
  o.stream = engine::StreamKind::kCompute;
  o.name = "other device";
  e.Push([&f] {
    gpurt::Get().LaunchHostFunc(static_cast<gpurt::Stream>(cuda::CurrentStream()),
                                [](void* p) { static_cast<Flags*>(p)->d_saw = static_cast<Flags*>(p)->b_saw.load(); },
                                &f);
  }, std::span<engine::Var* const>(&y, 1), std::span<engine::Var* const>(&z, 1), o);
  // All three bodies return while A's work is still held: nobody waited on the host.
  CHECK(WaitUntil([&] { return e.Stats().completed >= done0 + 3; }));
  CHECK(f.b_saw.load() == -1);  // B's work waits for A's on its stream
  CHECK(f.d_saw.load() == -1);
  // C: a CPU task reading y waits on the host for B's work.
  engine::TaskOptions c;
  c.name = "cpu reader";
  e.Push([&f] { f.c_saw = f.b_saw.load(); }, std::span<engine::Var* const>(&y, 1), {}, c);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK(f.c_saw.load() == -1);
  f.go = true;
  e.WaitForVar(y);  // a sync point: B's GPU work is done when it returns
  CHECK(f.b_saw.load() == 1);
  e.WaitForAll();
  CHECK(f.c_saw.load() == 1);
  CHECK(f.d_saw.load() == 1);
  for (engine::Var* v : {x, y, z}) e.ReleaseVar(v);
}
