// Dead code: which nodes of a graph contribute to a set of values. Used before running a graph
// (eager backward, compiled plans) so that work whose result nobody reads is not done, e.g. the
// gradient of a convolution's input when that input is the data.
#pragma once

#include <span>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

/// live[i] is true when node i of `g` produces a value that `roots` depend on.
std::vector<bool> LiveNodes(const ir::Graph& g, std::span<ir::Value* const> roots);

}  // namespace kiln::passes
