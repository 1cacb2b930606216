// The executor of compiled plans (DESIGN.md section 10): runs a plan's steps in order on
// pre-planned buffers, or its lanes concurrently through a Lanes implementation (lanes.h), with
// per-thread arenas for the intermediates. It knows no graphs: a step is a launch callback over
// the views of the values it reads and writes, which codegen/ binds when it builds the plan.
//
// A plan has one memory layout for running its steps one after another and, when its lanes may
// run concurrently, a second one in which each lane reuses only the blocks it freed itself. The
// first calls of such a plan alternate serial and concurrent runs and are timed; then the faster
// way stays (whether lanes pay depends on how many threads each kernel keeps busy already).
//
// Not here: deciding steps, lanes or offsets (passes/), binding kernels (codegen/).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <span>
#include <utility>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/runtime/lanes.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::exec {

/// Where a value lives while a plan runs: the call's input or output `index`, or `index` bytes
/// into the arena.
struct Place {
  enum Kind : uint8_t { kNone, kInput, kOutput, kArena } kind = kNone;
  int64_t index = 0;
};

/// A memory layout: a place per value and the arena's size.
struct Layout {
  std::vector<Place> places;
  size_t arena_bytes = 0;
};

/// The lane of every step and the waits between lanes (from stream assignment).
struct LaneSchedule {
  int num_lanes = 1;
  std::vector<int> lane;               ///< per step
  std::vector<std::vector<int>> waits; ///< per step: the latest step of each other lane it needs
  std::vector<std::vector<int>> lists; ///< per lane: its steps in order
};

/// What every step of one call shares: the device, and the random generator's seed and the
/// counter offset of the call (a step adds its own offset).
struct CallInfo {
  Device device;
  uint64_t seed = 0, offset = 0;
  /// Set while a GPU plan is captured into a CUDA graph: the device memory its random steps read
  /// the seed and base offset from (KernelArgs::random_state).
  const uint64_t* random_state = nullptr;
};

/// What a step's launch sees: views of the values it reads and writes (in the step's order), and
/// the lane it runs on (0 when the steps run one after another).
struct StepArgs {
  std::span<const TensorView> in, out;
  const CallInfo& call;
  int lane = 0;
};

struct Step {
  std::vector<int> in, out;  ///< value ids
  std::function<void(const StepArgs&)> launch;
  std::string name;  ///< the op it runs, for the profiler ("fused add" for a fused group)
};

/// Whether a plan's lanes run concurrently: the first calls time both ways, then the faster stays.
struct Trial {
  static constexpr int kRounds = 4;
  std::atomic<int> calls{0}, decided{-1};  ///< decided: 1 concurrent, 0 serial, -1 not yet
  std::atomic<int64_t> serial_ns{0}, concurrent_ns{0};
};

/// A GPU plan's captured CUDA graphs, keyed by the addresses its steps see (executor.cc).
struct GraphCache;

/// Counters of the CUDA graphs of every GPU plan in the process (tests, reports).
struct GraphCounters {
  std::atomic<int64_t> captures{0}, replays{0}, plain_runs{0}, refused{0};
};
GraphCounters& CudaGraphCounters();
/// Calls of compiled plans on any device that no other plan made (a call_graph step inside a
/// plan is part of its caller's call), process-wide: kiln.gpu_step_stats counts the engine's tasks
/// that were not one of these.
std::atomic<int64_t>& TopLevelPlanCalls();
/// Whether GPU plans may be captured into CUDA graphs: KILN_CUDA_GRAPHS (default 1), changeable
/// at run time (benchmarks compare both ways in one process).
std::atomic<bool>& CudaGraphsEnabled();

struct Plan {
  struct Value {
    DType dtype = DType::kFloat32;
    Shape shape;
  };
  std::vector<Value> values;  ///< by value id
  std::vector<Step> steps;    ///< in an order that respects every dependency
  Layout serial;              ///< for running the steps one after another
  /// With `concurrent`: the lanes, and the layout where each lane reuses only its own blocks.
  bool concurrent = false;
  LaneSchedule lanes;
  Layout per_lane;
  /// Outputs whose value lives elsewhere (an input, an output listed twice): (value, output
  /// index), copied at the end of a call.
  std::vector<std::pair<int, int>> copy_out;
  mutable Trial trial;
  /// GPU plans: the plan's name in messages, and why it is never captured into a CUDA graph
  /// ("" when it may be: its kernels' arguments are the same on every call, no random draws).
  std::string name = "graph";
  std::string no_capture;
  /// GPU plans whose random steps read their seed and offset from device memory when captured
  /// (KernelArgs::random_state): the generator counter space one call draws (0: no random step).
  uint64_t random_draws = 0;
  mutable std::mutex graphs_mu;
  mutable std::shared_ptr<GraphCache> graphs;  ///< created by the first GPU run
  /// GPU plans whose steps run in order on one stream: the bytes of scratch (library workspaces)
  /// their steps wanted at once, measured on the first call; later calls place that region at the
  /// end of the arena (StepScratchRegion), so a captured graph allocates nothing.
  mutable std::atomic<size_t> scratch_bytes{0};
};

/// The GPU kernels a captured plan's random state needs (bound with the creation kernels,
/// codegen/gpu_kernels_creation.cc; null without them): `set` writes the seed and the call's base
/// offset into `state` (16 bytes of device memory), `advance` moves the base on by `draws`.
struct RandomStateKernels {
  void (*set)(const Device& d, uint64_t* state, uint64_t seed, uint64_t offset) = nullptr;
  void (*advance)(const Device& d, uint64_t* state, uint64_t draws) = nullptr;
};
RandomStateKernels& GpuRandomStateKernels();

/// Runs `p` on the call's inputs and outputs. Steps raise what their launch raises.
/// On a GPU (the call's device) the steps launch on the calling worker's stream, or, for a plan
/// whose lanes may run concurrently and that is not replayed as a CUDA graph, on the worker's
/// streams (GpuLanes: one per lane, ordered by events). Unless
/// KILN_CUDA_GRAPHS=0 or p.no_capture says why not, the second call with the same addresses
/// captures the steps into a CUDA graph and later calls with those addresses replay it (one
/// launch); a plan keeps a few graphs (the least recently used is dropped). When capturing is
/// not possible (a step synchronizes or allocates, or the addresses change on every call) the
/// plan goes back to plain launches, and the reason is printed once. Steps take their scratch
/// memory (cuDNN's workspaces) from the plan's region of the arena (Plan::scratch_bytes), except
/// when they run on lanes (streams of their own: the device's cache then).
void Run(const Plan& p, std::span<const TensorView> in, std::span<const TensorView> out, const CallInfo& call,
         Lanes& lanes = CpuLanes());

/// Runs run(step) for every step of `s` through `lanes`: the steps of each lane in order, each
/// after the steps it waits for; in plain order on the calling thread when `lanes` is busy or has
/// fewer lanes than `s`. Rethrows the first error (later steps may be skipped).
void RunLanes(const LaneSchedule& s, const std::function<void(int)>& run, Lanes& lanes = CpuLanes());

/// Tests: plans whose lanes may run concurrently always do (no timing trial).
bool& AlwaysConcurrent();

}  // namespace kiln::exec
