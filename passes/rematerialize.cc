#include "kiln/passes/rematerialize.h"

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "kiln/ir/op.h"

namespace kiln::passes {

namespace {

bool Pointwise(const ir::Node& n) {
  const ir::OpDef& d = n.def();
  if (d.random || n.outputs().size() != 1) return false;
  return d.fusion == ir::FusionKind::kElementwise || d.fusion == ir::FusionKind::kBroadcast ||
         d.fusion == ir::FusionKind::kInjective;
}

double Bytes(const ir::Value* v) {
  return static_cast<double>(v->type().shape.numel()) * static_cast<double>(DTypeSize(v->type().dtype));
}

}  // namespace

SavePlan ChooseSaved(const ir::Graph& g, size_t forward_end, std::span<const ir::Value* const> needed,
                     std::span<const ir::Value* const> keep, std::span<const ir::Value* const> overwritten) {
  const std::unordered_set<const ir::Value*> kept(keep.begin(), keep.end()), stale(overwritten.begin(), overwritten.end());
  std::unordered_set<const ir::Value*> saved;
  std::vector<bool> recomputed(g.nodes().size(), false);
  auto forward = [&](const ir::Value* v) {
    return v->node() && static_cast<size_t>(v->node()->id()) < forward_end;
  };
  // The backward has the value for free: a graph input, kept already, or computed again.
  auto available = [&](const ir::Value* v) {
    return !forward(v) || saved.count(v) || recomputed[static_cast<size_t>(v->node()->id())];
  };
  auto recomputable = [&](const ir::Value* v) { return !kept.count(v) && Pointwise(*v->node()); };

  std::vector<const ir::Value*> order;
  for (const ir::Value* v : needed)
    if (forward(v) && saved.insert(v).second) order.push_back(v);
  std::sort(order.begin(), order.end(), [](const ir::Value* a, const ir::Value* b) {
    return a->node()->id() < b->node()->id() || (a->node() == b->node() && a->index() < b->index());
  });

  // cost(u): the bytes the backward must be handed to have u: none when available, u's own when
  // it is kept, or what its pointwise producer's inputs cost when that is less (ties keep u: the
  // same memory for less work). Memoized per candidate, as `saved` changes between candidates.
  std::unordered_map<const ir::Value*, double> memo;
  auto inputs_cost = [&](auto& self_cost, const ir::Node& n, int depth) {
    double c = 0;
    for (const ir::Value* u : n.inputs()) c += self_cost(self_cost, u, depth);
    return c;
  };
  // A value more than kMaxDepth pointwise ops away from the one wanted is kept: this bounds the
  // recursion and the work computed again (a chain of 20,000 adds is not worth one saved array).
  constexpr int kMaxDepth = 16;
  auto cost = [&](auto& self, const ir::Value* u, int depth) -> double {
    if (stale.count(u)) return std::numeric_limits<double>::infinity();
    if (available(u)) return 0;
    if (auto it = memo.find(u); it != memo.end()) return it->second;
    double c = Bytes(u);
    if (depth >= kMaxDepth) return c;
    memo[u] = c;  // a cycle cannot happen (a DAG); this also bounds shared subexpressions' count
    if (recomputable(u)) c = std::min(c, inputs_cost(self, *u->node(), depth + 1));
    return memo[u] = c;
  };
  // Makes u available the way cost() chose: keeps it, or recomputes its producer.
  auto realize = [&](auto& self, const ir::Value* u, int depth) -> void {
    if (available(u)) return;
    const double own = Bytes(u);
    if (depth < kMaxDepth && recomputable(u) && inputs_cost(cost, *u->node(), depth + 1) < own) {
      for (const ir::Value* w : u->node()->inputs()) self(self, w, depth + 1);
      recomputed[static_cast<size_t>(u->node()->id())] = true;
    } else {
      saved.insert(u);
    }
  };

  for (const ir::Value* v : order) {
    if (!recomputable(v) || !saved.count(v)) continue;
    memo.clear();
    saved.erase(v);  // v's inputs are priced as if v were not kept
    if (inputs_cost(cost, *v->node(), 1) < Bytes(v)) {
      for (const ir::Value* w : v->node()->inputs()) realize(realize, w, 1);
      recomputed[static_cast<size_t>(v->node()->id())] = true;
    } else {
      saved.insert(v);
    }
  }

  SavePlan plan;
  // Saved values in the forward's order; recomputed nodes in the graph's (a topological) order.
  for (size_t i = 0; i < forward_end; ++i) {
    const ir::Node& n = *g.nodes()[i];
    for (const ir::Value* v : n.outputs())
      if (saved.count(v)) plan.saved.push_back(v);
    if (recomputed[i]) plan.recompute.push_back(&n);
  }
  return plan;
}

}  // namespace kiln::passes
