// Row groups of the fusion step (DESIGN.md section 9): a float32 reduction over the trailing axes
// of a tensor (sum, mean, max, min with keepdims; ops of fusion kind kReduce), grown backwards by
// its elementwise producers and forwards by its elementwise consumers, per-row ops on reduced
// values and chained reductions over the same rows, becomes one codegen::RowKernel. Softmax and
// log-softmax over the last axis are one group each: max -> sub -> exp -> sum -> log/div -> sub.
//
// Every value of the group lives at one of two levels: per element (the tensor's shape S, viewed
// as rows x len) or per row (numel rows, such as a keepdims reduction). Members may be read
// outside the group: their values are then written by the kernel (materialized), as are graph
// outputs; the kernel runs at the group's last node, so such readers must come after it (a group
// is cut back until they do), and no operand of the group may depend on the group.
//
// Not here: reductions over leading or middle axes, or without keepdims (they run unfused), and
// GPUs (the caller fuses only on CPU). Very long rows in few rows stay unfused: the kernel splits
// work by rows only.
#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>

#include "plan.h"

#if KILN_WITH_CODEGEN

namespace kiln::fusion {
namespace {

using codegen::Expr;
using codegen::RowProgram;

enum class Level : uint8_t { kElement, kRow };

// The reduction a node computes, when it is one a row kernel can take: a float32 sum, mean, max
// or min with keepdims over axes k..rank-1 of its input, k < rank. Sets the row length.
std::optional<RowProgram::StepKind> RowReduction(const ir::Node& n, int64_t* len) {
  const ir::OpDef& d = n.def();
  if (d.fusion != ir::FusionKind::kReduce || n.inputs().size() != 1 || n.outputs().size() != 1)
    return std::nullopt;
  // The op table has no typed reduction function for these four; their names are their kinds.
  static const std::map<std::string, RowProgram::StepKind> kinds = {{"sum", RowProgram::kSum},
                                                                    {"mean", RowProgram::kMean},
                                                                    {"max", RowProgram::kMax},
                                                                    {"min", RowProgram::kMin}};
  auto kind = kinds.find(d.name);
  if (kind == kinds.end()) return std::nullopt;
  const ir::Value* x = n.input(0);
  const int rank = x->shape().rank();
  if (x->dtype() != DType::kFloat32 || n.output()->dtype() != DType::kFloat32 || rank == 0 ||
      !n.attrs().Bool("keepdims"))
    return std::nullopt;
  std::vector<int> axes;
  for (int64_t a : n.attrs().Ints("axes")) axes.push_back(static_cast<int>(a < 0 ? a + rank : a));
  if (axes.empty())
    for (int a = 0; a < rank; ++a) axes.push_back(a);
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  if (axes.front() < 0 || axes.back() != rank - 1 ||
      axes.back() - axes.front() + 1 != static_cast<int>(axes.size()))
    return std::nullopt; // not the trailing axes
  *len = 1;
  for (int a : axes) *len *= x->shape()[a];
  return kind->second;
}

class RowGroupBuilder {
public:
  RowGroupBuilder(const ir::Graph& g, const std::vector<bool>& live, const std::vector<bool>& claimed,
                  const std::vector<std::vector<int>>& readers)
      : g_(g), live_(live), claimed_(claimed), readers_(readers), member_(g.nodes().size(), false),
        tainted_(g.nodes().size(), false) {}

  /// Grows the group of reduction node `seed`; returns its members in order (empty: no group).
  std::vector<int> Grow(int seed, int64_t len, RowProgram::StepKind kind) {
    const ir::Node& red = *g_.nodes()[static_cast<size_t>(seed)];
    full_ = red.input(0)->shape();
    len_ = len;
    rows_ = len == 0 ? 0 : full_.numel() / len;
    if (rows_ == 0 || (len_ > (1 << 16) && rows_ < 64)) return {}; // empty, or too few rows to split
    Admit(seed, Level::kRow);
    reduction_[seed] = kind;
    GrowProducers(red.input(0));
    const int first = members_.empty() ? seed : *std::min_element(members_.begin(), members_.end());
    for (int i = first; i < static_cast<int>(g_.nodes().size()); ++i) {
      if (i > seed && !member_[i] && Consumer(i)) continue; // admitted (tainted as a member)
      if (!member_[i]) tainted_[i] = DependsOnGroup(*g_.nodes()[static_cast<size_t>(i)]);
    }
    CutBack(seed);
    std::vector<int> m = members_;
    std::sort(m.begin(), m.end());
    bool has_reduction = false;
    for (int i : m) has_reduction |= static_cast<bool>(reduction_.count(i));
    if (m.size() < 2 || !has_reduction || !Acyclic()) return {};
    return m;
  }

