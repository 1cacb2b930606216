// What decides a training or inference step's speed on a GPU, counted so that a test can assert it
// without one (the simulator counts the same calls as CUDA): kernel launches, library calls, graph
// replays and captures, host synchronizations, allocations, copies, and the engine's tasks inside
// and outside compiled plans. Read before and after a step; the difference is the step's
// (kiln.gpu_step_stats, the GPU benchmarks).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace kiln {

struct StepCounters {
  int64_t kernel_launches = 0, library_calls = 0, graph_replays = 0, graph_captures = 0, plain_plan_runs = 0;
  int64_t host_syncs = 0, allocations = 0, device_mallocs = 0;
  int64_t h2d_bytes = 0, d2h_bytes = 0, d2d_bytes = 0, copies = 0, memsets = 0;
  int64_t tasks = 0, plan_calls = 0;

  /// (name, value) of every counter, then tasks_outside_plans (tasks - plan_calls).
  std::vector<std::pair<const char*, int64_t>> Named() const;
  StepCounters operator-(const StepCounters& then) const;
};

/// The process-wide counters now, once the work queued so far has run (waits for the engine).
StepCounters ReadStepCounters();

}  // namespace kiln
