// Hybridize's compiled graphs (DESIGN.md section 6): a graph traced by the tracer (tracer.h) or
// loaded from a file, compiled once and run as one engine task.
//
// CachedGraph::Call runs the plan: nodes in order on pre-planned buffers (intermediates share
// one arena by liveness), as the op `call_graph`, so a call is one engine task, is recorded by
// autograd like any op (its gradient runs the graph's backward, built by the autodiff pass from
// the traced graph, recomputing the forward), and can itself be traced.
//
// Lifetime: the compiled plans live in the one graph registry (ir/call_graph.h) under the
// graph's id, as long as a CachedGraph (or a graph that calls it) refers to them. A CachedGraph
// that goes away releases them once the engine has no task pending, so a queued call never
// outlives its plans. An autograd tape keeps a reference to each graph it recorded a call of, so
// a backward runs even when the block dropped the graph inside the record scope (its cache
// cleared or evicted); the graph goes with the tape.
//
// Freezing (hybridize(freeze=True), for inference): TraceScope::Finish(outputs, true) makes the
// captured tensors constants of the graph, except those it copies into. The freeze_fold pass
// computes every node that depends on constants alone once, at compile time, running it eagerly;
// the graph then reads the results (and copies of the captured tensors it still reads) as
// constant inputs. The values are a snapshot: a frozen graph does not see later updates of the
// tensors it captured, as torch.jit.freeze; trace again to take new values. A frozen graph is
// still differentiable in its data inputs, not in the captured tensors.
//
// Memory: a node's output takes its own block of the arena, or, for an elementwise op, the block
// of an input of the same size and dtype that dies at that node (in place). CompileReport says
// what compiling did: passes, fused groups, kernels, bytes moved, memory, time, cache hits.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/frontend/tracer.h"
#include "kiln/codegen/plan_report.h"
#include "kiln/ir/call_graph.h"
#include "kiln/ir/graph.h"
#include "kiln/passes/freeze_fold.h"
#include "kiln/passes/pass.h"

namespace kiln {

/// What compiling a graph did (DESIGN.md sections 8 and 9), one entry per plan that exists:
/// the forward, the backward once built, and the training variant's pair once the graph was
/// called under autograd. Kernel counts, bytes and memory are what the plan will do, worked out
/// from the graph, not measured; the times are measured.
struct CompileReport {
  using PlanReport = ::kiln::PlanReport;  // codegen/plan_report.h
  using Group = ::kiln::PlanReport::Group;
  using Freeze = ::kiln::PlanReport::Freeze;
  int64_t graph_id = -1;
  std::vector<PlanReport> plans;
  double total_ms() const;
  /// A readable multi-line text (what KILN_REPORT=1 prints).
  std::string str() const;
};

class CachedGraph {
 public:
  ~CachedGraph();
  CachedGraph(const CachedGraph&) = delete;
  CachedGraph& operator=(const CachedGraph&) = delete;

  /// The traced graph: data inputs first, then the captured tensors, in that order.
  const ir::Graph& graph() const;
  int num_data_inputs() const { return num_data_; }
  /// The concrete tensors the graph reads after its data inputs, in the order of their graph
  /// inputs: those the trace read; for a frozen graph, those it writes, then its constants.
  const std::vector<Tensor>& captured() const { return captured_; }
  /// Whether the captured tensors became constants (TraceScope::Finish with `freeze`).
  bool frozen() const { return frozen_; }
  /// Number of user outputs (the graph may have more: values copied into captured tensors).
  int num_outputs() const { return num_outputs_; }
  int64_t graph_id() const { return ref_->id(); }
  /// Bytes of the arena that holds every intermediate (planned by liveness).
  size_t arena_bytes() const;
  /// Groups of elementwise ops running as one generated kernel, and the ops in them.
  int num_fused_groups() const;
  int num_fused_ops() const;
  /// What compiling this graph did, for every plan of it built so far.
  CompileReport compile_report() const;
  /// Runs the graph on `data_inputs` (shapes and dtypes as traced): one engine task.
  std::vector<Tensor> Call(const std::vector<Tensor>& data_inputs) const;

