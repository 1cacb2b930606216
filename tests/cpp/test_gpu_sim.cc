// The simulated GPU's checks, each asserting the CUDA error code a real driver returns for the
// same mistake (the list is in runtime/gpusim/README.md): launch limits, devices, events, capture,
// memory. Kernels are test doubles whose GPU threads run a lambda (gpu_sim_util.h). They run on
// the process's simulator under KILN_GPU_SIM, else on a private one, so never skip.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>
#include <vector>

#include "gpu_sim_util.h"

using namespace kiln;
using namespace kiln::testing;
using gpurt::Dim3;

namespace {

// Loads a kernel "k" whose threads run `body`, with `regs` registers, on the current device.
gpurt::Function LoadLambda(const std::string& id, ThreadBody body, int regs = 16, LambdaKernel** out = nullptr,
                           std::vector<size_t> params = {}) {
  static std::map<std::string, LambdaKernel*> made;
  LambdaModules()[id] = [=] {
    gpusim::KernelAttributes a;
    a.num_regs = regs;
    a.param_sizes = params;
    auto k = std::make_unique<LambdaKernel>(body, a);
    made[id] = k.get();
    return k;
  };
  gpurt::Module m = LambdaCompilerScope::Load(Sim(), id);
  gpurt::Function f = Sim().ModuleGetFunction(m, "k");
  if (out) *out = made[id];
  return f;
}

void Nop(Dim3, Dim3, Dim3, void**) {}

// Runs `child` in a forked process; returns its termination signal (0 when it exited).
template <class F>
int SignalOfChild(F child) {
  pid_t pid = fork();
  if (pid == 0) {
    std::signal(SIGSEGV, SIG_DFL);  // die of it, without the test framework's crash report
    std::signal(SIGBUS, SIG_DFL);
    child();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

}  // namespace

TEST_CASE("gpu sim: devices look like an sm_90 part and the current device is per thread") {
  gpurt::Platform& p = Sim();
  REQUIRE(p.DeviceCount() >= 2);
  gpurt::DeviceProperties d = p.Properties(0);
  CHECK(d.cc_major == 9);
  CHECK(d.max_threads_per_block == 1024);
  CHECK(d.shared_per_block == 48 << 10);
  CHECK(CodeOf([&] { p.SetDevice(p.DeviceCount()); }) == gpurt::kInvalidDevice);
  gpurt::DeviceGuard g(1, Sim());
  CHECK(p.GetDevice() == 1);
  int other = -1;
  std::thread([&] { other = p.GetDevice(); }).join();
  CHECK(other == 0);  // a new thread starts on device 0, as in CUDA
}

TEST_CASE("gpu sim: launch limits fail with the driver's codes") {
  LambdaCompilerScope scope;
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard g(0, Sim());
  gpurt::Stream s = p.StreamCreate();
  gpurt::Function f = LoadLambda("test:nop", Nop, /*regs=*/128);
  void* args[3] = {};
  auto launch = [&](Dim3 grid, Dim3 block, size_t smem) { p.LaunchKernel(f, grid, block, smem, s, args); };
  CHECK(CodeOf([&] { launch({1}, {256}, 0); }) == 0);
  CHECK(CodeOf([&] { launch({1}, {2048}, 0); }) == gpurt::kInvalidValue);      // more than 1024 threads
  CHECK(CodeOf([&] { launch({1}, {1, 1, 65}, 0); }) == gpurt::kInvalidValue);  // block z above 64
  CHECK(CodeOf([&] { launch({0}, {32}, 0); }) == gpurt::kInvalidValue);        // empty grid
  CHECK(CodeOf([&] { launch({1, 65536}, {32}, 0); }) == gpurt::kInvalidValue);  // grid y above 65535
  // 128 registers x 1024 threads = 128K registers, twice what a block has.
  CHECK(CodeOf([&] { launch({1}, {1024}, 0); }) == gpurt::kLaunchOutOfResources);
  CHECK(CodeOf([&] { launch({1}, {512}, 0); }) == 0);
  // Dynamic shared memory above 48 KiB needs the per-kernel opt-in, up to 227 KiB.
  CHECK(CodeOf([&] { launch({1}, {32}, 64 << 10); }) == gpurt::kInvalidValue);
  CHECK(CodeOf([&] { p.FuncSetMaxDynamicSharedMemory(f, 228 << 10); }) == gpurt::kInvalidValue);
  p.FuncSetMaxDynamicSharedMemory(f, 64 << 10);
  CHECK(CodeOf([&] { launch({1}, {32}, 64 << 10); }) == 0);
  CHECK(CodeOf([&] { launch({1}, {32}, 65 << 10); }) == gpurt::kInvalidValue);
  p.StreamSynchronize(s);
  p.StreamDestroy(s);
}

TEST_CASE("gpu sim: a launch into another device's stream, or of another device's kernel, is an invalid handle") {
  LambdaCompilerScope scope;
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard g(0, Sim());
  gpurt::Function f0 = LoadLambda("test:nop0", Nop);
  gpurt::Stream s0 = p.StreamCreate();
  p.SetDevice(1);
  gpurt::Stream s1 = p.StreamCreate();
  void* args[3] = {};
  // Current device 1, kernel of device 0 on device 1's stream.
  CHECK(CodeOf([&] { p.LaunchKernel(f0, {1}, {32}, 0, s1, args); }) == gpurt::kInvalidHandle);
  // Current device 1, device 0's stream: the thread's context is not the stream's.
  CHECK(CodeOf([&] { p.LaunchKernel(f0, {1}, {32}, 0, s0, args); }) == gpurt::kInvalidHandle);
  p.SetDevice(0);
  CHECK(CodeOf([&] { p.LaunchKernel(f0, {1}, {32}, 0, s0, args); }) == 0);
  p.StreamSynchronize(s0);
  p.StreamDestroy(s0);
  p.StreamDestroy(s1);
}

TEST_CASE("gpu sim: kernels see their arguments as they were at the launch") {
  LambdaCompilerScope scope;
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard g(0, Sim());
  gpurt::Stream s = p.StreamCreate();
  const int n = 4 * 64;
  float* d = static_cast<float*>(p.Malloc(n * sizeof(float)));
  gpurt::Function f = LoadLambda("test:fill", [](Dim3 b, Dim3 t, Dim3 bd, void** args) {
    float* out = HostView<float>(*static_cast<void**>(args[0]));
    float v = *static_cast<float*>(args[1]);
    out[b.x * bd.x + t.x] = v + static_cast<float>(b.x * bd.x + t.x);
  }, 16, nullptr, {8, 4});
  // Hold the stream so the kernel runs after the host changed its copy of the arguments.
  std::atomic<bool> go{false};
  p.LaunchHostFunc(s, [](void* a) { while (!static_cast<std::atomic<bool>*>(a)->load()) std::this_thread::yield(); },
                   &go);
  float value = 100;
  void* args[] = {&d, &value};
  p.LaunchKernel(f, {4}, {64}, 0, s, args);
  value = -1;
  go = true;
  std::vector<float> h(n);
  p.MemcpyAsync(h.data(), d, n * sizeof(float), gpurt::CopyKind::kDeviceToHost, s);  // pageable: synchronous
  for (int i = 0; i < n; ++i) REQUIRE(h[static_cast<size_t>(i)] == 100.0f + static_cast<float>(i));
  p.Free(d);
  p.StreamDestroy(s);
}

TEST_CASE("gpu sim: events order streams, and are used across devices only as CUDA allows") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard g(0, Sim());
  gpurt::Stream a = p.StreamCreate(), b = p.StreamCreate();
  gpurt::Event start = p.EventCreate(true), done = p.EventCreate(true), plain = p.EventCreate(false);
  CHECK(p.EventQuery(done));  // never recorded: complete, as in CUDA
  struct Gate {
    std::atomic<bool> go{false};
    std::atomic<int64_t> spin_start_ns{0};  // when stream a began to wait, after `start`
  } gate;
  std::atomic<int> order{0}, b_saw{-1};
  auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  p.EventRecord(start, a);
  p.LaunchHostFunc(a, [](void* x) {
    auto* g = static_cast<Gate*>(x);
    g->spin_start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
    while (!g->go.load()) std::this_thread::yield();
  }, &gate);
  struct Step {
    std::atomic<int>* order;
    std::atomic<int>* saw;
  } step{&order, &b_saw};
  p.LaunchHostFunc(a, [](void* x) { static_cast<Step*>(x)->order->store(1); }, &step);
  p.EventRecord(done, a);
  p.StreamWaitEvent(b, done);  // b's next work waits for a's, without the host waiting
  p.LaunchHostFunc(b, [](void* x) { static_cast<Step*>(x)->saw->store(static_cast<Step*>(x)->order->load()); }, &step);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(p.EventQuery(done));
  CHECK_FALSE(p.StreamQuery(b));
  CHECK(CodeOf([&] { p.EventElapsedMs(start, done); }) == gpurt::kNotReady);
  while (gate.spin_start_ns.load() == 0) std::this_thread::yield();  // a busy machine may start it late
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double held_ms = static_cast<double>(now_ns() - gate.spin_start_ns.load()) / 1e6;
  gate.go = true;
  p.StreamSynchronize(b);
  CHECK(b_saw.load() == 1);
  // `done` was recorded after the wait that `start` preceded: at least as long apart as it lasted.
  CHECK(p.EventElapsedMs(start, done) >= held_ms - 0.5);
  p.EventRecord(plain, a);
  p.EventSynchronize(plain);
  CHECK(CodeOf([&] { p.EventElapsedMs(start, plain); }) == gpurt::kInvalidHandle);  // timing disabled
  // Device 1's stream may wait on device 0's event, but may not record it; timing across devices fails.
  p.SetDevice(1);
  gpurt::Stream c = p.StreamCreate();
  gpurt::Event other = p.EventCreate(true);
  p.StreamWaitEvent(c, done);
  CHECK(CodeOf([&] { p.EventRecord(done, c); }) == gpurt::kInvalidHandle);
  p.EventRecord(other, c);
  p.EventSynchronize(other);
  CHECK(CodeOf([&] { p.EventElapsedMs(start, other); }) == gpurt::kInvalidHandle);
  p.StreamSynchronize(c);
  p.SetDevice(0);
  for (gpurt::Event e : {start, done, plain, other}) p.EventDestroy(e);
  for (gpurt::Stream s : {a, b, c}) p.StreamDestroy(s);
}

TEST_CASE("gpu sim: capture records work without running it, replays it, and refuses what CUDA refuses") {
  LambdaCompilerScope scope;
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard g(0, Sim());
  gpurt::Stream s = p.StreamCreate();
  const int n = 64;
  int* d = static_cast<int*>(p.Malloc(n * sizeof(int)));
  p.MemsetAsync(d, 0, n * sizeof(int), s);
  gpurt::Function inc = LoadLambda("test:inc", [](Dim3, Dim3 t, Dim3, void** args) {
    HostView<int>(*static_cast<void**>(args[0]))[t.x] += 1;
  }, 16, nullptr, {8});
  p.StreamBeginCapture(s);
  CHECK(p.StreamIsCapturing(s));
  void* args[] = {&d};
  p.LaunchKernel(inc, {1}, {n}, 0, s, args);
  p.LaunchKernel(inc, {1}, {n}, 0, s, args);
  gpurt::Graph graph = p.StreamEndCapture(s);
  std::vector<int> h(n);
  p.MemcpyAsync(h.data(), d, n * sizeof(int), gpurt::CopyKind::kDeviceToHost, s);
  CHECK(h[0] == 0);  // captured, not run
  gpurt::GraphExec exec = p.GraphInstantiate(graph);
  for (int i = 0; i < 3; ++i) p.GraphLaunch(exec, s);
  p.MemcpyAsync(h.data(), d, n * sizeof(int), gpurt::CopyKind::kDeviceToHost, s);
  CHECK(h[0] == 6);
  CHECK(h[n - 1] == 6);

  // Synchronizing or allocating during a capture: STREAM_CAPTURE_UNSUPPORTED, then INVALIDATED.
  p.StreamBeginCapture(s);
  CHECK(CodeOf([&] { p.StreamSynchronize(s); }) == gpurt::kCaptureUnsupported);
  CHECK(CodeOf([&] { p.StreamEndCapture(s); }) == gpurt::kCaptureInvalidated);
  p.StreamBeginCapture(s);
  CHECK(CodeOf([&] { p.Malloc(256); }) == gpurt::kCaptureUnsupported);
  CHECK(CodeOf([&] { p.StreamEndCapture(s); }) == gpurt::kCaptureInvalidated);
  p.StreamBeginCapture(s);
  CHECK(CodeOf([&] { p.DeviceSynchronize(); }) == gpurt::kCaptureUnsupported);
  CHECK(CodeOf([&] { p.StreamEndCapture(s); }) == gpurt::kCaptureInvalidated);
  // Querying or waiting for an event: prohibited to the capturing thread. Once invalidated, the
  // capture reports itself not active and every call on the stream fails with INVALIDATED until it
  // is ended (an H200 showed this; the executor used to leave such a capture open).
  gpurt::Event ev = p.EventCreate(false);
  p.EventRecord(ev, s);
  p.StreamBeginCapture(s);
  CHECK(CodeOf([&] { p.EventQuery(ev); }) == gpurt::kCaptureUnsupported);
  CHECK_FALSE(p.StreamIsCapturing(s));
  CHECK(CodeOf([&] { p.MemsetAsync(d, 0, 4, s); }) == gpurt::kCaptureInvalidated);
  CHECK(CodeOf([&] { p.EventRecord(ev, s); }) == gpurt::kCaptureInvalidated);
  CHECK(CodeOf([&] { p.StreamEndCapture(s); }) == gpurt::kCaptureInvalidated);
  p.MemsetAsync(d, 0, 4, s);  // the stream works again
  p.StreamBeginCapture(s);
  CHECK(CodeOf([&] { p.EventSynchronize(ev); }) == gpurt::kCaptureUnsupported);
  CHECK(CodeOf([&] { p.StreamEndCapture(s); }) == gpurt::kCaptureInvalidated);
  // An event last recorded in a capture stands for a point of the graph: querying or waiting for
  // it is CUDA_ERROR_CAPTURED_EVENT until it is recorded outside a capture again.
  p.StreamBeginCapture(s);
  p.EventRecord(ev, s);
  p.GraphDestroy(p.StreamEndCapture(s));
  CHECK(CodeOf([&] { p.EventQuery(ev); }) == gpurt::kCapturedEvent);
  CHECK(CodeOf([&] { p.EventSynchronize(ev); }) == gpurt::kCapturedEvent);
  p.EventRecord(ev, s);
  p.EventSynchronize(ev);
  CHECK(p.EventQuery(ev));
  p.EventDestroy(ev);
  // Ending a capture that was not begun, or on another thread than the one that began it.
  CHECK(CodeOf([&] { p.StreamEndCapture(s); }) == gpurt::kIllegalState);
  p.StreamBeginCapture(s);
  int code = 0;
  std::thread([&] { code = CodeOf([&] { p.StreamEndCapture(s); }); }).join();
  CHECK(code == gpurt::kCaptureWrongThread);
  p.GraphDestroy(p.StreamEndCapture(s));
  p.GraphExecDestroy(exec);
  p.GraphDestroy(graph);
  p.Free(d);
  p.StreamDestroy(s);
}

TEST_CASE("gpu sim: device memory runs out at the configured size and rejects bad pointers") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard g(1, Sim());
  const size_t total = p.Properties(1).total_memory;
  void* big = p.Malloc(total / 2);
  CHECK(CodeOf([&] { p.Malloc(total / 2 + 4096); }) == gpurt::kOutOfMemory);
  p.Free(big);
  big = p.Malloc(total / 2 + 4096);  // the freed range is whole again
  p.Free(big);
  char* d = static_cast<char*>(p.Malloc(1024));
  gpurt::Stream s = p.StreamCreate();
  std::vector<char> h(2048);
  CHECK(CodeOf([&] { p.Free(d + 8); }) == gpurt::kInvalidValue);  // not an allocation's start
  CHECK(CodeOf([&] { p.MemcpyAsync(d, h.data(), 2048, gpurt::CopyKind::kHostToDevice, s); }) ==
        gpurt::kInvalidValue);  // past the allocation's end
  CHECK(CodeOf([&] { p.MemcpyAsync(h.data(), d, 16, gpurt::CopyKind::kHostToDevice, s); }) ==
        gpurt::kInvalidValue);  // the direction is wrong: device memory given as the host side
  p.Free(d);
  CHECK(CodeOf([&] { p.MemcpyAsync(h.data(), d, 16, gpurt::CopyKind::kDeviceToHost, s); }) ==
        gpurt::kInvalidValue);  // freed
  CHECK(CodeOf([&] { p.Free(d); }) == gpurt::kInvalidValue);  // freed twice
  p.StreamDestroy(s);
}

