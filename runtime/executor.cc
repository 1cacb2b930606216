// The executor of compiled plans (see kiln/runtime/executor.h): per-thread arenas, the views of a
// step's values, serial and concurrent runs, and the timing trial between them.
#include "kiln/runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/math_mode.h"
#include "kiln/runtime/profiler.h"

namespace kiln::exec {

namespace {

using Clock = std::chrono::steady_clock;

// Per-thread arenas, grown as needed and kept between calls; one per nesting depth, since a
// plan may run another (a call_graph step inside a compiled graph) while its own values live.
// A GPU device's arena is device memory; its engine worker runs every call on one stream, so a
// call's kernels are ordered after the previous call's and the arena is reused without waiting
// (only growing it waits for the stream, before the old block is freed).
thread_local int tls_depth = 0;

// Memory outside the pools (an arena, a CUDA graph's buffer): a refusal empties the device's pool
// and tries once more, then is a MemoryError naming the device and the size, never a bare
// std::bad_alloc or a null pointer.
void* RawAlloc(const Device& device, size_t n, const char* what) {
  CheckAllocationSize(n, device.str());
  auto once = [&]() -> void* {
    if (device.is_cpu()) return std::aligned_alloc(64, (n + 63) / 64 * 64);
    try {
      return cuda::DeviceMalloc(device, n);
    } catch (const MemoryError&) {
      return nullptr;
    }
  };
  void* p = once();
  if (!p) {
    GetAllocator(device).EmptyCache();
    p = once();
  }
  if (!p)
    KILN_THROW(MemoryError) << "out of memory on " << device.str() << " allocating " << n << " bytes for " << what
                            << " after emptying the cache; free tensors or use smaller batches";
  return p;
}

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
    CheckAllocationSize(bytes, device.str());
    size_t n = (bytes + 4095) / 4096 * 4096;
    buf.p = static_cast<uint8_t*>(RawAlloc(device, n, "the arena of a compiled graph"));
    buf.n = n;
  }
  return buf.p;
}

// ---- CUDA graphs of GPU plans -------------------------------------------------------------------

constexpr size_t kGraphsPerPlan = 4;
constexpr int64_t kCapturesWithoutReplay = 16;  // then the addresses are taken to change every call

bool CudaGraphsOn() { return CudaGraphsEnabled().load(std::memory_order_relaxed); }

}  // namespace

std::atomic<bool>& CudaGraphsEnabled() {
  static std::atomic<bool> on{env::Get("KILN_CUDA_GRAPHS") != "0"};
  return on;
}

struct GraphCache {
  struct Entry {
    std::vector<const void*> key;  // the arena, then the addresses of the values not staged
    void* exec = nullptr;
    // A plan with random steps: the device memory its kernels read the seed and base offset
    // from, and what it holds once the replays queued so far have run.
    uint64_t* random_state = nullptr;
    bool state_known = false;
    uint64_t seed = 0, next_offset = 0;
  };
  Device device;
  std::vector<Entry> entries;  // the most recently used last
  int64_t calls = 0, captures = 0, replays = 0;
  std::string off;  // why this plan stopped capturing; "" while it may
  // The inputs' then the outputs' addresses of the first call; then, from the second call on,
  // which of them go through a buffer of the graph's own (their address has differed from the
  // first call's: an activation, a fresh output; weights keep theirs and are read in place).
  std::vector<const void*> first;
  std::vector<void*> staged;  // per input then output: the graph's buffer, or null (read in place)
  std::vector<void*> random_states;  // every entry's, kept until the cache goes (replays may read them)
  bool planned = false;
  // The math modes (MathBits) the plan has run plainly under: a mode's first call measures its
  // convolution algorithms outside a capture; graphs are kept per mode (part of an entry's key).
  std::vector<const void*> math_seen;
  ~GraphCache() {
    try {
      for (Entry& e : entries) cuda::DestroyGraph(e.exec);
      bool any = !random_states.empty();
      for (void* b : random_states) staged.push_back(b);
      for (void* b : staged) any |= b != nullptr;
      if (any) cuda::SynchronizeDevice(device);  // replays may still read them
      for (void* b : staged)
        if (b) cuda::DeviceFree(device, b);
    } catch (const std::exception&) {  // at exit, the device may be gone: nothing to keep
    }
  }
};

GraphCounters& CudaGraphCounters() {
  static GraphCounters c;
  return c;
}

std::atomic<int64_t>& TopLevelPlanCalls() {
  static std::atomic<int64_t> n{0};
  return n;
}

