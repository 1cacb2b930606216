// Epilogue groups of the fusion step (see plan.h, DESIGN.md section 9): a matmul or conv2d and
// the chain of elementwise ops after it become one library call, oneDNN applying the chain as
// post-ops (a first per-channel add as the primitive's own bias) while the output is in registers,
// instead of a generated kernel reading the output back. Which ops may start a group is the op
// table's fusion kind (out-elementwise-fusable); which may follow is their scalar function
// (unary_fn / binary_fn) and the shapes of their operands. Each link must be the only reader of
// the value before it, so every value read outside the group is still written (in training, a
// pre-activation the backward reads ends the chain there). Not here: GPU epilogues (cuBLASLt),
// trees (x * sigmoid(x) reads x twice), broadcasts other than per channel.
#include <cstdio>
#include <string>

#include "kiln/runtime/cpu/onednn.h"
#include "kiln/runtime/error.h"
#include "plan.h"

namespace kiln {

namespace fusion {

/// What an epilogue group runs: the anchor's library kernel with the epilogue.
struct EpilogueCall {
  enum Anchor { kMatmul, kConv2d } anchor = kMatmul;
  host::MatmulParams matmul;
  host::Conv2dParams conv;
  host::Epilogue epilogue;
};

namespace {

// Steps the runtime takes at most per group: the primitive's arguments are limited.
constexpr int kMaxTensorOperands = 4;

void ReadPair(const ir::Attrs& a, const char* name, int64_t out[2]) {
  const std::vector<int64_t>& v = a.Ints(name);
  out[0] = v[0];
  out[1] = v.size() > 1 ? v[1] : v[0];
}

/// The library kernels that take an epilogue, by op: the call's parameters from the attributes
/// and the output's channel axis. nullopt for other out-elementwise-fusable ops.
std::optional<EpilogueCall> AnchorCall(const ir::Node& n) {
  static const ir::OpId matmul = ir::FindOp("matmul"), conv2d = ir::FindOp("conv2d");
  EpilogueCall c;
  if (n.op() == matmul) {
    c.anchor = EpilogueCall::kMatmul;
    c.matmul = {n.attrs().Bool("transpose_a"), n.attrs().Bool("transpose_b")};
  } else if (n.op() == conv2d) {
    c.anchor = EpilogueCall::kConv2d;
    ReadPair(n.attrs(), "stride", c.conv.stride);
    ReadPair(n.attrs(), "padding", c.conv.padding);
    ReadPair(n.attrs(), "dilation", c.conv.dilation);
    c.conv.groups = n.attrs().Int("groups");
  } else {
    return std::nullopt;
  }
  return c;
}

int ChannelAxis(const EpilogueCall& c, const Shape& out) {
  return c.anchor == EpilogueCall::kConv2d ? 1 : out.rank() - 1;
}

/// The step node `n` applies to the chain's value `v` (one of its inputs), if the epilogue
/// expresses it; `operand` receives a tensor the step reads.
std::optional<host::EpilogueStep> StepOf(const ir::Node& n, const ir::Value* v, const Shape& out, int axis,
                                         const ir::Value** operand) {
  using host::EpilogueStep;
  const ir::OpDef& d = n.def();
  if (!Fusable(n) || n.output()->shape() != out) return std::nullopt;
  EpilogueStep s;
  if (d.unary_fn) {
    if (!host::EpilogueSupports(*d.unary_fn)) return std::nullopt;
    s.kind = EpilogueStep::kUnary;
    s.unary = *d.unary_fn;
    return s;
  }
  const bool left = n.input(0) == v;
  const ir::Value* other = n.input(left ? 1 : 0);
  if (other == v) return std::nullopt; // v op v
  const BinaryFn f = *d.binary_fn;
  if (auto c = ScalarConst(other)) { // alpha * x + beta, exactly what the op computes
    const float k = static_cast<float>(*c);
    s.kind = EpilogueStep::kLinear;
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
  if (!host::EpilogueSupports(f) || other->dtype() != DType::kFloat32) return std::nullopt;
  const bool commutes =
      f == BinaryFn::kAdd || f == BinaryFn::kMul || f == BinaryFn::kMaximum || f == BinaryFn::kMinimum;
  if (!left && !commutes) return std::nullopt; // the post-op computes x op operand
  auto index = BroadcastIndex(other->shape(), out);
  if (!index) return std::nullopt;
  int64_t inner = 1;
  for (int d2 = axis + 1; d2 < out.rank(); ++d2) inner *= out[d2];
  s.kind = EpilogueStep::kBinary;
  s.binary = f;
  if (index->second == 0)
    s.per_channel = false; // same shape
  else if (index->first == inner && index->second == out[axis])
    s.per_channel = true; // one per channel
  else
    return std::nullopt;
  *operand = other;
  return s;
}

/// A step in the report: `op` names the node it came from.
std::string StepText(const host::EpilogueStep& s, const std::string& op, int input, bool bias) {
  using host::EpilogueStep;
  char buf[64];
  switch (s.kind) {
  case EpilogueStep::kUnary: return op;
  case EpilogueStep::kLinear:
    std::snprintf(buf, sizeof buf, "%g*x%+g", static_cast<double>(s.alpha), static_cast<double>(s.beta));
    return buf;
  case EpilogueStep::kBinary:
    if (bias) return "bias(in" + std::to_string(input) + ")";
    return op + "(x, in" + std::to_string(input) + (s.per_channel ? " per channel)" : ")");
  }
  return "?";
}

} // namespace

int FuseEpilogues(const ir::Graph& graph, const std::vector<bool>& live, Plan* p,
                  std::vector<bool>* claimed) {
  const size_t n_nodes = graph.nodes().size();
  std::vector<int> uses(static_cast<size_t>(graph.num_values()), 0), reader(uses.size(), -1);
  for (size_t i = 0; i < n_nodes; ++i)
    if (live[i])
      for (const ir::Value* v : graph.nodes()[i]->inputs())
        ++uses[v->id()], reader[v->id()] = static_cast<int>(i);
  for (const ir::Value* v : graph.outputs()) uses[v->id()] += 2; // an output is always written
  int formed = 0;
  for (size_t i = 0; i < n_nodes; ++i) {
    const ir::Node& anchor = *graph.nodes()[i];
    if (!live[i] || (*claimed)[i] || anchor.def().fusion != ir::FusionKind::kOutEwiseFusable) continue;
    if (anchor.outputs().size() != 1 || anchor.output()->dtype() != DType::kFloat32) continue;
    std::optional<EpilogueCall> call = AnchorCall(anchor);
    if (!call) continue;
    const Shape& out = anchor.output()->shape();
    const int axis = ChannelAxis(*call, out);
    std::vector<int> members{static_cast<int>(i)};
    std::vector<const ir::Value*> operands;
    const ir::Value* v = anchor.output();
    while (uses[v->id()] == 1) {
      const size_t j = static_cast<size_t>(reader[v->id()]);
      if ((*claimed)[j]) break;
      const ir::Value* operand = nullptr;
      std::optional<host::EpilogueStep> step = StepOf(*graph.nodes()[j], v, out, axis, &operand);
      if (!step || (operand && static_cast<int>(operands.size()) == kMaxTensorOperands)) break;
      if (operand) {
        step->operand = static_cast<int>(operands.size());
        operands.push_back(operand);
      }
      call->epilogue.steps.push_back(*step);
      members.push_back(static_cast<int>(j));
      v = graph.nodes()[j]->output();
    }
    if (members.size() < 2) continue;

    auto fused = std::make_unique<Plan::Fused>();
    fused->inputs.assign(anchor.inputs().begin(), anchor.inputs().end());
    const int first_operand = static_cast<int>(fused->inputs.size());
    fused->inputs.insert(fused->inputs.end(), operands.begin(), operands.end());
    CompileReport::Group& r = p->report.groups.emplace_back();
    r.expr = "oneDNN " + anchor.def().name + "(in0, in1)";
    for (size_t k = 0; k < call->epilogue.steps.size(); ++k) {
      const host::EpilogueStep& s = call->epilogue.steps[k];
      const bool bias =
          k == 0 && s.kind == host::EpilogueStep::kBinary && s.binary == BinaryFn::kAdd && s.per_channel;
      const std::string& op = graph.nodes()[static_cast<size_t>(members[k + 1])]->def().name;
      r.expr += (k ? ", " : " post-ops: ") + StepText(s, op, first_operand + s.operand, bias);
    }
    for (int m : members) r.ops.push_back(graph.nodes()[static_cast<size_t>(m)]->def().name);
    r.num_inputs = static_cast<int>(fused->inputs.size());
    fused->epilogue = std::make_shared<const EpilogueCall>(std::move(*call));
    fused->members = members;
    p->fused[static_cast<size_t>(members.back())] = std::move(fused);
    for (size_t k = 0; k + 1 < members.size(); ++k) p->fused_member[static_cast<size_t>(members[k])] = true;
    for (int m : members) (*claimed)[static_cast<size_t>(m)] = true;
    ++p->num_fused_groups;
    p->num_fused_nodes += static_cast<int>(members.size());
    ++formed;
  }
  return formed;
}

void RunEpilogue(const EpilogueCall& call, std::span<const TensorView> in, const TensorView& out) {
  KILN_CHECK(in.size() >= 2) << "an epilogue group reads its anchor's two inputs";
  if (call.anchor == EpilogueCall::kMatmul)
    host::MatmulEpilogue(in[0], in[1], out, call.matmul, call.epilogue, in.subspan(2));
  else
    host::Conv2dEpilogue(in[0], in[1], out, call.conv, call.epilogue, in.subspan(2));
}

} // namespace fusion

} // namespace kiln
