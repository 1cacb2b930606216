// The steps of a graph annotated with fusion groups (`#group=` notes, ir/graph.h NodeNote), as the
// planning passes over a graph (memory planning, stream assignment) see them: a node with no group
// is a step of its own; a group is one step at its last member, and its other members do not run.
#pragma once

#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

/// Per node: the index of the node whose step computes it (itself, or its group's last member).
std::vector<int> GroupRoots(const ir::Graph& graph);

} // namespace kiln::passes
