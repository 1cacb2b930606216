// Re-shaping an exported graph for new input shapes (an MXNet executor's rebind): the graph is
// copied with its data inputs given new shapes, every node's types are inferred again, and the
// attributes that hold sizes (a reshape's or broadcast_to's target, a creation op's shape, a
// gradient op's recorded input shape, a slice's bounds, split's section sizes) are rewritten
// consistently, so that a graph traced at batch 64 runs at batch 3.
//
// The rule. Each input dimension that changes maps its traced size to the new one (64 -> 3); a
// size-valued attribute entry equal to a changed traced size takes the new size. That is sound
// only when the entry cannot be a different dimension that happens to have the same size, so an
// entry is rewritten only when the traced size does not also occur, unchanged, among the node's
// input dimensions or the graph's data input dimensions; otherwise the node is ambiguous and
// ReshapeInputs throws. A reshape's leading target sizes that equal its input's leading sizes
// are taken as those dimensions (MXNet's reshape code 0; flatten's batch), and its other
// ambiguous entries are settled by the element count when only one choice fits. A slice on a
// resized axis must take the whole axis (constant bounds on a batch axis mean nothing at another
// batch size); split on a resized axis must cut it into equal parts. Every other failure of
// inference on the new types is rethrown naming the node.
//
// What it cannot see: a size that entered the graph as a *value* (a count folded into a scalar
// constant). kiln's reductions (mean) carry their counts in the op; the one such value a traced
// block writes is BatchNorm's unbiasing factor in training mode, and exported graphs are the
// inference ones. It returns a new graph rather than rewriting in place (Graph has no node
// replacement), and is no pipeline pass: it runs where a loaded graph meets new inputs, before
// compiling. Not here: call_graph nodes (inline them first, passes/inline_calls.h), rank changes.
#pragma once

#include <memory>
#include <span>

#include "kiln/ir/graph.h"

namespace kiln::passes {

/// A copy of `g` whose first `shapes.size()` inputs (the data inputs) have the given shapes (the
/// other inputs, the parameters, keep theirs), with node types inferred again and size-valued
/// attributes rewritten as the header says. Throws ShapeError naming the input (wrong rank, a
/// traced size mapped to two new sizes) or the node and the input that changed (ambiguous or
/// impossible re-shaping), and what to do.
std::unique_ptr<ir::Graph> ReshapeInputs(const ir::Graph& g, std::span<const Shape> shapes);

} // namespace kiln::passes
