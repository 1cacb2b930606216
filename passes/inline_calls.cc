// InlineCalls: call_graph nodes replaced by the nodes of the graphs they call (see the header).
#include "kiln/passes/inline_calls.h"

#include "kiln/runtime/error.h"

namespace kiln::passes {

namespace {

// Appends `src`'s nodes to `dst`; `map` holds `src`'s inputs already and gains its node outputs.
void CopyInlining(const ir::Graph& src, ir::Graph& dst, ir::ValueMap& map, const GraphBodyFn& body,
                  int depth) {
  KILN_CHECK(depth < 64) << "InlineCalls: calls nested more than 64 deep (a graph calling itself?)";
  for (const auto& node : src.nodes()) {
    const ir::Node& n = *node;
    std::vector<ir::Value*> in;
    for (const ir::Value* v : n.inputs()) in.push_back(map.at(v));
    if (n.op() == op::kCallGraphBackward)
      KILN_THROW(StateError) << "InlineCalls: node " << n.id() << " runs the backward of a compiled graph; "
                             << "only inference graphs can be inlined: trace the block in inference mode";
    if (n.op() != op::kCallGraph) {
      ir::Node* c = dst.AddNode(n.op(), std::move(in), n.attrs());
      for (size_t k = 0; k < n.outputs().size(); ++k) map[n.outputs()[k]] = c->outputs()[k];
      continue;
    }
    const ir::Graph& callee = body(n.attrs().Int("graph_id"));
    KILN_CHECK(callee.inputs().size() == in.size() && callee.outputs().size() >= n.outputs().size())
        << "InlineCalls: node " << n.id() << " calls graph " << n.attrs().Int("graph_id") << " with "
        << in.size() << " inputs and " << n.outputs().size() << " outputs; the graph has "
        << callee.inputs().size() << " inputs and " << callee.outputs().size() << " outputs";
    ir::ValueMap inner;
    for (size_t k = 0; k < in.size(); ++k) {
      KILN_CHECK(callee.inputs()[k]->type() == in[k]->type())
          << "InlineCalls: input " << k << " of node " << n.id()
          << " does not have the type the called graph takes";
      inner[callee.inputs()[k]] = in[k];
    }
    CopyInlining(callee, dst, inner, body, depth + 1);
    for (size_t k = 0; k < n.outputs().size(); ++k) map[n.outputs()[k]] = inner.at(callee.outputs()[k]);
  }
}

} // namespace

bool HasCalls(const ir::Graph& g) {
  for (const auto& n : g.nodes())
    if (n->op() == op::kCallGraph || n->op() == op::kCallGraphBackward) return true;
  return false;
}

std::unique_ptr<ir::Graph> InlineCalls(const ir::Graph& g, const GraphBodyFn& body) {
  auto out = std::make_unique<ir::Graph>();
  ir::ValueMap map;
  for (const ir::Value* v : g.inputs()) map[v] = out->AddInput(v->name(), v->type());
  CopyInlining(g, *out, map, body, 0);
  std::vector<ir::Value*> outs;
  for (const ir::Value* v : g.outputs()) outs.push_back(map.at(v));
  out->SetOutputs(std::move(outs));
  return out;
}

} // namespace kiln::passes
