#include "kiln/passes/dce.h"

namespace kiln::passes {

std::vector<bool> LiveNodes(const ir::Graph& g, std::span<ir::Value* const> roots) {
  std::vector<bool> live(g.nodes().size(), false);
  std::vector<const ir::Node*> stack;
  auto mark = [&](const ir::Value* v) {
    if (!v || !v->node() || live[static_cast<size_t>(v->node()->id())]) return;
    live[static_cast<size_t>(v->node()->id())] = true;
    stack.push_back(v->node());
  };
  for (const ir::Value* v : roots) mark(v);
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    for (const ir::Value* v : n->inputs()) mark(v);
  }
  return live;
}

}  // namespace kiln::passes