namespace {

// Stops capturing `p` for `why`, printed once per plan.
void StopCapturing(const Plan& p, GraphCache& gc, const std::string& why) {
  gc.off = why;
  for (GraphCache::Entry& e : gc.entries) cuda::DestroyGraph(e.exec);
  gc.entries.clear();
  bool any = false;
  for (void* b : gc.staged) any |= b != nullptr;
  if (any) {  // never used again: the plan runs plainly from now on
    cuda::SynchronizeWorkerStream();  // replays may still read them
    for (void*& b : gc.staged)
      if (b) cuda::DeviceFree(gc.device, b), b = nullptr;
  }
  ++CudaGraphCounters().refused;
  std::fprintf(stderr, "kiln: CUDA graphs: '%s' launches its kernels one by one from now on: %s\n", p.name.c_str(),
               why.c_str());
}

size_t Bytes(const TensorView& t) { return static_cast<size_t>(t.shape.numel()) * DTypeSize(t.dtype); }

// Runs a call's steps and output copies on (in, out); random steps read the seed and base offset
// from `random_state` when it is set (a capture).
using RunFn = std::function<void(std::span<const TensorView>, std::span<const TensorView>, const uint64_t* random_state)>;

// The math mode the plan's kernels ask the libraries for (kiln/runtime/math_mode.h), as a key part:
// a graph replays the math it was captured with.
const void* MathBits() {
  const uintptr_t bits = (gpurt::Tf32Allowed(gpurt::MathOp::kConv) ? 1u : 0u) |
                         (gpurt::Tf32Allowed(gpurt::MathOp::kMatmul) ? 2u : 0u);
  return reinterpret_cast<const void*>(bits);
}

// Runs the call `run(in, out)` (the steps and the output copies) of GPU plan `p` as a CUDA graph
// when it can: replays the graph captured for the call's addresses, or captures one (the second
// call onwards), else runs it plainly.
void RunOnGpu(const Plan& p, const CallInfo& call, const void* arena, std::span<const TensorView> in,
              std::span<const TensorView> out, const RunFn& run) {
  const Device& device = call.device;
  GraphCounters& counters = CudaGraphCounters();
  auto plain = [&] {
    ++counters.plain_runs;
    run(in, out, nullptr);
  };
  if (!CudaGraphsOn() || !p.no_capture.empty()) return plain();
  std::lock_guard<std::mutex> lock(p.graphs_mu);  // a plan runs on one worker at a time anyway
  if (!p.graphs) p.graphs = std::make_shared<GraphCache>();
  GraphCache& gc = *p.graphs;
  gc.device = device;
  const size_t n = in.size() + out.size();
  auto at = [&](size_t i) -> const TensorView& { return i < in.size() ? in[i] : out[i - in.size()]; };
  if (!gc.off.empty()) return plain();
  const void* math = MathBits();
  if (gc.calls++ == 0) {  // the first call loads the kernels and sizes the workspaces
    for (size_t i = 0; i < n; ++i) gc.first.push_back(at(i).data);
    gc.math_seen.push_back(math);
    return plain();
  }
  if (std::find(gc.math_seen.begin(), gc.math_seen.end(), math) == gc.math_seen.end()) {
    gc.math_seen.push_back(math);  // a new math mode: its convolution algorithms are measured first
    return plain();
  }
  // A value whose address differs from the first call's goes through a buffer of the graph's own
  // (no capture is running: allocating is allowed). Most are staged at the second call (fresh
  // inputs and outputs); one that kept its address then and moves later (an output that the
  // allocator handed back twice, then others) is staged when it first moves, and the graphs read
  // it in place are dropped: otherwise every new address would cost a capture, and the plan
  // would stop capturing although its inputs never changed.
  if (!gc.planned) gc.staged.assign(n, nullptr);
  bool moved = false;
  for (size_t i = 0; i < n; ++i)
    if (!gc.staged[i] && at(i).data != gc.first[i] && Bytes(at(i)) > 0) {
      try {
        gc.staged[i] = RawAlloc(device, Bytes(at(i)), "a CUDA graph's buffer");
      } catch (const MemoryError& e) {
        StopCapturing(p, gc, std::string("no device memory for its graph's buffers: ") + e.what());
        return plain();
      }
      moved = gc.planned;
    }
  gc.planned = true;
  if (moved) {
    for (GraphCache::Entry& e : gc.entries) cuda::DestroyGraph(e.exec);  // in flight: freed when done
    gc.entries.clear();
  }
  std::vector<const void*> key = {arena, math};
  std::vector<TensorView> views(n);
  for (size_t i = 0; i < n; ++i) {
    views[i] = at(i);
    if (gc.staged[i]) views[i].data = gc.staged[i];
    else key.push_back(Bytes(at(i)) ? at(i).data : nullptr);  // an empty value's address is never read
  }
  // A graph's random steps draw at the seed and base offset in its state: written before a replay
  // unless the graph's previous replay left it there (its last kernel moves it on by the call's
  // draws, as the host's generator moved when nothing else drew in between).
  const RandomStateKernels& rs = GpuRandomStateKernels();
  auto set_state = [&](GraphCache::Entry& e) {
    if (!e.random_state || (e.state_known && e.seed == call.seed && e.next_offset == call.offset)) return;
    rs.set(device, e.random_state, call.seed, call.offset);
    e.state_known = true, e.seed = call.seed, e.next_offset = call.offset;
  };
  auto replay = [&](GraphCache::Entry& e) {
    set_state(e);
    e.state_known = false;  // until the graph is queued: a launch that fails leaves it unknown
    for (size_t i = 0; i < in.size(); ++i)
      if (gc.staged[i]) cuda::CopyAsync(gc.staged[i], in[i].data, Bytes(in[i]), cuda::CopyKind::kDeviceToDevice);
    cuda::LaunchGraph(e.exec);
    e.state_known = e.random_state != nullptr, e.next_offset += p.random_draws;
    for (size_t k = 0; k < out.size(); ++k)
      if (void* b = gc.staged[in.size() + k]) cuda::CopyAsync(out[k].data, b, Bytes(out[k]), cuda::CopyKind::kDeviceToDevice);
  };
  for (size_t i = 0; i < gc.entries.size(); ++i) {
    if (gc.entries[i].key != key) continue;
    std::rotate(gc.entries.begin() + static_cast<std::ptrdiff_t>(i),
                gc.entries.begin() + static_cast<std::ptrdiff_t>(i) + 1, gc.entries.end());
    replay(gc.entries.back());
    ++gc.replays, ++counters.replays;
    return;
  }
  if (gc.captures >= kCapturesWithoutReplay && gc.replays < gc.captures) {
    StopCapturing(p, gc, "its memory arena moved on almost every call (a graph replays the addresses it was "
                         "captured with)");
    return plain();
  }
  void* exec = nullptr;
  GraphCache::Entry entry{key, nullptr};
  if (p.random_draws > 0) {  // allocated before capturing (a capture may not allocate)
    try {
      entry.random_state = static_cast<uint64_t*>(RawAlloc(device, 2 * sizeof(uint64_t), "a CUDA graph's random state"));
    } catch (const MemoryError& e) {
      StopCapturing(p, gc, std::string("no device memory for its graph's random state: ") + e.what());
      return plain();
    }
    gc.random_states.push_back(entry.random_state);
    set_state(entry);
  }
  const std::span<const TensorView> gin(views.data(), in.size()), gout(views.data() + in.size(), out.size());
  const int64_t frees = GpuFreesDuringCapture();
  cuda::BeginCapture();
  try {
    run(gin, gout, entry.random_state);
    if (entry.random_state) rs.advance(device, entry.random_state, p.random_draws);
    if (GpuFreesDuringCapture() != frees)
      KILN_THROW(DeviceError) << "a step gave device memory back during the capture; the graph would replay "
                                 "memory the cache may hand to other work";
    exec = cuda::EndCapture();
  } catch (const std::exception& e) {
    std::string why = e.what();
    // The stream stays in capture mode, active or invalidated (where cudaStreamIsCapturing says
    // not active), until the capture is ended: end it, or every later call on it fails with 901.
    try {
      if (void* g = cuda::EndCapture()) cuda::DestroyGraph(g);
    } catch (const std::exception&) {  // invalidated: nothing to keep
    }
    StopCapturing(p, gc, "capturing it failed: " + why);
    return plain();  // nothing ran while capturing
  }
  if (gc.entries.size() == kGraphsPerPlan) {
    cuda::DestroyGraph(gc.entries.front().exec);
    gc.entries.erase(gc.entries.begin());
  }
  entry.exec = exec;
  gc.entries.push_back(std::move(entry));
  ++gc.captures, ++counters.captures;
  replay(gc.entries.back());  // capturing recorded the work without running it
}

// The scratch vectors of the thread running steps.
struct Scratch {
  std::vector<TensorView> in, out;
};

}  // namespace

