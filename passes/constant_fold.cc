// Constant folding. A node whose inputs are all `full` constants (every element the same value)
// produces a constant too, and becomes a `full` of its output type:
//   reshape, transpose, slice, expand_dims, squeeze, broadcast_to, stop_gradient, split   the value
//   concat, stack of fills with one value and dtype                                       passes through
//   unary and binary elementwise functions, cast, where   the value the op's own CPU kernel computes
//                                                          on one element (see ScalarEvaluator)
// Computed values come from the frontend's evaluator, so folding gives bit for bit what running
// the node would. A value a double cannot hold exactly (an int64 beyond 2^53), a 16-bit float, a
// computation that fails (an integer division by zero, left to fail at run time) or a missing
// evaluator leaves the node as it is. Random ops never fold. Folded producers are left dead for DCE.
// Deliberately not here: folding of tensors that are not fills (that needs data constants in
// the IR, for hybridize(freeze=True)).
#include <cmath>
#include <optional>
#include <vector>

#include "kiln/passes/pass.h"

namespace kiln::passes {

namespace {

ScalarEvaluator g_evaluator = nullptr;

/// The value of `v` when it is a `full` constant.
std::optional<double> FillValue(const ir::Value* v) {
  if (!v->node() || v->node()->op() != ir::op::kFull) return std::nullopt;
  return v->node()->attrs().Float("value");
}

bool Is16Bit(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

/// The value every output of `n` holds when its inputs hold `in`, or nullopt.
std::optional<double> Fold(const ir::Node& n, const std::vector<double>& in) {
  const ir::OpDef& d = n.def();
  if (d.random) return std::nullopt;
  DType out = n.output()->dtype();
  bool same_dtype = true;
  for (const ir::Value* v : n.inputs()) same_dtype &= v->dtype() == out;
  // Data movement: each output element is some input element, and all of them are equal.
  if ((d.fusion == ir::FusionKind::kInjective && n.op() != ir::op::kTake) || n.op() == ir::op::kBroadcastTo ||
      n.op() == ir::op::kStopGradient) {
    for (double x : in)
      if (!(x == in[0] || (std::isnan(x) && std::isnan(in[0])))) return std::nullopt;
    return same_dtype ? std::optional<double>(in[0]) : std::nullopt;
  }
  // Arithmetic: one element through the op's own kernel.
  bool elementwise = d.unary_fn || d.binary_fn || n.op() == ir::op::kCast || n.op() == ir::op::kWhere;
  if (!elementwise || !g_evaluator || n.outputs().size() != 1 || Is16Bit(out)) return std::nullopt;
  for (const ir::Value* v : n.inputs())
    if (Is16Bit(v->dtype())) return std::nullopt;
  return g_evaluator(n, in);
}

}  // namespace

void SetScalarEvaluator(ScalarEvaluator f) { g_evaluator = f; }

bool RunConstantFold(std::unique_ptr<ir::Graph>& g) {
  GraphCopier c(*g);
  bool changed = false;
  for (const auto& n : g->nodes()) {
    std::vector<ir::Value*> in = c.Inputs(*n);
    std::vector<double> values;
    for (const ir::Value* v : in)
      if (auto x = FillValue(v)) values.push_back(*x);
    std::optional<double> folded;
    if (!in.empty() && values.size() == in.size()) folded = Fold(*n, values);
    if (!folded) {
      c.Copy(*n);
      continue;
    }
    for (const ir::Value* o : n->outputs()) {
      ir::Attrs attrs;
      attrs.items().emplace_back("shape", o->shape().vec());
      attrs.items().emplace_back("value", *folded);
      attrs.items().emplace_back("dtype", o->dtype());
      c.Alias(o, c.graph().AddNode(ir::op::kFull, {}, attrs)->output());
    }
    changed = true;
  }
  if (changed) g = c.Finish();
  return changed;
}

}  // namespace kiln::passes
