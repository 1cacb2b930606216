// The autodiff pass: appends to a graph the nodes that compute gradients of `ys` (seeded with
// `dys`) with respect to `xs`, using each op's gradient rule from the op table. Used by eager
// autograd on its tape and by hybridize on traced graphs.
// What it does not do: higher-order gradients of ops whose rules use non-differentiable helpers.
#pragma once

#include <span>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

/// Returns one gradient Value per x (nullptr where no path leads from x to any y).
/// Contributions from several paths are summed. Throws StateError naming the op when a path
/// runs through an op that is not differentiable only if that op's gradient is required for a
/// floating-point input on the path.
std::vector<ir::Value*> BuildGradients(ir::Graph& g, std::span<ir::Value* const> ys,
                                       std::span<ir::Value* const> dys,
                                       std::span<ir::Value* const> xs);

}  // namespace kiln::passes
