// The tracer of hybridize (DESIGN.md section 6): while a TraceScope is alive on a thread, every
// eager op (Invoke) on that thread is recorded into an ir::Graph instead of run. Symbolic tensors
// carry shape, dtype and device but no data; a concrete tensor an op reads (a parameter, a
// constant) is captured as a graph input, so the compiled graph reads its current value on every
// call. A copy into a concrete tensor (batch norm's running statistics) becomes an extra graph
// output copied into it after each call. Reading the data of a symbolic tensor is a StateError.
//
// This is all eager dispatch needs to know of hybridize: it includes this header, never the
// compiled-graph machinery (cached_graph.h), which TraceScope::Finish hands the trace to.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/ir/attrs.h"
#include "kiln/ir/op.h"

namespace kiln {

class CachedGraph;

namespace ir {
class Graph;
}

namespace trace {

/// What a finished trace is: the graph and the concrete tensors it reads and writes.
struct TracedGraph {
  std::unique_ptr<ir::Graph> graph;  ///< inputs: data inputs first, then one per captured tensor
  int num_data = 0;                  ///< data inputs (TraceScope::Input)
  int num_outputs = 0;               ///< user outputs; graph outputs after them feed `assigns`
  Device device;
  std::vector<Tensor> captured;                 ///< the concrete tensors behind the captured inputs
  std::vector<std::pair<int, Tensor>> assigns;  ///< (graph output, concrete destination)
};

class TraceScope {
 public:
  TraceScope();
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  /// A data input of the graph (a symbolic tensor).
  Tensor Input(const std::string& name, const Shape& shape, DType dtype, Device device);
  /// Ends the trace and compiles it (CachedGraph::FromTrace); `outputs` may be symbolic or
  /// concrete (captured) tensors. `freeze`: the captured tensors become constants (see
  /// cached_graph.h, "Freezing"), folded with the trace and autograd recording off.
  std::shared_ptr<CachedGraph> Finish(const std::vector<Tensor>& outputs, bool freeze = false);

  struct State;

 private:
  std::unique_ptr<State> state_;
  State* prev_;
};

/// Suspends this thread's trace while alive: ops run eagerly (a parameter whose shape the trace
/// has just completed is initialized with real data), then the trace goes on.
class PauseScope {
 public:
  PauseScope();
  ~PauseScope();
  PauseScope(const PauseScope&) = delete;
  PauseScope& operator=(const PauseScope&) = delete;

 private:
  TraceScope::State* paused_;
};

/// True while a TraceScope is alive (and not paused) on this thread.
bool Active();
bool IsSymbolic(const Tensor& t);
/// Throws StateError: `what` (e.g. "asnumpy()") needs data, which a symbolic tensor has not.
[[noreturn]] void ThrowSymbolicRead(const char* what);

/// Records `op` on the active trace (called by Invoke); returns symbolic outputs.
std::vector<Tensor> RecordOp(ir::OpId op, std::span<const Tensor> inputs, const ir::Attrs& attrs,
                             std::optional<Device> device);
/// Records `dst = src`. A concrete `dst`: copied after every call of the compiled graph. A
/// symbolic `dst` (y[0] = 0, y += 1 on a value of the trace): the symbolic tensors holding it, and
/// the arrays it is a view of, take the written value, as the eager write would have changed them;
/// writing into a data input of the trace is a StateError.
void RecordAssign(const Tensor& src, const Tensor& dst);

}  // namespace trace
}  // namespace kiln
