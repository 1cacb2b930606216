// Row groups of the plan (DESIGN.md section 9): the groups passes::FindRowGroups decides
// (passes/row_fusion.h: which reductions over which rows, with which elementwise producers and
// consumers) built here into a codegen::RowProgram and compiled into one row kernel, bound at the
// group's last node. The program reads the operands the group takes from outside (by how the group
// reads them), computes one step per row value in graph order with element values inlined into
// the expressions that read them, and writes the members read outside the group or returned.
//
// A group is refused (and runs unfused, its nodes free for later groups) when codegen cannot
// compile it, or when it is a column group that would only save the re-read of a value written
// anyway (OnePassOverWrittenValues).
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>

#include "kiln/passes/row_fusion.h"
#include "kiln/runtime/cpu/loops.h"
#include "fuse.h"

#if KILN_WITH_CODEGEN

namespace kiln::fusion {
namespace {

using codegen::Expr;
using codegen::RowProgram;
using passes::RowLevel;

RowProgram::Layout ToProgram(passes::RowLayout l) {
  switch (l) {
  case passes::RowLayout::kContiguous: return RowProgram::kContiguous;
  case passes::RowLayout::kStrided: return RowProgram::kStrided;
  case passes::RowLayout::kColumns: return RowProgram::kColumns;
  }
  return RowProgram::kContiguous;
}

RowProgram::InputKind ToProgram(passes::RowRead r) {
  switch (r) {
  case passes::RowRead::kElement: return RowProgram::kElement;
  case passes::RowRead::kRow: return RowProgram::kRow;
  case passes::RowRead::kColumn: return RowProgram::kColumn;
  case passes::RowRead::kScalar: return RowProgram::kScalar;
  case passes::RowRead::kOneHot: return RowProgram::kOneHot;
  case passes::RowRead::kOneHot32: return RowProgram::kOneHot32;
  }
  return RowProgram::kElement;
}

RowProgram::StepKind ToProgram(passes::RowReduce r) {
  switch (r) {
  case passes::RowReduce::kSum: return RowProgram::kSum;
  case passes::RowReduce::kMean: return RowProgram::kMean;
  case passes::RowReduce::kMax: return RowProgram::kMax;
  case passes::RowReduce::kMin: return RowProgram::kMin;
  }
  return RowProgram::kSum;
}

// A column group that reads the elements once and computes no element value it does not write
// anyway (the bias gradient's sum of a relu-masked gradient the weight gradient also reads) saves
// only the reduce kernel's re-read, and runs slower fused: its loop across a few columns costs
// more per element (measured: the sum over (0,) of a written x * m, (4096, 64) 0.85x, (256, 10)
// 0.95x).
bool OnePassOverWrittenValues(const RowProgram& p, const std::vector<int>& members,
                              const std::vector<int>& materialized,
                              const std::function<RowLevel(int)>& level_of) {
  int passes = 0;
  for (const RowProgram::Step& s : p.steps) passes += s.kind != RowProgram::kPerRow;
  for (size_t k = 0; k < p.outputs.size(); ++k) {
    const RowProgram::Output& o = p.outputs[k];
    const bool own_stash = o.expr.nodes.size() == 1 && o.expr.nodes[0].kind == codegen::Expr::Kind::kInput &&
                           o.expr.nodes[0].input == static_cast<int>(p.inputs.size() + p.steps.size() + k);
    if (o.row_value < 0 && !own_stash) { // a pass that writes element values (row.cc skips own stashes)
      ++passes;
      break;
    }
  }
  if (passes > 1) return false;
  for (int m : members)
    if (level_of(m) == RowLevel::kElement && !std::count(materialized.begin(), materialized.end(), m))
      return false;
  return true;
}

} // namespace

void FuseRows(const ir::Graph& graph, const std::vector<bool>& live, Plan* p, std::vector<bool>* claimed) {
  const size_t n_nodes = graph.nodes().size();
  std::vector<std::vector<int>> readers(n_nodes);
  for (size_t i = 0; i < n_nodes; ++i)
    if (live[i])
      for (const ir::Value* v : graph.nodes()[i]->inputs())
        if (v->node()) readers[static_cast<size_t>(v->node()->id())].push_back(static_cast<int>(i));
  std::vector<bool> is_output(n_nodes, false);
  for (const ir::Value* v : graph.outputs())
    if (v->node()) is_output[static_cast<size_t>(v->node()->id())] = true;

  // Builds and compiles each group the pass finds; a group refused here runs unfused, and its
  // nodes stay free for the groups seeded after it.
  auto build = [&](const passes::RowGroup& b) -> bool {
    const std::vector<int>& members = b.members;
    // The program: operands first (arrays, by value and how they are read), then one step per row
    // value in graph order, element values inlined into the expressions that read them.
    RowProgram prog;
    prog.layout = ToProgram(b.layout);
    auto fused = std::make_unique<Plan::Fused>();
    std::map<std::pair<const ir::Value*, passes::RowRead>, int> array;
    std::unordered_map<const ir::Value*, int> step_of;
    auto level_of = [&](int i) {
      const ir::Value* o = graph.nodes()[static_cast<size_t>(i)]->output();
      return b.LevelOf(o);
    };
    for (int m : members) {
      const ir::Node& n = *graph.nodes()[static_cast<size_t>(m)];
      RowLevel level = b.ReductionOf(m) ? RowLevel::kElement : level_of(m); // a reduction reads elements
      if (auto kind = b.OneHot(n)) {                                        // its labels
        if (array.emplace(std::pair(n.input(0), *kind), static_cast<int>(fused->inputs.size())).second) {
          fused->inputs.push_back(n.input(0));
          prog.inputs.push_back(ToProgram(*kind));
        }
        continue;
      }
      for (const ir::Value* w : n.inputs()) {
        if (b.IsMemberValue(w) || ScalarConst(w)) continue;
        auto kind = *b.ExternalRead(w, level, level == RowLevel::kElement ? b.full : n.output()->shape());
        if (array.emplace(std::pair(w, kind), static_cast<int>(fused->inputs.size())).second) {
          fused->inputs.push_back(w);
          prog.inputs.push_back(ToProgram(kind));
        }
      }
    }
    const int n_in = static_cast<int>(prog.inputs.size());
    // The element value stashed by the last reduction into an output's array (its own, when it is
    // materialized): outputs then read it instead of computing it again. Set once the steps are.
    const ir::Value* stashed = nullptr;
    int stash_input = -1;
    // Emits value v into e (memoized per expression) as read at `level`.
    std::function<int(Expr&, std::unordered_map<const ir::Value*, int>&, const ir::Value*, RowLevel)> emit =
        [&](Expr& e, std::unordered_map<const ir::Value*, int>& at, const ir::Value* v,
            RowLevel level) -> int {
      if (auto it = at.find(v); it != at.end()) return it->second;
      int k;
      if (auto c = ScalarConst(v)) {
        k = e.Const(*c);
      } else if (v == stashed) {
        k = e.Input(stash_input);
      } else if (!b.IsMemberValue(v)) {
        auto kind = *b.ExternalRead(v, level, level == RowLevel::kElement ? b.full : v->shape());
        k = e.Input(array.at({v, kind}));
      } else if (b.LevelOf(v) == RowLevel::kRow) {
        k = e.Input(n_in + step_of.at(v));
      } else if (auto kind = b.OneHot(*v->node())) {
        k = e.Input(array.at({v->node()->input(0), *kind}));
      } else if (b.IsBroadcast(*v->node())) {
        k = emit(e, at, v->node()->input(0), level);
      } else {
        const ir::Node& n = *v->node();
        const ir::OpDef& d = n.def();
        k = d.unary_fn
                ? e.Unary(*d.unary_fn, emit(e, at, n.input(0), level))
                : e.Binary(*d.binary_fn, emit(e, at, n.input(0), level), emit(e, at, n.input(1), level));
      }
      at.emplace(v, k);
      return k;
    };
    // Row values in graph order: reductions, and per-row ops on them.
    for (int m : members) {
      const ir::Node& n = *graph.nodes()[static_cast<size_t>(m)];
      if (level_of(m) != RowLevel::kRow) continue;
      Expr e;
      std::unordered_map<const ir::Value*, int> at;
      RowProgram::StepKind kind = RowProgram::kPerRow;
      if (auto r = b.ReductionOf(m)) {
        kind = ToProgram(*r);
        emit(e, at, n.input(0), RowLevel::kElement);
      } else if ((n.def().unary_fn == UnaryFn::kIdentity || passes::KeepsRowOrder(n)) &&
                 b.IsMemberValue(n.input(0))) {
        step_of[n.output()] = step_of.at(n.input(0)); // stop_gradient, reshape: the same row value
        continue;
      } else {
        const ir::OpDef& d = n.def();
        // Row values and kRow arrays read in a per-row step: the same index r whatever their shape.
        auto operand = [&](const ir::Value* w) {
          if (auto it = at.find(w); it != at.end()) return it->second;
          int k;
          if (auto c = ScalarConst(w))
            k = e.Const(*c);
          else if (b.IsMemberValue(w))
            k = e.Input(n_in + step_of.at(w));
          else
            k = e.Input(array.at({w, *b.ExternalRead(w, RowLevel::kRow, n.output()->shape())}));
          at.emplace(w, k);
          return k;
        };
        if (d.unary_fn)
          e.Unary(*d.unary_fn, operand(n.input(0)));
        else
          e.Binary(*d.binary_fn, operand(n.input(0)), operand(n.input(1)));
      }
      step_of[n.output()] = static_cast<int>(prog.steps.size());
      prog.AddReduce(kind, std::move(e));
    }
    std::vector<int> materialized; // graph outputs and values read outside
    for (int m : members) {
      bool outside = is_output[static_cast<size_t>(m)];
      for (int r : readers[static_cast<size_t>(m)])
        outside |= !std::binary_search(members.begin(), members.end(), r);
      if (outside) materialized.push_back(m);
    }
    // The stash: the operand of the last reduction whose operand is an element member read by
    // other members or outside (cross-entropy's exp(x - max), also saved for the backward).
    for (auto it = members.rbegin(); it != members.rend() && !stashed; ++it) {
      if (!b.ReductionOf(*it)) continue;
      const ir::Value* x = graph.nodes()[static_cast<size_t>(*it)]->input(0);
      const size_t xi = static_cast<size_t>(x->node() ? x->node()->id() : 0);
      if (!b.IsMemberValue(x) || b.LevelOf(x) != RowLevel::kElement ||
          (readers[xi].size() < 2 && !is_output[xi]))
        continue;
      int into = -1;
      for (size_t k = 0; k < materialized.size(); ++k) {
        if (level_of(materialized[k]) != RowLevel::kElement) continue;
        if (into < 0 || materialized[k] == x->node()->id()) into = static_cast<int>(k);
      }
      if (into < 0) break;
      stashed = x;
      stash_input = n_in + static_cast<int>(prog.steps.size()) + into;
      prog.steps[static_cast<size_t>(step_of.at(graph.nodes()[static_cast<size_t>(*it)]->output()))].stash =
          into;
    }
    for (int m : materialized) {
      const ir::Value* v = graph.nodes()[static_cast<size_t>(m)]->output();
      fused->outputs.push_back(v);
      if (level_of(m) == RowLevel::kRow) {
        prog.AddRowOutput(step_of.at(v));
      } else {
        Expr e;
        std::unordered_map<const ir::Value*, int> at;
        emit(e, at, v, RowLevel::kElement);
        prog.AddOutput(std::move(e));
      }
    }
    if (prog.layout == RowProgram::kColumns &&
        OnePassOverWrittenValues(prog, members, materialized, level_of))
      return false; // runs unfused
    // The time this build spent getting the kernel (compiled, loaded from disk or found in memory;
    // the kernel's own compile_ms is when it was first compiled, which several groups may share).
    const auto t0 = std::chrono::steady_clock::now();
    try {
      fused->row_kernel = codegen::CompileRow(prog);
    } catch (const codegen::UnsupportedError&) {
      p->report.codegen_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return false; // runs unfused
    }
    p->report.codegen_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (prog.layout == RowProgram::kStrided) fused->row_kernel = fused->row_kernel->Bind(b.inner);
    fused->rows = b.rows, fused->len = b.len;
    PlanReport::Group& r = p->report.groups.emplace_back();
    for (int m : members) r.ops.push_back(graph.nodes()[static_cast<size_t>(m)]->def().name);
    r.num_inputs = static_cast<int>(fused->inputs.size());
    r.expr =
        fused->row_kernel->text() + "  (rows " + std::to_string(b.rows) + " x " + std::to_string(b.len) + ")";
    r.compile_ms = fused->row_kernel->compile_ms();
    fused->members.assign(members.begin(), members.end());
    p->fused[static_cast<size_t>(members.back())] = std::move(fused);
    for (size_t k = 0; k + 1 < members.size(); ++k) p->fused_member[static_cast<size_t>(members[k])] = true;
    ++p->num_fused_groups;
    p->num_fused_nodes += static_cast<int>(members.size());
    return true;
  };
  passes::RowFusionOptions options;
  options.num_threads = host::NumThreads();
  options.accept = build;
  passes::FindRowGroups(graph, live, claimed, options);
}

} // namespace kiln::fusion

#endif // KILN_WITH_CODEGEN
