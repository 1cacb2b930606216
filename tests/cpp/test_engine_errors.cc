// Engine errors that keep their type, and sync points that an interrupt check ends (engine.h,
// interrupt.h): a DistributedError stays a DistributedError, a GpuError keeps its code, an error
// is named once; a throwing check ends WaitForVar and WaitForAll while the work goes on, and the
// engine stays usable; eager ops name the call site a provider gives. Every engine kind
// (threaded, naive) where it applies.
//
// No test asserts on elapsed time; a blocked task waits at a gate the test opens.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kiln/frontend/call_site.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "gpu_skip.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/interrupt.h"
#include "kiln/runtime/mpi.h"
#include "test_util.h"

namespace {

using kiln::engine::CreateEngine;
using kiln::engine::Engine;
using kiln::engine::TaskOptions;
using kiln::engine::Var;
using kiln::testing::ScopedEnv;

std::unique_ptr<Engine> MakeEngine(const std::string& config) {
  if (config == "naive") return CreateEngine("naive");
  ScopedEnv env("KILN_CPU_WORKERS", config == "threaded1" ? "1" : "2");
  return CreateEngine("threaded");
}

struct VarGuard {
  Engine& e;
  Var* v;
  explicit VarGuard(Engine& eng) : e(eng), v(eng.NewVar()) {}
  ~VarGuard() { e.ReleaseVar(v); }
};

void PushThrowing(Engine& e, Var* w, const char* name, const char* site, std::function<void()> fn) {
  TaskOptions o;
  o.name = name;
  o.call_site = site;
  e.Push(std::move(fn), {}, std::vector<Var*>{w}, o);
}

// A task blocks here until the test opens it.
struct Gate {
  std::atomic<int> open{0};
  void Wait() { open.wait(0); }
  void Open() {
    open.store(1);
    open.notify_all();
  }
};

// The interrupt check of these tests: throws once `armed` is set (and counts its calls).
std::atomic<bool> g_armed{false};
std::atomic<int> g_checks{0};
struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};
void TestCheck() {
  g_checks.fetch_add(1);
  if (g_armed.load()) throw Interrupted();
}
struct InstalledCheck {
  InstalledCheck() {
    g_armed = false, g_checks = 0;
    kiln::SetInterruptCheck(&TestCheck);
  }
  ~InstalledCheck() { kiln::SetInterruptCheck(nullptr); }
};

}  // namespace

TEST_CASE("engine errors: a DistributedError from a task is still a DistributedError, named once") {
  for (const char* config : {"threaded1", "threaded2", "naive"}) {
    CAPTURE(config);
    auto e = MakeEngine(config);
    VarGuard a(*e), b(*e);
    PushThrowing(*e, a.v, "allreduce", "train.py:7", [] { throw kiln::DistributedError("rank 1 of 2 died"); });
    try {
      e->WaitForVar(a.v);
      FAIL("no error");
    } catch (const kiln::DistributedError& x) {
      CHECK(std::string(x.what()) == "error in operator 'allreduce' (called from train.py:7): rank 1 of 2 died");
    }
    // WaitForAll rethrows the same object: the type and the one prefix again.
    try {
      e->WaitForAll();
      FAIL("no error");
    } catch (const kiln::DistributedError& x) {
      CHECK(std::string(x.what()) == "error in operator 'allreduce' (called from train.py:7): rank 1 of 2 died");
    }
    // A task body that rethrows another task's stored error does not name it a second time.
    std::exception_ptr stored = e->VarError(a.v);
    REQUIRE(stored);
    PushThrowing(*e, b.v, "outer", nullptr, [stored] { std::rethrow_exception(stored); });
    try {
      e->WaitForVar(b.v);
      FAIL("no error");
    } catch (const kiln::DistributedError& x) {
      CHECK(std::string(x.what()).find("outer") == std::string::npos);
    }
    CHECK_THROWS_AS(e->WaitForAll(), kiln::DistributedError);
  }
}