  /// A compiled graph from an existing graph (an exported one): inputs are `num_data_inputs`
  /// data inputs followed by one input per tensor of `captured` (the parameters), in order.
  /// `late_outputs`: outputs a call writes into one of its inputs (see MakePlan).
  static std::shared_ptr<CachedGraph> FromGraph(std::unique_ptr<ir::Graph> graph, int num_data_inputs,
                                                std::vector<Tensor> captured, Device device,
                                                std::vector<int> late_outputs = {});
  /// A compiled graph from a finished trace (TraceScope::Finish); `freeze`: see "Freezing".
  static std::shared_ptr<CachedGraph> FromTrace(trace::TracedGraph traced, bool freeze);

  struct Assign {
    int output;    ///< graph output index
    Tensor dst;    ///< concrete tensor written after each call
  };

 private:
  CachedGraph() = default;
  static ir::GraphRef Register(std::unique_ptr<ir::Graph> graph, Device device,
                               std::unique_ptr<ir::Graph> backward = nullptr, int num_grad_outputs = -1,
                               const passes::FreezeOptions* freeze = nullptr,
                               passes::FreezeResult* frozen = nullptr, std::vector<int> late_outputs = {});
  /// The outputs copied into captured tensors (assigns_): written at the end of a call, since the
  /// call writes them into the captured tensors themselves, which its steps may read.
  std::vector<int> LateOutputs() const;
  /// Registers `graph` frozen: sets ref_, and captured_ to the tensors the frozen graph reads.
  void RegisterFrozen(std::unique_ptr<ir::Graph> graph);
  ir::GraphRef ref_;
  bool frozen_ = false;
  int num_data_ = 0, num_outputs_ = 0;
  Device device_;
  std::vector<Tensor> captured_;
  std::vector<Assign> assigns_;
  /// A storage of no bytes: what the tape holds for the outputs a call wrote into assigns_' tensors.
  Tensor no_data_;
  /// Output `k` of a call of registered graph `id`: a fresh tensor, or one on the storage of an
  /// earlier call's output nobody holds any more (see Call).
  Tensor OutputTensor(int64_t id, size_t k, const ir::TensorType& t) const;
  mutable std::mutex recycle_mu_;
  mutable std::map<std::pair<int64_t, size_t>, std::vector<StoragePtr>> recycled_;
};

/// The graph a registered id runs (the forward of a CachedGraph, or a training variant), as
/// compiled: what passes::InlineCalls copies in place of a call_graph node. ValueError when no
/// live graph has that id.
const ir::Graph& RegisteredGraphBody(int64_t graph_id);

/// The backward graph of training variant `graph_id` as compiled (inputs: the forward inputs, the
/// saved values, the gradients of the forward's outputs, as call_graph_backward's; outputs: the
/// gradient of every forward input); null when `graph_id` is no live training variant.
const ir::Graph* TrainingBackwardBody(int64_t graph_id);

/// The compiled graph cached with the live graph `graph_id` under `key`, made by `make` on a miss;
/// it lives as long as that graph (at most a few per graph: the oldest go). Autograd caches a
/// tape's compiled backward with the training variant it runs through.
std::shared_ptr<CachedGraph> CompanionGraph(int64_t graph_id, const std::string& key,
                                            const std::function<std::shared_ptr<CachedGraph>()>& make);

/// Lets go of `ref` once the engine is idle, as a CachedGraph lets go of its own: a queued
/// call_graph task finds its graph by id when it runs.
void RetireGraph(ir::GraphRef ref);

/// Compiled graphs alive in the registry (forward graphs and training variants), after freeing
/// those released while the engine was busy if it is idle now. For tests and leak checks.
size_t NumLiveGraphs();

}  // namespace kiln
