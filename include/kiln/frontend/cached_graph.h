// Hybridize's machinery (DESIGN.md section 6): tracing eager code into an ir::Graph, and running
// the traced graph compiled, as one engine task.
//
// Tracing: while a TraceScope is alive on a thread, every eager op (Invoke) on that thread is
// recorded instead of run. Symbolic tensors carry shape, dtype and device but no data; a concrete
// tensor an op reads (a parameter, a constant) is captured as a graph input, so the compiled
// graph reads its current value on every call. A copy into a concrete tensor (batch norm's
// running statistics) becomes an extra graph output copied into it after each call. Reading the
// data of a symbolic tensor is a StateError.
//
// CachedGraph::Call runs the plan: nodes in order on pre-planned buffers (intermediates share
// one arena by liveness), as the op `call_graph`, so a call is one engine task, is recorded by
// autograd like any op (its gradient runs the graph's backward, built by the autodiff pass from
// the traced graph, recomputing the forward), and can itself be traced.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/ir/graph.h"

namespace kiln {

class CachedGraph;

namespace trace {

class TraceScope {
 public:
  TraceScope();
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  /// A data input of the graph (a symbolic tensor).
  Tensor Input(const std::string& name, const Shape& shape, DType dtype, Device device);
  /// Ends the trace; `outputs` may be symbolic or concrete (captured) tensors.
  std::shared_ptr<CachedGraph> Finish(const std::vector<Tensor>& outputs);

  struct State;

 private:
  std::unique_ptr<State> state_;
  State* prev_;
};

/// True while a TraceScope is alive on this thread.
bool Active();
bool IsSymbolic(const Tensor& t);
/// Throws StateError: `what` (e.g. "asnumpy()") needs data, which a symbolic tensor has not.
[[noreturn]] void ThrowSymbolicRead(const char* what);

/// Records `op` on the active trace (called by Invoke); returns symbolic outputs.
std::vector<Tensor> RecordOp(ir::OpId op, std::span<const Tensor> inputs, const ir::Attrs& attrs,
                             std::optional<Device> device);
/// Records `dst = src` where `dst` is concrete: done after every call of the compiled graph.
void RecordAssign(const Tensor& src, const Tensor& dst);

}  // namespace trace

class CachedGraph {
 public:
  /// The traced graph: data inputs first, then the captured tensors, in that order.
  const ir::Graph& graph() const;
  int num_data_inputs() const { return num_data_; }
  /// The concrete tensors the trace read, in the order of their graph inputs.
  const std::vector<Tensor>& captured() const { return captured_; }
  /// Number of user outputs (the graph may have more: values copied into captured tensors).
  int num_outputs() const { return num_outputs_; }
  int64_t graph_id() const { return id_; }
  /// Bytes of the arena that holds every intermediate (planned by liveness).
  size_t arena_bytes() const;
  /// Groups of elementwise ops running as one generated kernel, and the ops in them.
  int num_fused_groups() const;
  int num_fused_ops() const;
  /// Runs the graph on `data_inputs` (shapes and dtypes as traced): one engine task.
  std::vector<Tensor> Call(const std::vector<Tensor>& data_inputs) const;

  /// A compiled graph from an existing graph (an exported one): inputs are `num_data_inputs`
  /// data inputs followed by one input per tensor of `captured` (the parameters), in order.
  static std::shared_ptr<CachedGraph> FromGraph(std::unique_ptr<ir::Graph> graph, int num_data_inputs,
                                                std::vector<Tensor> captured, Device device);

  struct Assign {
    int output;    ///< graph output index
    Tensor dst;    ///< concrete tensor written after each call
  };

 private:
  friend class trace::TraceScope;
  static int64_t Register(std::unique_ptr<ir::Graph> graph, Device device,
                          std::unique_ptr<ir::Graph> backward = nullptr, int num_grad_outputs = -1);
  int64_t id_ = -1;
  int num_data_ = 0, num_outputs_ = 0;
  Device device_;
  std::vector<Tensor> captured_;
  std::vector<Assign> assigns_;
};

}  // namespace kiln