TEST_CASE("engine errors: a GpuError keeps its code, std::bad_alloc becomes a MemoryError") {
  for (const char* config : {"threaded2", "naive"}) {
    CAPTURE(config);
    auto e = MakeEngine(config);
    VarGuard a(*e), b(*e);
    PushThrowing(*e, a.v, "matmul", nullptr, [] { throw kiln::gpurt::GpuError(700, "cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS"); });
    try {
      e->WaitForVar(a.v);
      FAIL("no error");
    } catch (const kiln::gpurt::GpuError& x) {
      CHECK(x.code() == 700);
      CHECK(std::string(x.what()) == "error in operator 'matmul': cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS");
    }
    PushThrowing(*e, b.v, "zeros", nullptr, [] { throw std::bad_alloc(); });
    CHECK_THROWS_AS(e->WaitForVar(b.v), kiln::MemoryError);
    CHECK_THROWS_AS(e->WaitForAll(), kiln::gpurt::GpuError);
  }
}

TEST_CASE("engine errors: an interrupt check ends WaitForVar and WaitForAll, the work goes on") {
  auto e = MakeEngine("threaded2");
  VarGuard a(*e), b(*e);
  Gate gate;
  struct OpenAtExit {  // a failed check must not leave the engine's destructor waiting forever
    Gate& g;
    ~OpenAtExit() { g.Open(); }
  } open_at_exit{gate};
  InstalledCheck installed;
  int value = 0;
  TaskOptions o;
  o.name = "slow";
  e->Push([&] { gate.Wait(), value = 1; }, {}, std::vector<Var*>{a.v}, o);
  // Not armed: the check runs while the wait sleeps (every kInterruptPoll) and the wait goes on.
  std::thread opener([&] {
    while (g_checks.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    g_armed = true;  // the next check throws
  });
  CHECK_THROWS_AS(e->WaitForVar(a.v), Interrupted);
  opener.join();
  CHECK_THROWS_AS(e->WaitForAll(), Interrupted);
  CHECK(value == 0);  // still blocked: the interrupted waits cancelled nothing

  // The engine stays usable: the blocked task finishes, later tasks run, waits return.
  g_armed = false;
  gate.Open();
  e->WaitForVar(a.v);
  CHECK(value == 1);
  o.name = "later";
  e->Push([&] { value = 2; }, std::vector<Var*>{a.v}, std::vector<Var*>{b.v}, o);
  CHECK_NOTHROW(e->WaitForAll());
  CHECK(value == 2);
}

// A task's GPU work outlasts the task: the sync points then wait for the device, and Ctrl-C must
// end those waits too. The stream's work is a host function that holds the stream until released.
TEST_CASE("gpu engine: an interrupt check ends the waits for a device's work, the work goes on") {
  KILN_REQUIRE_GPU();
  Engine& e = Engine::Get();
  VarGuard a(e);
  static std::atomic<int> stage{0};  // 0: the stream is held, 1: released, 2: its work is over
  static std::atomic<bool> issued{false};
  stage = 0, issued = false;
  struct ReleaseAtExit {  // a failed check must not leave the stream held for later tests
    ~ReleaseAtExit() {
      if (stage.load() == 0) stage = 1;
    }
  } release_at_exit;
  InstalledCheck installed;
  TaskOptions o;
  o.device = kiln::gpu(0);
  o.name = "long_gpu_work";
  e.Push(
      [] {
        auto s = static_cast<kiln::gpurt::Stream>(kiln::cuda::CurrentStream());
        kiln::gpurt::Get().LaunchHostFunc(
            s,
            [](void*) {
              while (stage.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
              stage = 2;
            },
            nullptr);
        issued = true;
      },
      {}, std::vector<Var*>{a.v}, o);
  while (!issued.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread arm([] {
    while (g_checks.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    g_armed = true;
  });
  CHECK_THROWS_AS(e.WaitForVar(a.v), Interrupted);  // the task is done, its stream's work is not
  arm.join();
  CHECK_THROWS_AS(e.WaitForAll(), Interrupted);  // the device synchronization goes on meanwhile
  CHECK(stage.load() == 0);

  g_armed = false;
  stage = 1;
  e.WaitForVar(a.v);
  CHECK(stage.load() == 2);
  CHECK_NOTHROW(e.WaitForAll());
  // Later work on the device is waited for as before.
  kiln::Tensor t = kiln::nd::ones({4}, kiln::DType::kFloat32, kiln::gpu(0));
  CHECK(t.ToVector<float>() == std::vector<float>(4, 1.0f));
  CHECK_NOTHROW(e.WaitForAll());
}

TEST_CASE("engine errors: with nothing pending, waits return without calling the check") {
  auto e = MakeEngine("threaded1");
  VarGuard a(*e);
  InstalledCheck installed;
  g_armed = true;
  CHECK_NOTHROW(e->WaitForVar(a.v));
  CHECK_NOTHROW(e->WaitForAll());
  CHECK(g_checks.load() == 0);
}

namespace {
std::atomic<int> g_blocking_in{0}, g_blocking_out{0};
void CountingBlockingHook(bool entering) { (entering ? g_blocking_in : g_blocking_out)++; }
struct InstalledBlockingHook {
  InstalledBlockingHook() {
    g_blocking_in = 0, g_blocking_out = 0;
    kiln::SetBlockingHook(&CountingBlockingHook);
  }
  ~InstalledBlockingHook() { kiln::SetBlockingHook(nullptr); }
};
}  // namespace

// Python's hook lets go of the GIL there: a task the full queue waits for may need it.
TEST_CASE("engine errors: a Push that waits for room in the queue calls the blocking hook around the wait") {
  auto e = MakeEngine("threaded1");
  e->SetLimits(1, 0);
  VarGuard a(*e), b(*e), c(*e);
  Gate gate;
  struct OpenAtExit {
    Gate& g;
    ~OpenAtExit() { g.Open(); }
  } open_at_exit{gate};
  InstalledBlockingHook installed;
  TaskOptions o;
  o.name = "gated";
  e->Push([&] { gate.Wait(); }, {}, std::vector<Var*>{a.v}, o);
  o.name = "queued";
  e->Push([] {}, {}, std::vector<Var*>{b.v}, o);  // one task may always wait behind the running one
  CHECK(g_blocking_in.load() == 0);  // room so far: no hook
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    TaskOptions p;
    p.name = "third";
    e->Push([] {}, {}, std::vector<Var*>{c.v}, p);
    pushed = true;
  });
  while (g_blocking_in.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK_FALSE(pushed.load());  // the hook ran before the wait, and the wait goes on
  CHECK(g_blocking_out.load() == 0);
  gate.Open();
  producer.join();
  CHECK(pushed.load());
  CHECK(g_blocking_in.load() == 1);
  CHECK(g_blocking_out.load() == 1);
  CHECK_NOTHROW(e->WaitForAll());
}

namespace {
const char* TestProvider() { return "provider.py:3"; }
}  // namespace

TEST_CASE("engine errors: an eager op's error names the call site of the provider, SetCallSite first") {
  kiln::Tensor x = kiln::nd::arange(0, 6);
  kiln::Tensor bad = kiln::Tensor::FromVector<int64_t>({1, 9}, kiln::Shape({2}));
  kiln::SetCallSiteProvider(&TestProvider);
  struct Remove {
    ~Remove() { kiln::SetCallSiteProvider(nullptr); }
  } remove;
  std::string msg;
  try {
    kiln::nd::take(x, bad).WaitToRead();
  } catch (const kiln::ValueError& e) {
    msg = e.what();
  }
  CHECK(kiln::testing::Contains(msg, "error in operator 'take' (called from provider.py:3): take: index 9"));
  kiln::SetCallSite("explicit.cc:4");
  try {
    kiln::nd::take(x, bad).WaitToRead();
  } catch (const kiln::ValueError& e) {
    msg = e.what();
  }
  kiln::SetCallSite(nullptr);
  CHECK(kiln::testing::Contains(msg, "(called from explicit.cc:4)"));
  // Both errors were raised and their tensors are gone: waitall has nothing left to report.
  CHECK_NOTHROW(kiln::engine::Engine::Get().WaitForAll());
}

TEST_CASE("engine errors: WaitForAll reports an error nobody raised or a live variable holds, no other") {
  for (const char* config : {"threaded1", "threaded2", "naive"}) {
    CAPTURE(config);
    auto e = MakeEngine(config);
    auto fail = [](Engine& eng, Var* v) {
      PushThrowing(eng, v, "bad_op", nullptr, [] { throw kiln::ValueError("bad value"); });
    };
    auto unrelated_work = [](Engine& eng) {
      VarGuard c(eng);
      int value = 0;
      eng.Push([&value] { value = 7; }, {}, std::vector<Var*>{c.v}, TaskOptions{});
      CHECK_NOTHROW(eng.WaitForAll());
      CHECK_NOTHROW(eng.WaitForVar(c.v));
      CHECK(value == 7);
    };
    {  // raised at WaitForVar, then its variable is released: never again
      VarGuard a(*e);
      fail(*e, a.v);
      CHECK_THROWS_AS(e->WaitForVar(a.v), kiln::ValueError);
    }
    unrelated_work(*e);
    {  // the same through a reader that passed it on: raised on the reader, both released
      VarGuard a(*e), b(*e);
      fail(*e, a.v);
      e->Push([] {}, std::vector<Var*>{a.v}, std::vector<Var*>{b.v}, TaskOptions{});
      CHECK_THROWS_AS(e->WaitForVar(b.v), kiln::ValueError);
    }
    unrelated_work(*e);
    {  // never raised: WaitForAll reports it although its variable is gone (an error is not lost)
      VarGuard a(*e);
      fail(*e, a.v);
    }
    CHECK_THROWS_AS(e->WaitForAll(), kiln::ValueError);
    unrelated_work(*e);
    {  // raised, but its variable lives on and still holds it: WaitForAll reports it, once
      VarGuard a(*e);
      fail(*e, a.v);
      CHECK_THROWS_AS(e->WaitForVar(a.v), kiln::ValueError);
      CHECK_THROWS_AS(e->WaitForAll(), kiln::ValueError);
      CHECK_NOTHROW(e->WaitForAll());
      CHECK_THROWS_AS(e->WaitForVar(a.v), kiln::ValueError);  // the variable keeps it
    }
    {  // raised, then the variable is rewritten: the error is gone with the value
      VarGuard a(*e);
      fail(*e, a.v);
      CHECK_THROWS_AS(e->WaitForVar(a.v), kiln::ValueError);
      e->Push([] {}, {}, std::vector<Var*>{a.v}, TaskOptions{});
      CHECK_NOTHROW(e->WaitForVar(a.v));
      CHECK_NOTHROW(e->WaitForAll());
    }
    {  // many raised and released errors before one nobody raised: that one is reported
      for (int i = 0; i < 100; ++i) {
        VarGuard a(*e);
        fail(*e, a.v);
        CHECK_THROWS_AS(e->WaitForVar(a.v), kiln::ValueError);
      }
      VarGuard a(*e);
      PushThrowing(*e, a.v, "last_op", nullptr, [] { throw kiln::DistributedError("lost rank"); });
    }
    CHECK_THROWS_AS(e->WaitForAll(), kiln::DistributedError);
    unrelated_work(*e);
  }
}

TEST_CASE("engine errors: a failed op raised at a sync point does not fail a later test's waitall") {
  // Two unrelated parts in one process, as two test cases run one after the other: the first
  // catches its op's error at the tensor's sync point, the second must not see it again.
  auto part = [](kiln::Device d) {
    CAPTURE(d.str());
    if (d.is_cpu()) {
      kiln::Tensor x = kiln::nd::arange(0, 6);
      kiln::Tensor bad = kiln::Tensor::FromVector<int64_t>({1, 9}, kiln::Shape({2}));
      CHECK_THROWS_AS(kiln::nd::take(x, bad).ToVector<float>(), kiln::ValueError);
    }
    CHECK_THROWS_AS(kiln::nd::random::bernoulli(1.5, kiln::Shape({4}), kiln::DType::kFloat32, d).WaitToRead(),
                    kiln::ValueError);
    // The later, unrelated part.
    kiln::Tensor y = kiln::nd::arange(0, 4).To(d);
    CHECK_NOTHROW(kiln::engine::Engine::Get().WaitForAll());
    CHECK(y.To(kiln::cpu()).ToVector<float>() == std::vector<float>{0, 1, 2, 3});
    CHECK_NOTHROW(kiln::engine::Engine::Get().WaitForAll());
  };
  kiln::engine::Engine::Get().WaitForAll();  // start with nothing pending
  part(kiln::cpu());
  if (kiln::NumGPUs() > 0) part(kiln::gpu(0));
}