TEST_CASE("gpu sim: the host touching device memory faults, and freed memory is poisoned") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard g(0, Sim());
  float* d = static_cast<float*>(p.Malloc(4096));
  CHECK(gpusim::IsLiveDeviceRange(reinterpret_cast<uintptr_t>(d), 4096));
  CHECK_FALSE(gpusim::IsLiveDeviceRange(reinterpret_cast<uintptr_t>(d), 4097));
  CHECK(SignalOfChild([d] { std::printf("%f\n", static_cast<double>(*static_cast<volatile float*>(d))); }) == SIGSEGV);
  CHECK(SignalOfChild([d] { *static_cast<volatile float*>(d) = 1; }) == SIGSEGV);
  gpurt::Stream s = p.StreamCreate();
  p.MemsetAsync(d, 0, 4096, s);
  p.StreamSynchronize(s);
  CHECK(HostView<float>(d)[7] == 0.0f);
  p.Free(d);
  CHECK(std::isnan(HostView<float>(d)[7]));  // poison: every float a NaN
  CHECK_FALSE(gpusim::IsLiveDeviceRange(reinterpret_cast<uintptr_t>(d), 4));
  p.StreamDestroy(s);
}

TEST_CASE("gpu sim: a faulting kernel leaves the device's sticky error, as a real GPU does") {
  // In a child with a simulator of its own: the fault makes the device unusable for the process.
  pid_t pid = fork();
  if (pid == 0) {
    gpurt::Platform* p = gpurt::CreateSimulatedPlatform(1, size_t{16} << 20);
    LambdaCompilerScope scope;
    LambdaModules()["test:fault"] = [] {
      auto k = std::make_unique<LambdaKernel>(Nop, gpusim::KernelAttributes{});
      k->fault_code = gpurt::kMisalignedAddress;
      return k;
    };
    gpurt::Stream s = p->StreamCreate();
    gpurt::Function f = p->ModuleGetFunction(p->ModuleLoad({"test:fault", ""}), "k");
    p->LaunchKernel(f, {1}, {32}, 0, s, nullptr);  // no parameter sizes: the launch waits for the kernel
    int sync = 0, later = 0;
    try {
      p->StreamSynchronize(s);
    } catch (const gpurt::GpuError& e) {
      sync = e.code();
    }
    try {
      p->Malloc(64);
    } catch (const gpurt::GpuError& e) {
      later = e.code();
    }
    _exit(sync == gpurt::kMisalignedAddress && later == gpurt::kMisalignedAddress ? 0 : 1);
  }
  int status = -1;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("gpu sim: modules need the emulator and name their kernels") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard g(0, Sim());
  {
    gpusim::ModuleCompiler prev = gpusim::GetModuleCompiler();
    gpusim::SetModuleCompiler(nullptr);
    CHECK(CodeOf([&] { p.ModuleLoad({"test:nop", ""}); }) == gpurt::kNotSupported);
    gpusim::SetModuleCompiler(prev);
  }
  LambdaCompilerScope scope;
  CHECK(CodeOf([&] { p.ModuleLoad({"", ".version 8.0"}); }) == gpurt::kInvalidImage);  // PTX only
  LoadLambda("test:named", Nop);
  gpurt::Module m = p.ModuleLoad({"test:named", ""});
  CHECK(CodeOf([&] { p.ModuleGetFunction(m, "missing"); }) == gpurt::kNotFound);
  p.ModuleUnload(m);
}