  const Shape& full() const { return full_; }
  int64_t rows() const { return rows_; }
  int64_t len() const { return len_; }
  Level LevelOf(const ir::Value* v) const { return level_.at(v); }
  bool IsMemberValue(const ir::Value* v) const {
    return v->node() && member_[static_cast<size_t>(v->node()->id())];
  }
  std::optional<RowProgram::StepKind> ReductionOf(int i) const {
    auto it = reduction_.find(i);
    return it == reduction_.end() ? std::nullopt : std::optional(it->second);
  }

  /// How an external operand `w` of a node at `level` is read, or nullopt when it cannot be.
  std::optional<RowProgram::InputKind> ExternalKind(const ir::Value* w, Level level, const Shape& out) const {
    if (w->dtype() != DType::kFloat32) return std::nullopt;
    if (w->shape().numel() == 1) return RowProgram::kScalar;
    if (level == Level::kRow) {
      if (w->shape().numel() == rows_ && BroadcastIndex(w->shape(), out)) return RowProgram::kRow;
      return std::nullopt;
    }
    auto b = BroadcastIndex(w->shape(), full_);
    if (!b) return std::nullopt;
    if (b->second == 0) return RowProgram::kElement;
    if (b->first == len_ && b->second == rows_) return RowProgram::kRow;
    if (b->first == 1 && b->second == len_) return RowProgram::kColumn;
    return std::nullopt;
  }

private:
  void Admit(int i, Level level) {
    member_[static_cast<size_t>(i)] = true;
    tainted_[static_cast<size_t>(i)] = true;
    members_.push_back(i);
    level_[g_.nodes()[static_cast<size_t>(i)]->output()] = level;
  }
  void Drop(int i) {
    member_[static_cast<size_t>(i)] = false;
    members_.erase(std::find(members_.begin(), members_.end(), i));
    reduction_.erase(i);
  }

  bool Available(int i) const {
    return live_[static_cast<size_t>(i)] && !claimed_[static_cast<size_t>(i)] &&
           !member_[static_cast<size_t>(i)];
  }

  // A member value of level `from` read by a node at `level`: element values only by element
  // nodes; row values by row nodes, and by element nodes when they broadcast along the row.
  bool ReadsMember(const ir::Value* w, Level level) const {
    Level from = level_.at(w);
    if (from == Level::kElement) return level == Level::kElement;
    if (level == Level::kRow) return true;
    auto b = BroadcastIndex(w->shape(), full_);
    return b && ((b->second == 0 && len_ == 1) || (b->first == len_ && b->second == rows_) ||
                 (b->second == 1 && rows_ == 1));
  }

  // Every operand of elementwise node `n` at `level` can be read; with `need_member`, one is a member value.
  bool OperandsOk(const ir::Node& n, Level level, bool need_member) const {
    bool any_member = false;
    for (const ir::Value* w : n.inputs()) {
      if (ScalarConst(w)) continue;
      if (IsMemberValue(w)) {
        if (!ReadsMember(w, level)) return false;
        any_member = true;
      } else if (!ExternalKind(w, level, n.output()->shape()) ||
                 (w->node() && tainted_[static_cast<size_t>(w->node()->id())])) {
        return false;
      }
    }
    return any_member || !need_member;
  }

  void GrowProducers(const ir::Value* v) {
    const ir::Node* n = v->node();
    if (!n || v->shape() != full_ || ScalarConst(v) || !Available(n->id()) || !Fusable(*n)) return;
    if (!OperandsOk(*n, Level::kElement, false)) return;
    Admit(n->id(), Level::kElement);
    producers_.push_back(n->id());
    for (const ir::Value* w : n->inputs()) GrowProducers(w);
  }

