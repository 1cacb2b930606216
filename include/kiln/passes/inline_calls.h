// Inlining calls of compiled graphs: every `call_graph` node (a SymbolBlock, or any compiled graph,
// called inside a traced block) is replaced by a copy of the called graph's nodes, recursively, so
// that the result holds plain ops only. Export needs it: a call_graph node names a graph of this
// process by its registry id, which means nothing in a file. Like ReshapeInputs it returns a new
// graph (Graph has no node replacement) and is no pipeline pass. Not here: `call_graph_backward`
// (training graphs are not exported; InlineCalls refuses them), where the bodies come from (the
// registry's payload belongs to the frontend, which passes them in).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "kiln/ir/graph.h"

namespace kiln::passes {

/// The graph that registered id `graph_id` runs: inputs in the order of the call's inputs, outputs
/// in the order of the call's outputs.
using GraphBodyFn = std::function<const ir::Graph&(int64_t graph_id)>;

/// Whether `g` holds a call_graph or call_graph_backward node.
bool HasCalls(const ir::Graph& g);

/// A copy of `g` (same inputs, names and order; same outputs) with every call_graph node replaced
/// by the nodes of `body(graph_id)`, inlined recursively. Throws StateError for a
/// call_graph_backward node, and InternalError when a body's inputs or outputs do not match its call.
std::unique_ptr<ir::Graph> InlineCalls(const ir::Graph& g, const GraphBodyFn& body);

} // namespace kiln::passes
