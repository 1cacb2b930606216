// Fusion decisions (DESIGN.md sections 8 and 9): which ops may join a generated kernel, how an
// operand is read along a group's output, and the elementwise groups of a graph. These are
// decisions over the graph alone; turning a group into a kernel (and dropping a group the code
// generator cannot take) is the plan builder's, through codegen/. Row groups (row_fusion.h) and
// epilogue groups (epilogue_fusion.h) claim their members before elementwise groups are formed.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

/// A float32 elementwise op of the op table (unary_fn or binary_fn) with one output.
bool Fusable(const ir::Node& n);

/// How an operand of shape `in` is read along an output of shape `out`: {inner, outer} with
/// element i reading in[(i / inner) % outer] (outer 0: the same shape), when its dimensions other
/// than 1 are one contiguous block equal to the output's there (a bias); nullopt otherwise.
std::optional<std::pair<int64_t, int64_t>> BroadcastIndex(const Shape& in, const Shape& out);

/// The value of a `full` constant (every element equal), if `v` is one: generated code has it
/// built in, whatever its shape.
std::optional<double> ScalarConst(const ir::Value* v);

/// An elementwise group: node indices in graph order; the last is the root, whose output is the
/// only value of the group read outside it.
struct ElementwiseGroup {
  std::vector<int> members;
};

/// Chains and trees of float32 elementwise ops among the `live` nodes not `claimed` by row or
/// epilogue groups, whose operands all have the result's shape (or are `full` constants, or
/// bias-like broadcasts, BroadcastIndex). A member's value has no reader outside its group and is
/// no graph output. Groups of one node are not returned; the others in the order they were formed.
std::vector<ElementwiseGroup> FindElementwiseGroups(const ir::Graph& graph, const std::vector<bool>& live,
                                                    const std::vector<bool>& claimed);

/// The pass over a graph: the elementwise groups among the nodes with no `#group=` note yet
/// (row and epilogue groups claim theirs first), each recorded on its members as a `#group=` note
/// numbered after the graph's highest group. True when a group was formed (a second run forms none).
bool RunElementwiseFusion(ir::Graph& graph);

} // namespace kiln::passes