  // Admits node i as a consumer when it reads the group and fits: true if admitted.
  bool Consumer(int i) {
    if (!Available(i)) return false;
    const ir::Node& n = *g_.nodes()[static_cast<size_t>(i)];
    int64_t len = 0;
    if (auto kind = RowReduction(n, &len)) { // a chained reduction over the same rows
      const ir::Value* x = n.input(0);
      if (len != len_ || x->shape() != full_ || !IsMemberValue(x) || level_.at(x) != Level::kElement)
        return false;
      Admit(i, Level::kRow);
      reduction_[i] = *kind;
      return true;
    }
    if (!Fusable(n)) return false;
    const Shape& out = n.output()->shape();
    Level level = out == full_ ? Level::kElement : Level::kRow;
    if (level == Level::kRow && out.numel() != rows_) return false;
    if (!OperandsOk(n, level, true)) return false;
    Admit(i, level);
    return true;
  }

  bool DependsOnGroup(const ir::Node& n) const {
    for (const ir::Value* w : n.inputs())
      if (w->node() && tainted_[static_cast<size_t>(w->node()->id())]) return true;
    return false;
  }

  // A materialized member value read outside the group before the kernel runs (at the last
  // member): a producer is dropped (its value becomes an operand), else the group is cut back to
  // the members before that reader. Repeats until no such reader remains.
  void CutBack(int seed) {
    for (bool changed = true; changed;) {
      changed = false;
      const int root = *std::max_element(members_.begin(), members_.end());
      for (int m : std::vector<int>(members_)) {
        for (int r : readers_[static_cast<size_t>(m)]) {
          if (member_[static_cast<size_t>(r)] || r > root) continue;
          if (m < seed)
            Drop(m);
          else
            for (int k : std::vector<int>(members_))
              if (k > r) Drop(k);
          changed = true;
          break;
        }
        if (changed) break;
      }
    }
  }

  // No operand of a member depends on a member through a node outside the group.
  bool Acyclic() const {
    std::vector<bool> t(g_.nodes().size(), false);
    for (size_t i = 0; i < g_.nodes().size(); ++i) {
      if (member_[i]) t[i] = true;
      bool reads_tainted = false;
      for (const ir::Value* w : g_.nodes()[i]->inputs())
        if (w->node() && t[static_cast<size_t>(w->node()->id())] &&
            !member_[static_cast<size_t>(w->node()->id())])
          reads_tainted = true;
      if (member_[i] && reads_tainted) return false;
      if (!member_[i])
        for (const ir::Value* w : g_.nodes()[i]->inputs())
          if (w->node() && t[static_cast<size_t>(w->node()->id())]) t[i] = true;
    }
    return true;
  }

  const ir::Graph& g_;
  const std::vector<bool>& live_;
  const std::vector<bool>& claimed_;
  const std::vector<std::vector<int>>& readers_;
  std::vector<bool> member_, tainted_;
  std::vector<int> members_, producers_;
  std::unordered_map<const ir::Value*, Level> level_;
  std::unordered_map<int, RowProgram::StepKind> reduction_;
  Shape full_;
  int64_t rows_ = 0, len_ = 0;
};

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

