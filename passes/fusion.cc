// Fusion decisions (see kiln/passes/fusion.h): the fusable-op predicate, operand broadcast
// indexing, built-in constants, and the grouping of elementwise chains and trees.
#include "kiln/passes/fusion.h"

#include <algorithm>

namespace kiln::passes {

bool Fusable(const ir::Node& n) {
  const ir::OpDef& d = n.def();
  if (!d.unary_fn && !d.binary_fn) return false;
  if (n.outputs().size() != 1 || n.output()->dtype() != DType::kFloat32) return false;
  for (const ir::Value* v : n.inputs())
    if (v->dtype() != DType::kFloat32) return false;
  return true;
}

std::optional<std::pair<int64_t, int64_t>> BroadcastIndex(const Shape& in, const Shape& out) {
  if (in == out) return std::pair<int64_t, int64_t>{1, 0};
  int r = out.rank(), pad = r - in.rank();
  if (pad < 0) return std::nullopt;
  int lo = r, hi = -1;
  for (int d = 0; d < in.rank(); ++d)
    if (in[d] != 1) {
      if (in[d] != out[d + pad]) return std::nullopt;
      lo = std::min(lo, d + pad), hi = std::max(hi, d + pad);
    }
  if (hi < 0) return std::pair<int64_t, int64_t>{1, 1}; // one element
  for (int d = lo; d <= hi; ++d)
    if (in[d - pad] == 1 && out[d] != 1) return std::nullopt; // not one contiguous block
  int64_t outer = 1, inner = 1;
  for (int d = lo; d <= hi; ++d) outer *= out[d];
  for (int d = hi + 1; d < r; ++d) inner *= out[d];
  return std::pair<int64_t, int64_t>{inner, outer};
}

std::optional<double> ScalarConst(const ir::Value* v) {
  if (!v->node() || v->node()->op() != op::kFull) return std::nullopt;
  return v->node()->attrs().Float("value");
}

std::vector<ElementwiseGroup> FindElementwiseGroups(const ir::Graph& graph, const std::vector<bool>& live,
                                                    const std::vector<bool>& claimed) {
  const size_t n_nodes = graph.nodes().size();
  std::vector<int> uses(static_cast<size_t>(graph.num_values()), 0);
  for (size_t i = 0; i < n_nodes; ++i)
    if (live[i])
      for (const ir::Value* v : graph.nodes()[i]->inputs()) ++uses[v->id()];
  for (const ir::Value* v : graph.outputs()) uses[v->id()] += 2; // an output is always materialized
  std::vector<int> group_of(n_nodes, -1);
  std::vector<ElementwiseGroup> groups;
  auto operands_ok = [](const ir::Node& n, const Shape& shape) {
    for (const ir::Value* v : n.inputs())
      if (!ScalarConst(v) && !BroadcastIndex(v->shape(), shape)) return false;
    return true;
  };
  for (size_t i = 0; i < n_nodes; ++i) {
    const ir::Node& n = *graph.nodes()[i];
    if (!live[i] || claimed[i] || !Fusable(n)) continue;
    const Shape& shape = n.output()->shape();
    if (!operands_ok(n, shape)) continue;
    int join = -1;
    for (const ir::Value* v : n.inputs()) {
      if (!v->node() || uses[v->id()] != 1 || ScalarConst(v)) continue;
      size_t j = static_cast<size_t>(v->node()->id());
      if (!live[j] || claimed[j] || !Fusable(*v->node()) || v->shape() != shape) continue;
      if (!operands_ok(*v->node(), shape)) continue;
      if (group_of[j] < 0) {
        group_of[j] = static_cast<int>(groups.size());
        groups.push_back({{static_cast<int>(j)}});
      }
      if (join < 0)
        join = group_of[j];
      else if (join != group_of[j]) { // two producer groups: merge the second into the first
        ElementwiseGroup& other = groups[static_cast<size_t>(group_of[j])];
        int gone = group_of[j];
        for (int m : other.members) group_of[static_cast<size_t>(m)] = join;
        auto& mine = groups[static_cast<size_t>(join)].members;
        mine.insert(mine.end(), other.members.begin(), other.members.end());
        std::sort(mine.begin(), mine.end());
        groups[static_cast<size_t>(gone)].members.clear();
      }
    }
    if (join >= 0) {
      group_of[i] = join;
      groups[static_cast<size_t>(join)].members.push_back(static_cast<int>(i));
    }
  }
  std::erase_if(groups, [](const ElementwiseGroup& g) { return g.members.size() < 2; });
  return groups;
}

bool RunElementwiseFusion(ir::Graph& graph) {
  const auto& nodes = graph.nodes();
  std::vector<bool> live(nodes.size(), true), claimed(nodes.size(), false);
  int next = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    claimed[i] = nodes[i]->note().group >= 0;
    next = std::max(next, nodes[i]->note().group + 1);
  }
  const std::vector<ElementwiseGroup> groups = FindElementwiseGroups(graph, live, claimed);
  for (const ElementwiseGroup& grp : groups) {
    for (int m : grp.members) nodes[static_cast<size_t>(m)]->note().group = next;
    ++next;
  }
  return !groups.empty();
}

} // namespace kiln::passes
