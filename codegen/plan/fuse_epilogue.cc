// Epilogue groups of the fusion step (see plan.h, DESIGN.md section 9): the chains that
// passes/epilogue_fusion.h finds (a matmul or conv2d and the elementwise ops after it) bound to
// one library call each, oneDNN applying the chain as post-ops (a first per-channel add as the
// primitive's own bias) while the output is in registers, instead of a generated kernel reading
// the output back. The pass asks this file what the library takes (the anchors, the scalar
// functions of post-ops); this file builds the call's parameters, the report's text, and runs it.
// On a GPU the library is cuBLASLt, whose epilogue takes less: a float32 matmul with a first
// per-output-feature add (the bias) and then relu (gpurt::MatmulOnGpu); the longest prefix of a
// chain it expresses becomes the group, and the rest stays for elementwise groups.
#include <cstdio>
#include <memory>
#include <string>

#include "kiln/passes/epilogue_fusion.h"
#include "kiln/runtime/cpu/epilogue_call.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "fuse.h"

namespace kiln {

namespace fusion {

using host::EpilogueCall;

namespace {

void ReadPair(const ir::Attrs& a, const char* name, int64_t out[2]) {
  const std::vector<int64_t>& v = a.Ints(name);
  out[0] = v[0];
  out[1] = v.size() > 1 ? v[1] : v[0];
}

/// The library kernels that take an epilogue, by op: the call's parameters from the attributes
/// and the output's channel axis. nullopt for other out-elementwise-fusable ops.
std::optional<EpilogueCall> AnchorCall(const ir::Node& n) {
  const ir::OpId matmul = op::kMatmul, conv2d = op::kConv2d;
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

// The pass's capability queries (passes/epilogue_fusion.h), answered from the kernels here.
int AnchorChannelAxis(const ir::Node& n) {
  std::optional<EpilogueCall> c = AnchorCall(n);
  if (!c) return -1;
  return c->anchor == EpilogueCall::kConv2d ? 1 : n.output()->shape().rank() - 1;
}
bool SupportsUnary(UnaryFn f) { return host::EpilogueSupports(f); }
bool SupportsBinary(BinaryFn f) { return host::EpilogueSupports(f); }

host::EpilogueStep ToStep(const passes::EpilogueOp& op) {
  host::EpilogueStep s;
  s.kind = static_cast<host::EpilogueStep::Kind>(op.kind);
  s.unary = op.unary, s.binary = op.binary;
  s.alpha = op.alpha, s.beta = op.beta;
  s.per_channel = op.per_channel, s.operand = op.operand;
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
  static_assert(static_cast<int>(passes::EpilogueOp::kUnary) == host::EpilogueStep::kUnary &&
                static_cast<int>(passes::EpilogueOp::kLinear) == host::EpilogueStep::kLinear &&
                static_cast<int>(passes::EpilogueOp::kBinary) == host::EpilogueStep::kBinary);
  const passes::EpilogueOptions options{AnchorChannelAxis, SupportsUnary, SupportsBinary, 4};
  const std::vector<passes::EpilogueChain> chains = passes::FindEpilogueChains(graph, live, *claimed, options);
  for (const passes::EpilogueChain& chain : chains) {
    const ir::Node& anchor = *graph.nodes()[static_cast<size_t>(chain.members.front())];
    EpilogueCall call = *AnchorCall(anchor);
    for (const passes::EpilogueOp& op : chain.ops) call.epilogue.steps.push_back(ToStep(op));
    auto fused = std::make_unique<Plan::Fused>();
    fused->inputs.assign(anchor.inputs().begin(), anchor.inputs().end());
    const int first_operand = static_cast<int>(fused->inputs.size());
    fused->inputs.insert(fused->inputs.end(), chain.operands.begin(), chain.operands.end());
    PlanReport::Group& r = p->report.groups.emplace_back();
    r.expr = "oneDNN " + anchor.def().name + "(in0, in1)";
    for (size_t k = 0; k < call.epilogue.steps.size(); ++k) {
      const host::EpilogueStep& s = call.epilogue.steps[k];
      const bool bias =
          k == 0 && s.kind == host::EpilogueStep::kBinary && s.binary == BinaryFn::kAdd && s.per_channel;
      const std::string& op = graph.nodes()[static_cast<size_t>(chain.members[k + 1])]->def().name;
      r.expr += (k ? ", " : " post-ops: ") + StepText(s, op, first_operand + s.operand, bias);
    }
    for (int m : chain.members) r.ops.push_back(graph.nodes()[static_cast<size_t>(m)]->def().name);
    r.num_inputs = static_cast<int>(fused->inputs.size());
    fused->epilogue = std::make_shared<const EpilogueCall>(std::move(call));
    fused->members = chain.members;
    p->fused[static_cast<size_t>(chain.members.back())] = std::move(fused);
    for (size_t k = 0; k + 1 < chain.members.size(); ++k) p->fused_member[static_cast<size_t>(chain.members[k])] = true;
    for (int m : chain.members) (*claimed)[static_cast<size_t>(m)] = true;
    ++p->num_fused_groups;
    p->num_fused_nodes += static_cast<int>(chain.members.size());
  }
  return static_cast<int>(chains.size());
}

namespace {

// What cuBLASLt's epilogue takes (gpu.h's MatmulOnGpu): float32 matmuls with a product (k > 0),
// the bias per column of the row-major output (its last axis), then relu. kiln's gelu is no
// unary op but a tree (x * Phi(x)), which no chain holds.
int GpuAnchorChannelAxis(const ir::Node& n) {
  if (n.op() != static_cast<ir::OpId>(op::kMatmul)) return -1;
  const ir::Value* out = n.output();
  if (out->dtype() != DType::kFloat32 || out->shape().rank() < 2) return -1;
  const Shape& a = n.input(0)->shape();
  if (a.rank() < 2 || (n.attrs().Bool("transpose_a") ? a[a.rank() - 2] : a[a.rank() - 1]) == 0) return -1;
  return out->shape().rank() - 1;
}
bool GpuSupportsUnary(UnaryFn f) { return f == UnaryFn::kRelu; }
bool GpuSupportsBinary(BinaryFn f) { return f == BinaryFn::kAdd; }

// How many of the chain's first ops cuBLASLt's epilogue applies: a per-channel add, then a relu.
size_t GpuPrefix(const passes::EpilogueChain& c) {
  size_t k = 0;
  if (k < c.ops.size() && c.ops[k].kind == passes::EpilogueOp::kBinary && c.ops[k].binary == BinaryFn::kAdd &&
      c.ops[k].per_channel)
    ++k;
  if (k < c.ops.size() && c.ops[k].kind == passes::EpilogueOp::kUnary && c.ops[k].unary == UnaryFn::kRelu) ++k;
  return k;
}

} // namespace

int FuseGpuEpilogues(const ir::Graph& graph, const std::vector<bool>& live, Plan* p, std::vector<bool>* claimed) {
  const passes::EpilogueOptions options{GpuAnchorChannelAxis, GpuSupportsUnary, GpuSupportsBinary, 1};
  int groups = 0;
  for (const passes::EpilogueChain& chain : passes::FindEpilogueChains(graph, live, *claimed, options)) {
    const size_t len = GpuPrefix(chain);
    if (len == 0) continue;  // its ops stay for elementwise groups
    const ir::Node& anchor = *graph.nodes()[static_cast<size_t>(chain.members.front())];
    EpilogueCall call = *AnchorCall(anchor);
    auto fused = std::make_unique<Plan::Fused>();
    fused->inputs.assign(anchor.inputs().begin(), anchor.inputs().end());
    PlanReport::Group& r = p->report.groups.emplace_back();
    r.expr = "cuBLASLt " + anchor.def().name + "(in0, in1) epilogue: ";
    for (size_t k = 0; k < len; ++k) {
      host::EpilogueStep s = ToStep(chain.ops[k]);
      if (s.kind == host::EpilogueStep::kBinary) {  // the bias: the call's third input
        fused->inputs.push_back(chain.operands[static_cast<size_t>(s.operand)]);
        s.operand = 0;
        r.expr += "bias(in2)";
      } else {
        r.expr += std::string(k ? ", " : "") + "relu";
      }
      call.epilogue.steps.push_back(s);
    }
    fused->members.assign(chain.members.begin(), chain.members.begin() + static_cast<std::ptrdiff_t>(len + 1));
    for (int m : fused->members) r.ops.push_back(graph.nodes()[static_cast<size_t>(m)]->def().name);
    r.num_inputs = static_cast<int>(fused->inputs.size());
    fused->epilogue = std::make_shared<const EpilogueCall>(std::move(call));
    const std::vector<int> members = fused->members;
    p->fused[static_cast<size_t>(members.back())] = std::move(fused);
    for (size_t k = 0; k + 1 < members.size(); ++k) p->fused_member[static_cast<size_t>(members[k])] = true;
    for (int m : members) (*claimed)[static_cast<size_t>(m)] = true;
    ++p->num_fused_groups;
    p->num_fused_nodes += static_cast<int>(members.size());
    ++groups;
  }
  return groups;
}

std::function<void(const exec::StepArgs&)> GpuEpilogueStep(std::shared_ptr<const EpilogueCall> call) {
  const std::vector<host::EpilogueStep>& steps = call->epilogue.steps;
  const bool bias = !steps.empty() && steps.front().kind == host::EpilogueStep::kBinary;
  const gpurt::GemmActivation act = !steps.empty() && steps.back().kind == host::EpilogueStep::kUnary
                                        ? gpurt::GemmActivation::kRelu
                                        : gpurt::GemmActivation::kNone;
  return [call = std::move(call), bias, act](const exec::StepArgs& a) {
    gpurt::MatmulOnGpu(a.in[0], a.in[1], a.out[0], call->matmul.transpose_a, call->matmul.transpose_b,
                       bias ? &a.in[2] : nullptr, act);
  };
}

} // namespace fusion

} // namespace kiln