  for (size_t seed = 0; seed < n_nodes; ++seed) {
    int64_t len = 0;
    if (!live[seed] || (*claimed)[seed]) continue;
    auto seed_kind = RowReduction(*graph.nodes()[seed], &len);
    if (!seed_kind) continue;
    RowGroupBuilder b(graph, live, *claimed, readers);
    std::vector<int> members = b.Grow(static_cast<int>(seed), len, *seed_kind);
    if (members.empty()) continue;

    // The program: operands first (arrays, by value and how they are read), then one step per row
    // value in graph order, element values inlined into the expressions that read them.
    RowProgram prog;
    auto fused = std::make_unique<Plan::Fused>();
    std::map<std::pair<const ir::Value*, RowProgram::InputKind>, int> array;
    std::unordered_map<const ir::Value*, int> step_of;
    auto level_of = [&](int i) {
      const ir::Value* o = graph.nodes()[static_cast<size_t>(i)]->output();
      return b.LevelOf(o);
    };
    for (int m : members) {
      const ir::Node& n = *graph.nodes()[static_cast<size_t>(m)];
      Level level = b.ReductionOf(m) ? Level::kElement : level_of(m); // a reduction reads elements
      for (const ir::Value* w : n.inputs()) {
        if (b.IsMemberValue(w) || ScalarConst(w)) continue;
        auto kind = *b.ExternalKind(w, level, level == Level::kElement ? b.full() : n.output()->shape());
        if (array.emplace(std::pair(w, kind), static_cast<int>(fused->inputs.size())).second) {
          fused->inputs.push_back(w);
          prog.inputs.push_back(kind);
        }
      }
    }
    const int n_in = static_cast<int>(prog.inputs.size());
    // The element value stashed by the last reduction into an output's array (its own, when it is
    // materialized): outputs then read it instead of computing it again. Set once the steps are.
    const ir::Value* stashed = nullptr;
    int stash_input = -1;
    // Emits value v into e (memoized per expression) as read at `level`.
    std::function<int(Expr&, std::unordered_map<const ir::Value*, int>&, const ir::Value*, Level)> emit =
        [&](Expr& e, std::unordered_map<const ir::Value*, int>& at, const ir::Value* v, Level level) -> int {
      if (auto it = at.find(v); it != at.end()) return it->second;
      int k;
      if (auto c = ScalarConst(v)) {
        k = e.Const(*c);
      } else if (v == stashed) {
        k = e.Input(stash_input);
      } else if (!b.IsMemberValue(v)) {
        auto kind = *b.ExternalKind(v, level, level == Level::kElement ? b.full() : v->shape());
        k = e.Input(array.at({v, kind}));
      } else if (b.LevelOf(v) == Level::kRow) {
        k = e.Input(n_in + step_of.at(v));
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
      if (level_of(m) != Level::kRow) continue;
      Expr e;
      std::unordered_map<const ir::Value*, int> at;
      RowProgram::StepKind kind = RowProgram::kPerRow;
      if (auto r = b.ReductionOf(m)) {
        kind = *r;
        emit(e, at, n.input(0), Level::kElement);
      } else if (n.def().unary_fn == UnaryFn::kIdentity && b.IsMemberValue(n.input(0))) {
        step_of[n.output()] = step_of.at(n.input(0)); // stop_gradient: the same row value
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
            k = e.Input(array.at({w, *b.ExternalKind(w, Level::kRow, n.output()->shape())}));
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
    // The stash: the last reduction's operand when it is an element member that other members read.
    for (auto it = members.rbegin(); it != members.rend() && !stashed; ++it) {
      if (!b.ReductionOf(*it)) continue;
      const ir::Value* x = graph.nodes()[static_cast<size_t>(*it)]->input(0);
      const size_t xi = static_cast<size_t>(x->node() ? x->node()->id() : 0);
      if (!b.IsMemberValue(x) || b.LevelOf(x) != Level::kElement ||
          (readers[xi].size() < 2 && !is_output[xi]))
        break;
      int into = -1;
      for (size_t k = 0; k < materialized.size(); ++k) {
        if (level_of(materialized[k]) != Level::kElement) continue;
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
      if (level_of(m) == Level::kRow) {
        prog.AddRowOutput(step_of.at(v));
      } else {
        Expr e;
        std::unordered_map<const ir::Value*, int> at;
        emit(e, at, v, Level::kElement);
        prog.AddOutput(std::move(e));
      }
    }
    try {
      fused->row_kernel = codegen::CompileRow(prog);
    } catch (const codegen::UnsupportedError&) {
      continue; // runs unfused
    }
    fused->rows = b.rows(), fused->len = b.len();
    p->report.codegen_ms += fused->row_kernel->compile_ms();
    CompileReport::Group& r = p->report.groups.emplace_back();
    for (int m : members) r.ops.push_back(graph.nodes()[static_cast<size_t>(m)]->def().name);
    r.num_inputs = static_cast<int>(fused->inputs.size());
    r.expr = fused->row_kernel->text() + "  (rows " + std::to_string(b.rows()) + " x " +
             std::to_string(b.len()) + ")";
    r.compile_ms = fused->row_kernel->compile_ms();
    p->fused[static_cast<size_t>(members.back())] = std::move(fused);
    for (int m : members) (*claimed)[static_cast<size_t>(m)] = true;
    for (size_t k = 0; k + 1 < members.size(); ++k) p->fused_member[static_cast<size_t>(members[k])] = true;
    ++p->num_fused_groups;
    p->num_fused_nodes += static_cast<int>(members.size());
  }
}

} // namespace kiln::fusion

#endif // KILN_WITH_CODEGEN
