// Compiled plans (codegen/plan/, DESIGN.md section 10): a graph made ready to run, with its kernels,
// fused groups and memory placed, bound into steps that the executor (runtime/executor.h) runs.
// The decisions are made by passes/ (fusion.h, row_fusion.h, epilogue_fusion.h,
// stream_assignment.h, memory_planning.h); codegen/plan/ builds what they decided: fuse_rows.cc
// the row groups' kernels, fuse_epilogue.cc the epilogue calls, plan.cc the elementwise kernels,
// kernel lookup, layouts and the executor's steps. Built without LLVM too (then nothing fuses
// into generated kernels). The machinery around it (graph ids, backward and training variants,
// tracing) is frontend/cached_graph.cc's; this file does not know where graphs come from or when
// they run.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/codegen/plan_report.h"
#include "kiln/ir/graph.h"
#include "kiln/passes/freeze_fold.h"
#include "kiln/passes/fusion.h"
#include "kiln/passes/stream_assignment.h"
#include "kiln/runtime/executor.h"
#if KILN_WITH_CODEGEN
#include "kiln/codegen/elementwise.h"
#include "kiln/codegen/row.h"
#include "kiln/codegen/gpu_kernels.h"
#include "kiln/codegen/ptx.h"
#include "kiln/codegen/steps.h"
#endif

namespace kiln {

namespace host {
struct EpilogueCall;  // runtime/cpu/epilogue_call.h
}

/// Where a value lives while a plan runs (the executor's places).
using Slot = exec::Place;

/// A graph ready to run: its nodes in order with their kernels, and a place for every value.
struct Plan {
  std::unique_ptr<ir::Graph> graph;
  Device device;
  std::vector<const KernelBinding*> kernels;   ///< per node
  std::vector<uint64_t> random_offsets;        ///< per node: counter offset from the call's base
  std::vector<Slot> slots;                     ///< per value id
  std::vector<int> out_of_place;               ///< outputs whose value lives elsewhere: copied at the end
  size_t arena_bytes = 0;
  /// Stream assignment: the nodes that run (steps), in order, and their streams; the steps run
  /// concurrently, stream by stream, when `concurrent` (see passes/stream_assignment.h).
  std::vector<int> step_nodes;
  passes::StreamSchedule schedule;
  bool concurrent = false;  ///< streams worth trying concurrently (enough independent work)
  /// With `concurrent`: the memory layout for running the streams concurrently (each stream
  /// reuses only its own freed blocks); `slots` and `arena_bytes` are the serial layout.
  std::vector<Slot> stream_slots;
  size_t stream_arena_bytes = 0;
  /// What the executor runs (runtime/executor.h): the steps bound to their kernels, the layouts
  /// and the lanes, built last from everything above.
  exec::Plan exec;
  int64_t random_numel = 0;
  /// Fused groups: at the group's last node, one generated kernel over the group's inputs; the
  /// other members are skipped (their values never exist, unless a row group writes them).
  /// An epilogue group is one library call instead: a matmul/conv with its elementwise consumers.
  struct Fused {
    std::shared_ptr<const host::EpilogueCall> epilogue;  ///< set for an epilogue group
#if KILN_WITH_CODEGEN
    std::shared_ptr<codegen::CompiledKernel> kernel;  ///< an elementwise group
    std::shared_ptr<codegen::RowKernel> row_kernel;   ///< or a row group (a reduction and its neighbours)
    std::shared_ptr<const codegen::PtxKernel> gpu_kernel;  ///< an elementwise group on a GPU
#endif
    std::vector<int> members;  ///< node indices in order; the last is the group's root
    std::vector<const ir::Value*> inputs;
    /// Row groups: the members' values the kernel writes (read outside the group, or graph
    /// outputs), over `rows` rows of `len`. Elementwise groups write the root's output only.
    std::vector<const ir::Value*> outputs;
    int64_t rows = 0, len = 0;
  };
  std::vector<std::unique_ptr<Fused>> fused;   ///< per node: set at a group's root
  std::vector<bool> fused_member;              ///< per node: a non-root member of a group
  int num_fused_groups = 0, num_fused_nodes = 0;
  PlanReport report;            ///< what building it did
};

/// Fusion, kernel lookup and memory placement of `g` (no graph passes); `name` names the plan in
/// the report. `late_outputs` (output indices): computed in the arena and copied into the call's
/// output buffer after every step ran, so that buffer may be one of the call's inputs too (a call
/// that writes batch norm's running statistics in place).
std::unique_ptr<Plan> MakePlan(std::unique_ptr<ir::Graph> g, Device device, std::string name,
                               std::span<const int> late_outputs = {});

/// The optimizing pipeline (passes/pass.h), then MakePlan; inputs and outputs keep their order
/// and types. With `freeze`, freeze_fold runs after the pipeline and may change the inputs (see
/// freeze_fold.h); `frozen` receives what it did. Both steps go into the plan's report.
std::unique_ptr<Plan> OptimizeAndPlan(std::unique_ptr<ir::Graph> g, Device device, std::string name,
                                      const passes::FreezeOptions* freeze = nullptr,
                                      passes::FreezeResult* frozen = nullptr,
                                      std::span<const int> late_outputs = {});

/// The graph's IR text with each node's planning decisions as a comment at the end of its line
/// (its step, group, stream, waits, and where the values it writes live: `%5@128` is 128 bytes
/// into the arena, `/256` the per-stream layout's offset); KILN_DUMP_IR=<plan step> prints it.
std::string PlanText(const Plan& p);

/// A copy of the plan's graph (its own: the plan's graph itself is also the cached graph that
/// graph_text() prints and export writes, and stays plain) carrying the plan's decisions as typed
/// notes (ir/graph.h): each fused node's group (numbered as PlanText does), with several streams
/// each step's stream and the nodes it waits for, and each value placed in the arena its offset in
/// the serial layout. Its IR text parses back with the notes.
std::unique_ptr<ir::Graph> AnnotatedGraph(const Plan& p);

/// Runs `p` on the call's inputs and outputs (a call_graph kernel's arguments) through the
/// executor (runtime/executor.h).
void RunPlan(const Plan& p, const KernelArgs& a);

}  // namespace kiln
