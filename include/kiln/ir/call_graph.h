// Calling a compiled graph as one op. A hybridized block's traced graph is registered here under
// an id; the op `call_graph {graph_id, num_outputs}` then appears on autograd tapes and in other
// graphs like any op: its inference reads the registered signature, its gradient is the op
// `call_graph_backward {graph_id}`, whose outputs are the gradients of every input. The kernels
// that run the graphs live in frontend/ (cached_graph.cc).
#pragma once

#include <cstdint>
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

/// Registers a signature; returns its id (never reused).
int64_t RegisterGraphSignature(GraphSignature sig);
/// The signature of `id`; ValueError when no graph has that id.
GraphSignature GetGraphSignature(int64_t id);

void RegisterGraphOps(OpTable& t);

}  // namespace kiln::ir
