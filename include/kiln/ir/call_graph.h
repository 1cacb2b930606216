// Calling a compiled graph as one op, and the one registry of compiled graphs.
//
// A hybridized block's compiled graph is registered here under an id; the op
// `call_graph {graph_id, num_outputs}` then appears on autograd tapes and in other graphs like
// any op: its inference reads the registered signature, its gradient is the op
// `call_graph_backward {graph_id}`, whose outputs are the gradients of every input. The kernels
// that run the graphs live in frontend/ (cached_graph.cc), which keeps its compiled plans in the
// entry's payload: signature and plans are registered together, under one id, in one place.
//
// Lifetime: an entry lives while a GraphRef to it does (the frontend's CachedGraph holds one, a
// graph holds those of the graphs it calls); when the last goes, the entry is freed and its id
// is not found any more (ids are never reused). This registry knows no engine: keeping an entry
// alive until the tasks that run it have finished is the frontend's business.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/ir/op.h"

namespace kiln::ir {

struct GraphSignature {
  std::vector<TensorType> inputs;
  std::vector<TensorType> outputs;
  int64_t random_numel = 0;  ///< generator counter space one call consumes (random ops inside)
  /// -1: every output is differentiable and the backward recomputes the forward (inputs: the
  /// forward inputs, then one gradient per output). k >= 0: outputs [k, n) are values the forward
  /// saved for its backward, whose inputs are then the forward inputs, the saved values, and the
  /// gradients of outputs [0, k).
  int num_grad_outputs = -1;
};

/// What the layer that registers a graph keeps with it (compiled plans); opaque here.
class GraphPayload {
 public:
  virtual ~GraphPayload() = default;
};

/// One registered graph. Freed (and unregistered) when the last GraphRef to it goes.
class RegisteredGraph {
 public:
  ~RegisteredGraph();
  RegisteredGraph(const RegisteredGraph&) = delete;
  RegisteredGraph& operator=(const RegisteredGraph&) = delete;
  int64_t id() const { return id_; }
  const GraphSignature& signature() const { return sig_; }
  GraphPayload* payload() const { return payload_.get(); }

 private:
  friend std::shared_ptr<RegisteredGraph> RegisterGraph(GraphSignature, std::unique_ptr<GraphPayload>);
  RegisteredGraph(int64_t id, GraphSignature sig, std::unique_ptr<GraphPayload> payload)
      : id_(id), sig_(std::move(sig)), payload_(std::move(payload)) {}
  int64_t id_;
  GraphSignature sig_;
  std::unique_ptr<GraphPayload> payload_;
};
using GraphRef = std::shared_ptr<RegisteredGraph>;

/// Registers a graph's signature with its payload under a new id (never reused).
GraphRef RegisterGraph(GraphSignature sig, std::unique_ptr<GraphPayload> payload);
/// The entry of `id`, while some GraphRef keeps it; ValueError when no live graph has that id.
GraphRef FindGraph(int64_t id);
/// The signature of `id` (FindGraph(id)->signature()).
GraphSignature GetGraphSignature(int64_t id);
/// Entries alive now (for tests and leak checks).
size_t NumRegisteredGraphs();

void RegisterGraphOps(OpTable& t);

}  // namespace kiln::ir
