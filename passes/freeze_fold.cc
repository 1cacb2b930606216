// Freeze folding (see freeze_fold.h). A value is constant when it is a graph input declared
// constant, a `full` fill, or an output of a folded node. A node folds when it is live, not
// random (call_graph counts as random: it may draw), all its inputs are constant, at least one
// is not a fill (fill-only nodes are constant_fold's), and its outputs hold no more elements than
// its non-fill inputs together: a broadcast stays in the graph, because reading a larger constant
// on every call costs more than broadcasting it. The evaluator runs the fold; a node it cannot
// run stays, reading its constants as inputs.
//
// The result's inputs: the old non-constant inputs in their order, then the constants that the
// remaining nodes or the outputs read (declared inputs in their order, then folded values in node
// order, named folded0, folded1...). A constant nothing reads any more is not an input, so the
// caller neither keeps it nor passes it. Only nodes the outputs still need are kept, so what
// folding leaves dead is gone without a DCE. Equal constants are not merged.
#include <string>
#include <unordered_set>

#include "kiln/passes/dce.h"
#include "kiln/passes/freeze_fold.h"
#include "kiln/runtime/error.h"

namespace kiln::passes {

namespace {

bool IsFill(const ir::Value* v) {
  return v->node() && v->node()->op() == ir::op::kFull;
}

int64_t Bytes(const ir::Value* v) { return v->shape().numel() * static_cast<int64_t>(DTypeSize(v->dtype())); }

}  // namespace

bool RunFreezeFold(std::unique_ptr<ir::Graph>& g, const FreezeOptions& options, FreezeResult* result) {
  const ir::Graph& old = *g;
  KILN_CHECK(options.constants.size() == old.inputs().size())
      << "freeze_fold: " << options.constants.size() << " constant entries for " << old.inputs().size()
      << " graph inputs";
  FreezeResult r;
  // The handle of each constant value, by value id (-1: none; a fill gets one when a fold reads it).
  std::vector<int> handle(static_cast<size_t>(old.num_values()), -1);
  for (size_t i = 0; i < old.inputs().size(); ++i)
    if (options.constants[i] >= 0) handle[old.inputs()[i]->id()] = options.constants[i], ++r.inputs_frozen;

  // Fold, in node order (a topological order), so a node sees its folded producers.
  const std::vector<bool> live = LiveNodes(old, old.outputs());
  for (const auto& n : old.nodes()) {
    if (!options.evaluator || !live[static_cast<size_t>(n->id())] || n->def().random) continue;
    bool constant = true;
    int64_t data_numel = 0, out_numel = 0;
    for (const ir::Value* v : n->inputs()) {
      if (handle[v->id()] >= 0) data_numel += v->shape().numel();
      else constant &= IsFill(v);
    }
    for (const ir::Value* v : n->outputs()) out_numel += v->shape().numel();
    if (!constant || data_numel == 0 || out_numel > data_numel) continue;
    std::vector<int> in;
    for (const ir::Value* v : n->inputs()) {
      int h = handle[v->id()];
      if (h < 0) {  // a fill: materialized once, when a fold first reads it
        std::optional<std::vector<int>> fill = options.evaluator->Evaluate(*v->node(), {});
        if (!fill) break;
        h = handle[v->id()] = fill->at(0);
      }
      in.push_back(h);
    }
    if (in.size() != n->inputs().size()) continue;
    std::optional<std::vector<int>> out = options.evaluator->Evaluate(*n, in);
    if (!out) continue;
    KILN_CHECK(out->size() == n->outputs().size())
        << "freeze_fold: the evaluator gave " << out->size() << " constants for the " << n->outputs().size()
        << " outputs of " << n->def().name;
    for (size_t k = 0; k < out->size(); ++k) handle[n->output(static_cast<int>(k))->id()] = (*out)[k];
    ++r.nodes_folded;
  }

  // What the outputs still need: walking back from them, stopping at constants other than fills.
  std::vector<bool> keep(old.nodes().size(), false), read(static_cast<size_t>(old.num_values()), false);
  std::vector<const ir::Value*> stack(old.outputs().begin(), old.outputs().end());
  while (!stack.empty()) {
    const ir::Value* v = stack.back();
    stack.pop_back();
    if (read[v->id()]) continue;
    read[v->id()] = true;
    if (handle[v->id()] >= 0 && !IsFill(v)) continue;  // a constant input of the new graph
    if (!v->node() || keep[static_cast<size_t>(v->node()->id())]) continue;
    keep[static_cast<size_t>(v->node()->id())] = true;
    for (const ir::Value* w : v->node()->inputs()) stack.push_back(w);
  }

  // Rebuild: inputs, then the constants read, then the kept nodes.
  auto ng = std::make_unique<ir::Graph>();
  std::vector<ir::Value*> map(static_cast<size_t>(old.num_values()), nullptr);
  std::unordered_set<std::string> names;
  bool reordered = false, seen_constant = false;
  for (size_t i = 0; i < old.inputs().size(); ++i) {
    const ir::Value* v = old.inputs()[i];
    names.insert(v->name());
    if (options.constants[i] >= 0) {
      seen_constant = true;
      continue;
    }
    reordered |= seen_constant;
    map[v->id()] = ng->AddInput(v->name(), v->type());
  }
  auto add_constant = [&](const ir::Value* v, std::string name) {
    map[v->id()] = ng->AddInput(std::move(name), v->type());
    r.constants.push_back(handle[v->id()]);
    r.constant_bytes += Bytes(v);
  };
  bool dropped = false;
  for (size_t i = 0; i < old.inputs().size(); ++i) {
    const ir::Value* v = old.inputs()[i];
    if (options.constants[i] < 0) continue;
    if (read[v->id()]) add_constant(v, v->name());
    else dropped = true;
  }
  int next_name = 0;
  for (const auto& n : old.nodes())
    for (const ir::Value* v : n->outputs())
      if (read[v->id()] && handle[v->id()] >= 0 && !IsFill(v)) {
        std::string name;
        do name = "folded" + std::to_string(next_name++);
        while (names.count(name));
        names.insert(name);
        add_constant(v, std::move(name));
      }
  size_t kept = 0;
  for (const auto& n : old.nodes()) {
    if (!keep[static_cast<size_t>(n->id())]) continue;
    ++kept;
    std::vector<ir::Value*> in;
    for (const ir::Value* v : n->inputs()) in.push_back(map[v->id()]);
    ir::Node* c = ng->AddNode(n->op(), std::move(in), n->attrs());
    for (size_t k = 0; k < n->outputs().size(); ++k)
      map[n->output(static_cast<int>(k))->id()] = c->output(static_cast<int>(k));
  }
  std::vector<ir::Value*> outs;
  for (const ir::Value* v : old.outputs()) outs.push_back(map[v->id()]);
  ng->SetOutputs(std::move(outs));

  if (result) *result = r;
  if (r.nodes_folded == 0 && !dropped && !reordered && kept == old.nodes().size()) return false;
  g = std::move(ng);
  return true;
}

}  // namespace kiln::passes
