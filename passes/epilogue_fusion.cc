// Epilogue fusion decisions (see kiln/passes/epilogue_fusion.h): following each anchor's output
// through single readers while the library's epilogue can express the next op.
#include "kiln/passes/epilogue_fusion.h"

#include <optional>

#include "kiln/passes/fusion.h"
#include "kiln/runtime/error.h"

namespace kiln::passes {

namespace {

/// The step node `n` applies to the chain's value `v` (one of its inputs), if the epilogue
/// expresses it; `operand` receives a tensor the step reads.
std::optional<EpilogueOp> StepOf(const ir::Node& n, const ir::Value* v, const Shape& out, int axis,
                                 const EpilogueOptions& o, const ir::Value** operand) {
  const ir::OpDef& d = n.def();
  if (!Fusable(n) || n.output()->shape() != out) return std::nullopt;
  EpilogueOp s;
  if (d.unary_fn) {
    if (!o.supports_unary(*d.unary_fn)) return std::nullopt;
    s.kind = EpilogueOp::kUnary;
    s.unary = *d.unary_fn;
    return s;
  }
  const bool left = n.input(0) == v;
  const ir::Value* other = n.input(left ? 1 : 0);
  if (other == v) return std::nullopt;  // v op v
  const BinaryFn f = *d.binary_fn;
  if (auto c = ScalarConst(other)) {  // alpha * x + beta, exactly what the op computes
    const float k = static_cast<float>(*c);
    s.kind = EpilogueOp::kLinear;
    if (f == BinaryFn::kAdd)
      s.beta = k;
    else if (f == BinaryFn::kSub)
      left ? (s.beta = -k) : (s.alpha = -1.f, s.beta = k);
    else if (f == BinaryFn::kMul)
      s.alpha = k;
    else
      return std::nullopt;
    return s;
  }
  if (!o.supports_binary(f) || other->dtype() != DType::kFloat32) return std::nullopt;
  const bool commutes =
      f == BinaryFn::kAdd || f == BinaryFn::kMul || f == BinaryFn::kMaximum || f == BinaryFn::kMinimum;
  if (!left && !commutes) return std::nullopt;  // the post-op computes x op operand
  auto index = BroadcastIndex(other->shape(), out);
  if (!index) return std::nullopt;
  int64_t inner = 1;
  for (int d2 = axis + 1; d2 < out.rank(); ++d2) inner *= out[d2];
  s.kind = EpilogueOp::kBinary;
  s.binary = f;
  if (index->second == 0)
    s.per_channel = false;  // same shape
  else if (index->first == inner && index->second == out[axis])
    s.per_channel = true;  // one per channel
  else
    return std::nullopt;
  *operand = other;
  return s;
}

}  // namespace

std::vector<EpilogueChain> FindEpilogueChains(const ir::Graph& graph, const std::vector<bool>& live,
                                              const std::vector<bool>& claimed_in, const EpilogueOptions& o) {
  KILN_CHECK(o.anchor_channel_axis && o.supports_unary && o.supports_binary)
      << "FindEpilogueChains: the options' capability callbacks must be set";
  const size_t n_nodes = graph.nodes().size();
  std::vector<bool> claimed = claimed_in;
  std::vector<int> uses(static_cast<size_t>(graph.num_values()), 0), reader(uses.size(), -1);
  for (size_t i = 0; i < n_nodes; ++i)
    if (live[i])
      for (const ir::Value* v : graph.nodes()[i]->inputs()) ++uses[v->id()], reader[v->id()] = static_cast<int>(i);
  for (const ir::Value* v : graph.outputs()) uses[v->id()] += 2;  // an output is always written
  std::vector<EpilogueChain> chains;
  for (size_t i = 0; i < n_nodes; ++i) {
    const ir::Node& anchor = *graph.nodes()[i];
    if (!live[i] || claimed[i] || anchor.def().fusion != ir::FusionKind::kOutEwiseFusable) continue;
    if (anchor.outputs().size() != 1 || anchor.output()->dtype() != DType::kFloat32) continue;
    const int axis = o.anchor_channel_axis(anchor);
    if (axis < 0) continue;
    const Shape& out = anchor.output()->shape();
    EpilogueChain c;
    c.members.push_back(static_cast<int>(i));
    const ir::Value* v = anchor.output();
    while (uses[v->id()] == 1) {
      const size_t j = static_cast<size_t>(reader[v->id()]);
      if (claimed[j]) break;
      const ir::Value* operand = nullptr;
      std::optional<EpilogueOp> step = StepOf(*graph.nodes()[j], v, out, axis, o, &operand);
      if (!step || (operand && static_cast<int>(c.operands.size()) == o.max_operands)) break;
      if (operand) {
        step->operand = static_cast<int>(c.operands.size());
        c.operands.push_back(operand);
      }
      c.ops.push_back(*step);
      c.members.push_back(static_cast<int>(j));
      v = graph.nodes()[j]->output();
    }
    if (c.members.size() < 2) continue;
    for (int m : c.members) claimed[static_cast<size_t>(m)] = true;
    chains.push_back(std::move(c));
  }
  return chains;
}

}  // namespace kiln::passes
