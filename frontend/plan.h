// Compiled plans (internal to frontend/): a graph made ready to run, with its kernels, fused groups
// and memory placed, and the running of it. The machinery around it (graph ids, backward and
// training variants, tracing) is cached_graph.cc's; this file does not know where graphs come
// from or when they run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/ir/graph.h"
#include "kiln/passes/freeze_fold.h"
#if KILN_WITH_CODEGEN
#include "kiln/codegen/elementwise.h"
#endif

namespace kiln {

/// Where a value lives while a plan runs.
struct Slot {
  enum Kind : uint8_t { kNone, kInput, kOutput, kArena } kind = kNone;
  int64_t index = 0;  ///< input or output index, or byte offset in the arena
};

/// A graph ready to run: its nodes in order with their kernels, and a place for every value.
struct Plan {
  std::unique_ptr<ir::Graph> graph;
  Device device;
  std::vector<const KernelBinding*> kernels;   ///< per node
  std::vector<uint64_t> random_offsets;        ///< per node: counter offset from the call's base
  std::vector<Slot> slots;                     ///< per value id
  std::vector<int> out_of_place;               ///< outputs whose value lives elsewhere: copied at the end
  size_t arena_bytes = 0;
  int64_t random_numel = 0;
  /// Fused groups: at the group's last node, one generated kernel over the group's inputs; the
  /// other members are skipped (their values never exist).
  struct Fused {
#if KILN_WITH_CODEGEN
    std::shared_ptr<codegen::CompiledKernel> kernel;
#endif
    std::vector<const ir::Value*> inputs;
  };
  std::vector<std::unique_ptr<Fused>> fused;   ///< per node: set at a group's root
  std::vector<bool> fused_member;              ///< per node: a non-root member of a group
  int num_fused_groups = 0, num_fused_nodes = 0;
  CompileReport::PlanReport report;            ///< what building it did
};

/// Fusion, kernel lookup and memory placement of `g` (no graph passes); `name` names the plan in
/// the report.
std::unique_ptr<Plan> MakePlan(std::unique_ptr<ir::Graph> g, Device device, std::string name);

/// The optimizing pipeline (passes/pass.h), then MakePlan; inputs and outputs keep their order
/// and types. With `freeze`, freeze_fold runs after the pipeline and may change the inputs (see
/// freeze_fold.h); `frozen` receives what it did. Both steps go into the plan's report.
std::unique_ptr<Plan> OptimizeAndPlan(std::unique_ptr<ir::Graph> g, Device device, std::string name,
                                      const passes::FreezeOptions* freeze = nullptr,
                                      passes::FreezeResult* frozen = nullptr);

/// Runs `p` on the call's inputs and outputs (a call_graph kernel's arguments).
void RunPlan(const Plan& p, const KernelArgs& a);

}  // namespace kiln
