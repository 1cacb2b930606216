// call_graph and call_graph_backward (see include/kiln/ir/call_graph.h).
#include "infer_util.h"
#include "kiln/ir/call_graph.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

namespace {
void CheckInputs(const OpDef& op, const GraphSignature& sig, std::span<const TensorType> in, size_t n) {
  if (in.size() != n)
    KILN_THROW(ValueError) << op.name << ": the compiled graph takes " << n << " inputs, found " << in.size();
  for (size_t i = 0; i < sig.inputs.size() && i < in.size(); ++i)
    if (!(in[i] == sig.inputs[i]))
      KILN_THROW(ShapeError) << op.name << ": input " << i << " is " << DTypeName(in[i].dtype)
                             << in[i].shape.str() << " but the graph was compiled for "
                             << DTypeName(sig.inputs[i].dtype) << sig.inputs[i].shape.str();
}
}  // namespace

void RegisterGraphOps(OpTable& t) {
  using K = AttrKind;
  OpDef fwd(op::kCallGraph);
  fwd.num_inputs = -1;
  fwd.num_outputs = -1;
  fwd.outputs_from_attrs = [](const Attrs& a, int) { return static_cast<int>(a.Int("num_outputs")); };
  fwd.attrs = {{"graph_id", K::kInt, std::nullopt}, {"num_outputs", K::kInt, std::nullopt}};
  fwd.fusion = FusionKind::kOpaque;
  fwd.random = true;
  fwd.random_numel = [](const Attrs& a) { return GetGraphSignature(a.Int("graph_id")).random_numel; };
  fwd.doc = "runs a compiled (hybridized) graph: outputs = graph(inputs)";
  fwd.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    GraphSignature sig = GetGraphSignature(a.Int("graph_id"));
    CheckInputs(op, sig, in, sig.inputs.size());
    if (static_cast<size_t>(a.Int("num_outputs")) != sig.outputs.size())
      KILN_THROW(ValueError) << op.name << ": num_outputs " << a.Int("num_outputs") << " but the graph has "
                             << sig.outputs.size();
    return sig.outputs;
  };
  fwd.grad = [](GradContext& g) {
    // Inputs of the backward graph: the forward inputs, then one gradient per forward output
    // (zeros where the output did not reach the heads).
    const Node& n = g.node();
    std::vector<Value*> in(n.inputs().begin(), n.inputs().end());
    GraphSignature sig = GetGraphSignature(g.attrs().Int("graph_id"));
    size_t k = sig.num_grad_outputs < 0 ? n.outputs().size() : static_cast<size_t>(sig.num_grad_outputs);
    for (size_t i = k; i < n.outputs().size(); ++i) in.push_back(n.output(static_cast<int>(i)));  // saved
    for (size_t i = 0; i < k; ++i)
      in.push_back(g.has_out_grad(static_cast<int>(i)) ? g.out_grad(static_cast<int>(i))
                                                        : g.ZerosLike(n.output(static_cast<int>(i))));
    Attrs a{{"graph_id", g.attrs().Int("graph_id")}};
    Node* b = g.graph().AddNode(op::kCallGraphBackward, std::move(in), a);
    return std::vector<Value*>(b->outputs().begin(), b->outputs().end());
  };
  t.Add(std::move(fwd));

  OpDef bwd(op::kCallGraphBackward);
  bwd.num_inputs = -1;
  bwd.num_outputs = -1;
  bwd.outputs_from_attrs = [](const Attrs& a, int) {
    return static_cast<int>(GetGraphSignature(a.Int("graph_id")).inputs.size());
  };
  bwd.attrs = {{"graph_id", K::kInt, std::nullopt}};
  bwd.fusion = FusionKind::kOpaque;
  bwd.random = true;  // recomputes the forward: the same draws as the forward call
  bwd.random_numel = [](const Attrs& a) { return GetGraphSignature(a.Int("graph_id")).random_numel; };
  bwd.differentiable = false;
  bwd.doc = "gradients of every input of a compiled graph, given the gradients of its outputs";
  bwd.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    GraphSignature sig = GetGraphSignature(a.Int("graph_id"));
    CheckInputs(op, sig, in, sig.inputs.size() + sig.outputs.size());
    // After the forward inputs: saved outputs [k, n), then gradients of outputs [0, k).
    size_t n = sig.outputs.size(), k = sig.num_grad_outputs < 0 ? n : static_cast<size_t>(sig.num_grad_outputs);
    for (size_t j = 0; j < n; ++j) {
      size_t out = j < n - k ? k + j : j - (n - k);
      if (!(in[sig.inputs.size() + j] == sig.outputs[out]))
        KILN_THROW(ShapeError) << op.name << ": input " << sig.inputs.size() + j << " is "
                               << in[sig.inputs.size() + j].shape.str() << ", expected "
                               << sig.outputs[out].shape.str() << " (output " << out << " of the graph)";
    }
    return sig.inputs;
  };
  t.Add(std::move(bwd));
}

}  // namespace kiln::ir
