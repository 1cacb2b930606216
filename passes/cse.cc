// Common-subexpression elimination: two nodes with the same op, the same (already merged) inputs
// and equal attributes compute the same values, so the later one is replaced by the earlier.
// Random ops are never merged: two dropout masks drawn from the same attributes differ.
// Constants (`full` with equal attributes) merge like any other node. Float attributes compare
// with ==, so a NaN attribute never matches (conservative). The merged-away node is not copied,
// so CSE leaves no dead nodes of its own.
#include <map>
#include <utility>

#include "kiln/passes/pass.h"

namespace kiln::passes {

bool RunCSE(std::unique_ptr<ir::Graph>& g) {
  GraphCopier c(*g);
  // (op, new inputs) -> the new nodes with that key; attributes are compared among them.
  std::map<std::pair<ir::OpId, std::vector<ir::Value*>>, std::vector<ir::Node*>> seen;
  bool changed = false;
  for (const auto& n : g->nodes()) {
    std::vector<ir::Value*> in = c.Inputs(*n);
    if (n->def().random) {
      c.Copy(*n);
      continue;
    }
    std::vector<ir::Node*>& same = seen[{n->op(), in}];
    ir::Node* match = nullptr;
    for (ir::Node* m : same)
      if (m->attrs() == n->attrs()) match = m;
    if (match) {
      for (size_t i = 0; i < n->outputs().size(); ++i) c.Alias(n->outputs()[i], match->outputs()[i]);
      changed = true;
    } else {
      same.push_back(c.Copy(*n));
    }
  }
  if (changed) g = c.Finish();
  return changed;
}

} // namespace kiln::passes
