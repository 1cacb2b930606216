// Reverse-mode differentiation over an ir::Graph (see autodiff.h).
#include "kiln/passes/autodiff.h"

#include <unordered_map>
#include <unordered_set>

#include "kiln/runtime/error.h"

namespace kiln::passes {

std::vector<ir::Value*> BuildGradients(ir::Graph& g, std::span<ir::Value* const> ys,
                                       std::span<ir::Value* const> dys,
                                       std::span<ir::Value* const> xs) {
  KILN_CHECK(ys.size() == dys.size());
  // Nodes that depend on some x (forward reachability), restricted later to those reaching a y.
  std::unordered_set<const ir::Value*> from_x(xs.begin(), xs.end());
  const auto& nodes = g.nodes();
  size_t end = nodes.size();  // gradient nodes appended below are not revisited
  std::vector<bool> on_path(end, false);
  for (size_t i = 0; i < end; ++i) {
    const ir::Node& n = *nodes[i];
    bool hit = false;
    for (ir::Value* v : n.inputs()) hit |= from_x.count(v) > 0;
    if (hit) {
      on_path[i] = true;
      for (ir::Value* o : n.outputs()) from_x.insert(o);
    }
  }

  std::unordered_map<const ir::Value*, ir::Value*> grad;
  ir::Builder b(g);
  auto accumulate = [&](const ir::Value* v, ir::Value* d) {
    KILN_CHECK(d->shape() == v->shape())
        << "gradient of shape " << d->shape().str() << " for a value of shape " << v->shape().str();
    if (d->dtype() != v->dtype()) d = b.Cast(d, v->dtype());
    auto it = grad.find(v);
    if (it == grad.end()) grad.emplace(v, d);
    else it->second = b.Add(it->second, d);
  };
  for (size_t i = 0; i < ys.size(); ++i)
    if (from_x.count(ys[i])) accumulate(ys[i], dys[i]);

  for (size_t i = end; i-- > 0;) {
    if (!on_path[i]) continue;
    const ir::Node& n = *nodes[i];
    std::vector<ir::Value*> out_grads;
    bool any = false;
    for (ir::Value* o : n.outputs()) {
      auto it = grad.find(o);
      out_grads.push_back(it == grad.end() ? nullptr : it->second);
      any |= it != grad.end();
    }
    if (!any) continue;
    const ir::OpDef& def = n.def();
    if (!def.differentiable) continue;  // no gradient flows through (comparisons, sign, ...)
    ir::GradContext ctx(g, n, std::move(out_grads));
    std::vector<ir::Value*> in_grads = def.grad(ctx);
    KILN_CHECK(in_grads.size() == n.inputs().size())
        << def.name << ": gradient rule returned " << in_grads.size() << " gradients for "
        << n.inputs().size() << " inputs";
    for (size_t k = 0; k < in_grads.size(); ++k) {
      ir::Value* in = n.input(static_cast<int>(k));
      if (in_grads[k] && from_x.count(in) && IsFloat(in->dtype())) accumulate(in, in_grads[k]);
    }
  }

  std::vector<ir::Value*> out;
  for (ir::Value* x : xs) {
    auto it = grad.find(x);
    out.push_back(it == grad.end() ? nullptr : it->second);
  }
  return out;
}

}  // namespace kiln::passes