TEST_CASE("gpu sim: copies between devices, pageable and pinned, with and without peer access") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard g(0, Sim());
  const size_t n = 1 << 16;
  std::vector<uint8_t> src(n), back(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 7);
  void* a = p.Malloc(n);
  gpurt::Stream s = p.StreamCreate();
  p.MemcpyAsync(a, src.data(), n, gpurt::CopyKind::kHostToDevice, s);
  std::fill(src.begin(), src.end(), 0);  // pageable: the bytes were taken before the call returned
  p.SetDevice(1);
  void* b = p.Malloc(n);
  p.SetDevice(0);
  CHECK(CodeOf([&] { p.MemcpyPeerAsync(b, 0, a, 1, n, s); }) == gpurt::kInvalidValue);  // devices swapped
  p.MemcpyPeerAsync(b, 1, a, 0, n, s);
  auto* pinned = static_cast<uint8_t*>(p.HostAllocPinned(n));
  CHECK(p.IsPinnedHost(pinned + 5));
  CHECK_FALSE(p.IsPinnedHost(back.data()));
  p.MemcpyAsync(pinned, b, n, gpurt::CopyKind::kDeviceToHost, s);  // pinned: asynchronous
  p.StreamSynchronize(s);
  for (size_t i = 0; i < n; ++i) REQUIRE(pinned[i] == static_cast<uint8_t>(i * 7));
  CHECK(p.CanAccessPeer(0, 1));
  p.EnablePeerAccess(1);
  p.EnablePeerAccess(1);  // idempotent
  p.MemsetAsync(a, 3, n, s);
  p.MemcpyAsync(b, a, n, gpurt::CopyKind::kDeviceToDevice, s);
  p.MemcpyAsync(back.data(), b, n, gpurt::CopyKind::kDeviceToHost, s);
  CHECK(back[n - 1] == 3);
  p.HostFreePinned(pinned);
  p.Free(a);
  p.Free(b);
  p.StreamDestroy(s);
}

TEST_CASE("gpu sim: library handles are one per device and library, bound to the stream they run on") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard g(0, Sim());
  gpurt::Stream a = p.StreamCreate(), b = p.StreamCreate();
  void* h = p.LibraryHandle(gpurt::Library::kBlasLt, a);
  CHECK(h != nullptr);
  CHECK(p.LibraryHandle(gpurt::Library::kBlasLt, b) == h);  // rebound to b, as cublasSetStream does
  CHECK(p.LibraryHandle(gpurt::Library::kDnn, a) != h);
  p.SetDevice(1);
  gpurt::Stream c = p.StreamCreate();
  CHECK(p.LibraryHandle(gpurt::Library::kBlasLt, c) != h);
  p.StreamDestroy(c);
  p.SetDevice(0);
  p.StreamDestroy(a);
  p.StreamDestroy(b);
}
