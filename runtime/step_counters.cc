// The step counters (see kiln/runtime/step_counters.h): the platform's, the executor's, the
// engine's and the GPU caching allocators' counts in one place.
#include "kiln/runtime/step_counters.h"

#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/executor.h"
#include "kiln/runtime/gpu.h"

namespace kiln {

#define KILN_STEP_COUNTERS(X)                                                                                \
  X(kernel_launches) X(library_calls) X(graph_replays) X(graph_captures) X(plain_plan_runs) X(host_syncs)    \
  X(allocations) X(device_mallocs) X(h2d_bytes) X(d2h_bytes) X(d2d_bytes) X(copies) X(memsets) X(tasks)      \
  X(plan_calls)

std::vector<std::pair<const char*, int64_t>> StepCounters::Named() const {
  std::vector<std::pair<const char*, int64_t>> v;
#define KILN_NAMED(f) v.emplace_back(#f, f);
  KILN_STEP_COUNTERS(KILN_NAMED)
#undef KILN_NAMED
  v.emplace_back("tasks_outside_plans", tasks - plan_calls);
  return v;
}

StepCounters StepCounters::operator-(const StepCounters& then) const {
  StepCounters d;
#define KILN_DIFF(f) d.f = f - then.f;
  KILN_STEP_COUNTERS(KILN_DIFF)
#undef KILN_DIFF
  return d;
}

StepCounters ReadStepCounters() {
  engine::Engine& e = engine::Engine::Get();
  e.WaitForAll();
  const gpurt::PlatformCounters& p = gpurt::Counters();
  const exec::GraphCounters& g = exec::CudaGraphCounters();
  StepCounters c;
  c.kernel_launches = p.kernel_launches.load(), c.library_calls = p.library_calls.load();
  c.graph_replays = p.graph_launches.load(), c.graph_captures = g.captures.load();
  c.plain_plan_runs = g.plain_runs.load();
  c.host_syncs = p.host_syncs.load(), c.device_mallocs = p.device_mallocs.load();
  for (int i = 0; i < cuda::DeviceCount(); ++i) c.allocations += GetAllocator(gpu(i)).Stats().num_allocs;
  c.h2d_bytes = p.h2d_bytes.load(), c.d2h_bytes = p.d2h_bytes.load(), c.d2d_bytes = p.d2d_bytes.load();
  c.copies = p.copies.load(), c.memsets = p.memsets.load();
  c.tasks = e.Stats().pushed, c.plan_calls = exec::TopLevelPlanCalls().load();
  return c;
}

}  // namespace kiln
