// Algebraic simplification. Each rule replaces a node's output by a value of exactly the same
// type (shape and dtype), so a rule never changes what broadcasting or promotion would produce:
//   x*1, 1*x, x/1, x+0, 0+x, x-0  -> x   the constant is a `full` node with that value and
//                                         the result's type equals x's type
//   neg(neg(x))                   -> x
//   transpose(transpose(x))       -> x   when the composed permutation is the identity
//   reshape(reshape(x))           -> reshape(x)   (the outer target shape)
//   reshape(x) to x's shape       -> x
//   cast(x) to x's dtype          -> x
// Rules match on the new graph as it is built, so chains collapse in one run (neg(neg(neg(neg(x))))
// -> x). Replaced producers are left in place, dead, for DCE.
// Deliberately not done: x+0 -> x does not preserve the sign of a -0.0 x (like fast-math "nsz");
// kiln treats the two zeros alike. No constant folding and no non-identity transpose composition.
#include <optional>

#include "kiln/passes/pass.h"

namespace kiln::passes {

namespace {

/// The value of `v` when it is a `full` constant.
std::optional<double> FullValue(const ir::Value* v) {
  if (!v->node() || v->node()->op() != ir::op::kFull) return std::nullopt;
  return v->node()->attrs().Float("value");
}

bool IsOp(const ir::Value* v, ir::OpId op) { return v->node() && v->node()->op() == op; }

/// Axis permutation of a transpose node (empty axes: reversed), negative axes normalized.
std::vector<int64_t> Permutation(const ir::Node& t) {
  std::vector<int64_t> p = t.attrs().Ints("axes");
  int64_t rank = t.input(0)->shape().rank();
  if (p.empty())
    for (int64_t i = rank - 1; i >= 0; --i) p.push_back(i);
  for (int64_t& a : p)
    if (a < 0) a += rank;
  return p;
}

/// The value node `n` (with new inputs `in`) reduces to, or nullptr when no rule applies.
ir::Value* Simplify(const ir::Node& n, const std::vector<ir::Value*>& in) {
  const ir::TensorType& out = n.output()->type();
  ir::OpId k = n.op();
  if (k == ir::op::kAdd || k == ir::op::kSub || k == ir::op::kMul || k == ir::op::kDiv) {
    double unit = (k == ir::op::kMul || k == ir::op::kDiv) ? 1.0 : 0.0;
    bool commutes = k == ir::op::kAdd || k == ir::op::kMul;
    if (FullValue(in[1]) == unit && in[0]->type() == out) return in[0];
    if (commutes && FullValue(in[0]) == unit && in[1]->type() == out) return in[1];
    return nullptr;
  }
  if (k == ir::op::kNeg && IsOp(in[0], ir::op::kNeg)) return in[0]->node()->input(0);
  if (k == ir::op::kTranspose && IsOp(in[0], ir::op::kTranspose)) {
    std::vector<int64_t> inner = Permutation(*in[0]->node()), outer = Permutation(n);
    for (size_t i = 0; i < outer.size(); ++i)
      if (inner[static_cast<size_t>(outer[i])] != static_cast<int64_t>(i)) return nullptr;
    return in[0]->node()->input(0);
  }
  if (k == ir::op::kReshape && in[0]->type() == out) return in[0];
  if (k == ir::op::kReshape && IsOp(in[0], ir::op::kReshape) && in[0]->node()->input(0)->type() == out)
    return in[0]->node()->input(0);
  if (k == ir::op::kCast && in[0]->dtype() == out.dtype) return in[0];
  return nullptr;
}

} // namespace

bool RunSimplify(std::unique_ptr<ir::Graph>& g) {
  GraphCopier c(*g);
  bool changed = false;
  for (const auto& n : g->nodes()) {
    std::vector<ir::Value*> in = c.Inputs(*n);
    if (ir::Value* v = n->outputs().size() == 1 ? Simplify(*n, in) : nullptr) {
      c.Alias(n->output(), v);
      changed = true;
    } else if (n->op() == ir::op::kReshape && IsOp(in[0], ir::op::kReshape)) {
      // Skip the inner reshape: the same elements in the outer target shape.
      ir::Node* r = c.graph().AddNode(ir::op::kReshape, {in[0]->node()->input(0)}, n->attrs());
      c.Alias(n->output(), r->output());
      changed = true;
    } else {
      c.Copy(*n);
    }
  }
  if (changed) g = c.Finish();
  return changed;
}

} // namespace kiln::passes
