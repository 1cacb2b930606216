// The executor of compiled plans (see kiln/runtime/executor.h): per-thread arenas, the views of a
// step's values, serial and concurrent runs, and the timing trial between them.
#include "kiln/runtime/executor.h"

#include <chrono>
#include <cstdlib>
#include <memory>

#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/error.h"

namespace kiln::exec {

namespace {

using Clock = std::chrono::steady_clock;

// Per-thread arenas, grown as needed and kept between calls; one per nesting depth, since a
// plan may run another (a call_graph step inside a compiled graph) while its own values live.
// A GPU device's arena is device memory; its engine worker runs every call on one stream, so a
// call's kernels are ordered after the previous call's and the arena is reused without waiting
// (only growing it waits for the stream, before the old block is freed).
thread_local int tls_depth = 0;
uint8_t* Arena(size_t bytes, const Device& device) {
  struct Buf {
    uint8_t* p = nullptr;
    size_t n = 0;
    Device device;
    void Release() {
      if (!p) return;
      if (device.is_cpu()) {
        std::free(p);
      } else {
        cuda::SynchronizeWorkerStream();  // kernels of earlier calls may still read it
        cuda::DeviceFree(device, p);
      }
      p = nullptr, n = 0;
    }
    ~Buf() {
      if (device.is_cpu()) std::free(p);  // a GPU arena lives as long as its worker thread's process
    }
  };
  thread_local std::vector<std::unique_ptr<Buf>> cpu_bufs, gpu_bufs;  // a worker thread serves one device
  auto& bufs = device.is_cpu() ? cpu_bufs : gpu_bufs;
  while (static_cast<int>(bufs.size()) <= tls_depth) bufs.push_back(std::make_unique<Buf>());
  Buf& buf = *bufs[static_cast<size_t>(tls_depth)];
  if (buf.n < bytes || !(buf.device == device)) {
    buf.Release();
    buf.device = device;
    size_t n = (bytes + 4095) / 4096 * 4096;
    buf.p = static_cast<uint8_t*>(device.is_cpu() ? std::aligned_alloc(64, n) : cuda::DeviceMalloc(device, n));
    if (!buf.p)
      KILN_THROW(MemoryError) << "hybridize: cannot allocate an arena of " << bytes << " bytes on " << device.str();
    buf.n = n;
  }
  return buf.p;
}

// The scratch vectors of the thread running steps.
struct Scratch {
  std::vector<TensorView> in, out;
};

}  // namespace

bool& AlwaysConcurrent() {
  static bool always = false;
  return always;
}

void RunLanes(const LaneSchedule& s, const std::function<void(int)>& run, Lanes& lanes) {
  const int n = static_cast<int>(s.lane.size());
  if (s.num_lanes <= 1 || !lanes.Begin(s.num_lanes, n, run)) {
    for (int i = 0; i < n; ++i) run(i);
    return;
  }
  // Events only for the steps another lane waits for.
  std::vector<uint8_t> recorded(static_cast<size_t>(n), 0);
  for (const std::vector<int>& w : s.waits)
    for (int d : w) recorded[static_cast<size_t>(d)] = 1;
  for (int i = 0; i < n; ++i) {
    const int lane = s.lane[static_cast<size_t>(i)];
    for (int w : s.waits[static_cast<size_t>(i)]) lanes.Wait(lane, w);
    lanes.Launch(lane, i);
    if (recorded[static_cast<size_t>(i)]) lanes.Record(lane, i);
  }
  lanes.Finish();
}

void Run(const Plan& p, std::span<const TensorView> in, std::span<const TensorView> out, const CallInfo& call,
         Lanes& lanes) {
  // Concurrent lanes, or the timing trial's turn for them: the layout kept per lane.
  bool use_lanes = false;
  int trial_call = -1;
  if (p.concurrent && call.device.is_cpu()) {  // GPU plans run their steps in order on the worker's stream
    int decided = p.trial.decided.load(std::memory_order_acquire);
    if (AlwaysConcurrent()) use_lanes = true;
    else if (decided >= 0) use_lanes = decided == 1;
    else use_lanes = (trial_call = p.trial.calls.fetch_add(1)) % 2 == 1;
  }
  const Layout& layout = use_lanes ? p.per_lane : p.serial;
  uint8_t* arena = layout.arena_bytes ? Arena(layout.arena_bytes, call.device) : nullptr;
  struct Depth {  // nested plans take the next arena
    Depth() { ++tls_depth; }
    ~Depth() { --tls_depth; }
  } depth;
  auto view = [&](int v) {
    const Place& s = layout.places[static_cast<size_t>(v)];
    switch (s.kind) {
      case Place::kInput: return in[static_cast<size_t>(s.index)];
      case Place::kOutput: return out[static_cast<size_t>(s.index)];
      default: {
        const Plan::Value& val = p.values[static_cast<size_t>(v)];
        TensorView t;
        t.data = arena + s.index;
        t.dtype = val.dtype;
        t.shape = val.shape;
        t.strides = val.shape.ContiguousStrides();
        return t;
      }
    }
  };
  auto step = [&](int k, Scratch& sc, int lane) {
    const Step& st = p.steps[static_cast<size_t>(k)];
    sc.in.clear(), sc.out.clear();
    for (int v : st.in) sc.in.push_back(view(v));
    for (int v : st.out) sc.out.push_back(view(v));
    st.launch(StepArgs{sc.in, sc.out, call, lane});
  };
  auto serial = [&] {
    Scratch sc;  // kept across steps: one allocation per call, not per step
    for (int k = 0; k < static_cast<int>(p.steps.size()); ++k) step(k, sc, 0);
  };
  auto concurrent = [&] {
    RunLanes(p.lanes, [&](int k) {
      Scratch sc;  // per step: steps are big when lanes run concurrently, and may nest plans
      step(k, sc, p.lanes.lane[static_cast<size_t>(k)]);
    }, lanes);
  };
  auto copy_out = [&] {
    for (auto [v, k] : p.copy_out) {
      const TensorView src = view(v), &dst = out[static_cast<size_t>(k)];
      if (call.device.is_cpu()) {
        host::CopyConvert(src, dst);
        continue;
      }
      KILN_CHECK(src.dtype == dst.dtype && src.is_contiguous() && dst.is_contiguous())
          << "a GPU plan's output copy converts nothing";
      cuda::CopyAsync(dst.data, src.data, static_cast<size_t>(dst.shape.numel()) * DTypeSize(dst.dtype),
                      cuda::CopyKind::kDeviceToDevice);
    }
  };
  if (trial_call < 0) return (use_lanes ? concurrent() : serial()), copy_out();
  Trial& t = p.trial;
  const Clock::time_point t0 = Clock::now();
  use_lanes ? concurrent() : serial();
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  if (trial_call >= 2) (use_lanes ? t.concurrent_ns : t.serial_ns).fetch_add(ns);  // the first two warm up
  if (trial_call == 2 + 2 * Trial::kRounds - 1)
    t.decided.store(t.concurrent_ns.load() < 0.95 * static_cast<double>(t.serial_ns.load()) ? 1 : 0,
                    std::memory_order_release);
  copy_out();
}

}  // namespace kiln::exec