RandomStateKernels& GpuRandomStateKernels() {
  static RandomStateKernels kernels;
  return kernels;
}

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
  if (p.concurrent && !call.device.is_cpu()) {
    // A GPU plan's lanes are streams when its calls launch kernel by kernel; a captured CUDA
    // graph holds the steps in order on the worker's stream (one launch per call).
    use_lanes = !CudaGraphsOn() || !p.no_capture.empty();
  } else if (p.concurrent) {
    int decided = p.trial.decided.load(std::memory_order_acquire);
    if (AlwaysConcurrent()) use_lanes = true;
    else if (decided >= 0) use_lanes = decided == 1;
    else use_lanes = (trial_call = p.trial.calls.fetch_add(1)) % 2 == 1;
  }
  const Layout& layout = use_lanes ? p.per_lane : p.serial;
  if (tls_depth == 0) TopLevelPlanCalls().fetch_add(1, std::memory_order_relaxed);
  // A GPU plan run in order on one stream: its steps' scratch at the end of the arena.
  const bool gpu_serial = !call.device.is_cpu() && !use_lanes;
  const size_t values_bytes = (layout.arena_bytes + 255) / 256 * 256;
  const size_t scratch_bytes = gpu_serial ? p.scratch_bytes.load(std::memory_order_acquire) : 0;
  uint8_t* arena = values_bytes + scratch_bytes ? Arena(values_bytes + scratch_bytes, call.device) : nullptr;
  StepScratchRegion region;
  if (gpu_serial) region.base = arena + values_bytes, region.bytes = scratch_bytes;
  struct Depth {  // nested plans take the next arena
    Depth() { ++tls_depth; }
    ~Depth() { --tls_depth; }
  } depth;
  std::span<const TensorView> vin = in, vout = out;  // a CUDA graph's run reads its own buffers
  auto view = [&](int v) {
    const Place& s = layout.places[static_cast<size_t>(v)];
    switch (s.kind) {
      case Place::kInput: return vin[static_cast<size_t>(s.index)];
      case Place::kOutput: return vout[static_cast<size_t>(s.index)];
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
  // The profiler: the call is one event, its steps events inside it (on the lane of the thread
  // that runs them; on a GPU, the time to issue their work). One relaxed load when off.
  CallInfo step_call = call;  // with the device's random state while a CUDA graph is captured
  const bool prof = profiler::Enabled(profiler::kSymbolic);
  profiler::Scope call_event(profiler::kSymbolic, p.name, profiler::Args("steps", static_cast<double>(p.steps.size())));
  auto step = [&](int k, Scratch& sc, int lane) {
    const Step& st = p.steps[static_cast<size_t>(k)];
    sc.in.clear(), sc.out.clear();
    for (int v : st.in) sc.in.push_back(view(v));
    for (int v : st.out) sc.out.push_back(view(v));
    const int64_t t0 = prof ? profiler::Now() : 0;
    st.launch(StepArgs{sc.in, sc.out, step_call, lane});
    if (prof)
      profiler::Complete(profiler::kSymbolic, st.name.empty() ? std::string_view("step") : std::string_view(st.name),
                         t0, profiler::Now(), profiler::Args("step", k, "lane", lane));
  };
  auto serial = [&] {
    Scratch sc;  // kept across steps: one allocation per call, not per step
    for (int k = 0; k < static_cast<int>(p.steps.size()); ++k) step(k, sc, 0);
  };
  auto concurrent = [&] {
    RunLanes(p.lanes, [&](int k) {
      Depth inside;  // a lane's thread runs this plan's step: a plan it calls is nested, not a new call
      Scratch sc;  // per step: steps are big when lanes run concurrently, and may nest plans
      step(k, sc, p.lanes.lane[static_cast<size_t>(k)]);
    }, lanes);
  };
  auto copy_out = [&] {
    for (auto [v, k] : p.copy_out) {
      const TensorView src = view(v), &dst = vout[static_cast<size_t>(k)];
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
  if (!call.device.is_cpu()) {
    if (use_lanes) {  // independent branches on streams of their own, ordered by events
      StepScratchScope none(nullptr);  // steps of different streams: scratch from the device's cache
      ++CudaGraphCounters().plain_runs;
      RunLanes(p.lanes, [&](int k) {
        Scratch sc;
        step(k, sc, p.lanes.lane[static_cast<size_t>(k)]);
      }, GpuLanes());
      return copy_out();
    }
    StepScratchScope scratch(&region);
    RunOnGpu(p, call, arena, in, out, [&](std::span<const TensorView> i, std::span<const TensorView> o,
                                          const uint64_t* random_state) {
      vin = i, vout = o;
      step_call.random_state = random_state;
      serial(), copy_out();
      step_call.random_state = nullptr;
    });
    // The next call's region holds what the steps wanted (the first call measures it; a capture
    // only happens from the second call on).
    size_t had = p.scratch_bytes.load(std::memory_order_relaxed);
    while (region.peak > had && !p.scratch_bytes.compare_exchange_weak(had, region.peak)) {
    }
    return;
  }
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
