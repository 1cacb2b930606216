// Row fusion (DESIGN.md section 9; the decisions only, over the graph: building and compiling a
// group's kernel is the plan builder's, codegen/plan/fuse_rows.cc): a float32 reduction (sum, mean, max, min;
// ops of fusion kind kReduce) over the trailing axes of a tensor, or over leading and trailing
// axes around one kept block (batch-norm statistics over (0, 2, 3) of NCHW: one row per channel;
// a sum over (0,) of a matrix: one row per column),
// grown backwards by its elementwise producers and forwards by its elementwise consumers, per-row
// ops on reduced values and chained reductions over the same rows, becomes one
// row kernel. Softmax and log-softmax over the last axis are one group each: max -> sub ->
// exp -> sum -> log/div -> sub; cross-entropy adds its one_hot (read as labels), mul, sum and neg;
// batch norm's mean -> sub -> square -> mean -> rsqrt -> mul (and its backward's sums) are one
// strided group. broadcast_to to the whole shape is elementwise here, and reshapes of reduced
// values (numel rows) are the same row values. Sibling reductions over the same rows (batch
// norm's backward sums of dy and dy * x-hat) join one group: the kernel reads the rows once.
//
// Every value of the group lives at one of two levels: per element (the tensor's shape S, viewed
// as rows x len) or per row (numel rows, such as a reduction's result). Members may be read
// outside the group: their values are then written by the kernel (materialized), as are graph
// outputs; the kernel runs at the group's last node, so such readers must come after it (a
// producer is dropped, otherwise the group is cut back until they do), and no operand of the group
// may depend on the group.
//
// Not here: reductions over axes that are not leading and trailing around one block, or whose
// trailing reduced axes hold 2 to 7 elements (they run unfused), column groups that would only
// save the re-read of a value written anyway (the plan builder refuses them through
// RowFusionOptions::accept, as it does groups codegen cannot compile), the final reduction over
// the rows of a loss (another kernel), and GPUs (the caller fuses only on CPU). Very long rows in
// few rows stay unfused: the kernel splits work by rows only.
#include "kiln/passes/row_fusion.h"

#include <algorithm>
#include <memory>
#include <unordered_map>

#include "kiln/ir/op.h"
#include "kiln/passes/fusion.h"
#include "kiln/runtime/error.h"

namespace kiln::passes {
namespace {
using Level = RowLevel;

// A strided row is read in stretches of `inner` contiguous floats, vectorized within a stretch;
// with no trailing axis reduced (inner 1) the rows are columns, vectorized across adjacent rows
// instead (RowLayout::kColumns). Between the two, stretches of 2 to 7 floats run slower fused
// than unfused (measured: (0, 2) of (4096, 64, 4) 1.1x slower, of (2048, 64, 8) 1.8x faster).
constexpr int64_t kMinStretch = 8;

} // namespace

// The reduction a node computes, when it is one a row kernel can take: a float32 sum, mean, max
// or min (keepdims, or not unless to a scalar) over the trailing axes (contiguous rows), or over
// leading axes and the trailing ones after a kept block (strided rows: (0, 2, 3) of NCHW).
std::optional<RowShape> RowReduction(const ir::Node& n) {
  const ir::OpDef& d = n.def();
  if (d.fusion != ir::FusionKind::kReduce || n.inputs().size() != 1 || n.outputs().size() != 1)
    return std::nullopt;
  std::optional<RowReduce> kind;
  switch (n.op()) {
  case op::kSum: kind = RowReduce::kSum; break;
  case op::kMean: kind = RowReduce::kMean; break;
  case op::kMax: kind = RowReduce::kMax; break;
  case op::kMin: kind = RowReduce::kMin; break;
  default: return std::nullopt;
  }
  const ir::Value* x = n.input(0);
  const Shape& s = x->shape();
  const int rank = s.rank();
  if (x->dtype() != DType::kFloat32 || n.output()->dtype() != DType::kFloat32 || rank == 0)
    return std::nullopt;
  // A total reduction to a rank-0 scalar is left to the reduce kernel, which splits a long one
  // across threads (a row kernel runs one row on one thread).
  if (n.output()->shape().rank() == 0) return std::nullopt;
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  bool any = false;
  for (int64_t a : n.attrs().Ints("axes")) {
    int64_t b = a < 0 ? a + rank : a;
    if (b < 0 || b >= rank) return std::nullopt;
    reduced[static_cast<size_t>(b)] = any = true;
  }
  if (!any) reduced.assign(static_cast<size_t>(rank), true);
  int p = 0, q = rank; // reduced: [0, p) and [q, rank); kept: [p, q)
  while (p < rank && reduced[static_cast<size_t>(p)]) ++p;
  while (q > p && reduced[static_cast<size_t>(q - 1)]) --q;
  for (int a = p; a < q; ++a)
    if (reduced[static_cast<size_t>(a)]) return std::nullopt; // a reduced axis inside the kept block
  int64_t outer = 1, inner = 1;
  for (int a = 0; a < p && a < q; ++a) outer *= s[a];
  for (int a = q; a < rank; ++a) inner *= s[a];
  RowShape r;
  r.kind = *kind;
  if (p == q) { // every axis: one row
    r.len = r.inner = s.numel();
  } else if (outer == 1) { // no leading axis left to reduce: contiguous rows
    r.len = r.inner = inner;
  } else if (inner == 1) { // only leading axes: columns
    r.layout = RowLayout::kColumns;
    r.len = outer;
    r.inner = 1;
  } else if (inner < kMinStretch) {
    return std::nullopt; // the kernel would read a few floats per stretch
  } else {
    r.layout = RowLayout::kStrided;
    r.len = outer * inner;
    r.inner = inner;
  }
  return r;
}

namespace {
// The element values of `one_hot` over the rows: a float32 one-hot (1 on, 0 off) of depth len whose
// indices are one per row, read by a contiguous row kernel as labels (RowRead::kOneHot). Not one
// with labels=true: the kernel cannot raise its error for a label out of range.
std::optional<RowRead> OneHotLabels(const ir::Node& n, const Shape& full, int64_t rows, int64_t len,
                                    RowLayout layout) {
  if (n.op() != op::kOneHot || layout != RowLayout::kContiguous || n.output()->shape() != full ||
      n.output()->dtype() != DType::kFloat32 || n.attrs().Int("depth") != len ||
      n.attrs().Float("on_value") != 1.0 || n.attrs().Float("off_value") != 0.0 ||
      n.attrs().Bool("labels") || n.input(0)->shape().numel() != rows)
    return std::nullopt;
  if (n.input(0)->dtype() == DType::kInt64) return RowRead::kOneHot;
  if (n.input(0)->dtype() == DType::kInt32) return RowRead::kOneHot32;
  return std::nullopt;
}

} // namespace

// Ops that keep their input's elements in order (a row value keeps its rows through them).
bool KeepsRowOrder(const ir::Node& n) {
  const ir::OpId id = n.op();
  return (id == op::kReshape || id == op::kExpandDims || id == op::kSqueeze) && n.inputs().size() == 1 &&
         n.outputs().size() == 1;
}

bool RowGroup::IsMember(int i) const { return std::binary_search(members.begin(), members.end(), i); }

bool RowGroup::IsMemberValue(const ir::Value* v) const { return v->node() && IsMember(v->node()->id()); }

RowLevel RowGroup::LevelOf(const ir::Value* v) const {
  auto it = std::lower_bound(members.begin(), members.end(), v->node()->id());
  KILN_CHECK(it != members.end() && *it == v->node()->id())
      << "LevelOf: %" << v->id() << " is no member value";
  return levels[static_cast<size_t>(it - members.begin())];
}

std::optional<RowReduce> RowGroup::ReductionOf(int i) const {
  auto it = std::lower_bound(members.begin(), members.end(), i);
  if (it == members.end() || *it != i) return std::nullopt;
  return reduce[static_cast<size_t>(it - members.begin())];
}

std::optional<RowRead> RowGroup::OneHot(const ir::Node& n) const {
  return OneHotLabels(n, full, rows, len, layout);
}

bool RowGroup::IsBroadcast(const ir::Node& n) const {
  return n.op() == op::kBroadcastTo && n.inputs().size() == 1 && n.outputs().size() == 1 &&
         n.output()->shape() == full && n.output()->dtype() == DType::kFloat32 &&
         n.input(0)->dtype() == DType::kFloat32;
}

std::optional<RowRead> RowGroup::ExternalRead(const ir::Value* w, RowLevel level, const Shape& out) const {
  if (w->dtype() != DType::kFloat32) return std::nullopt;
  if (w->shape().numel() == 1) return RowRead::kScalar;
  if (level == RowLevel::kRow) {
    if (w->shape().numel() == rows && BroadcastIndex(w->shape(), out)) return RowRead::kRow;
    return std::nullopt;
  }
  // A row value broadcast along the tensor repeats every `stride` elements: len (contiguous) or
  // inner (strided).
  const int64_t stride = layout == RowLayout::kContiguous ? len : inner;
  auto b = BroadcastIndex(w->shape(), full);
  if (!b) return std::nullopt;
  if (b->second == 0) return RowRead::kElement;
  if (b->first == stride && b->second == rows) return RowRead::kRow;
  if (layout == RowLayout::kContiguous && b->first == 1 && b->second == len) return RowRead::kColumn;
  return std::nullopt;
}

namespace {
class RowGroupBuilder {
public:
  /// `wide`: also sibling reductions and consumers before the seed (what may close a cycle through
  /// outside nodes; the caller then grows again without).
  RowGroupBuilder(const ir::Graph& g, const std::vector<bool>& live, const std::vector<bool>& claimed,
                  const std::vector<std::vector<int>>& readers, bool wide, int num_threads)
      : g_(g), live_(live), claimed_(claimed), readers_(readers), wide_(wide), num_threads_(num_threads),
        member_(g.nodes().size(), false), tainted_(g.nodes().size(), false), leaf_(g.nodes().size(), false) {}

  /// Grows the group of reduction node `seed`; returns its members in order (empty: no group).
  std::vector<int> Grow(int seed, const RowShape& shape) {
    const ir::Node& red = *g_.nodes()[static_cast<size_t>(seed)];
    full_ = red.input(0)->shape();
    shape_ = shape;
    len_ = shape.len;
    // A row value broadcast along the tensor repeats every `stride_` elements: len (contiguous)
    // or inner (strided).
    stride_ = shape.layout == RowLayout::kContiguous ? len_ : shape.inner;
    rows_ = len_ == 0 ? 0 : full_.numel() / len_;
    geo_.layout = shape.layout, geo_.full = full_, geo_.rows = rows_, geo_.len = len_,
    geo_.inner = shape.inner;
    // Empty, or too few rows to split long ones across threads: the kernel splits by rows only.
    if (rows_ == 0 || (len_ > (1 << 16) && rows_ < std::min(64, 4 * num_threads_))) return {};
    Admit(seed, Level::kRow);
    reduction_[seed] = shape.kind;
    GrowProducers(red.input(0));
    // Sweeps until nothing more comes in: a sibling reduction's producers, taken in late, may be
    // read by nodes the sweep has passed.
    for (bool late = false, admitted = true; admitted; late = true) {
      admitted = false;
      const int first = *std::min_element(members_.begin(), members_.end());
      for (int i = first; i < static_cast<int>(g_.nodes().size()); ++i) {
        // A consumer may come before the seed too: it reads a producer, not the reduction.
        if (!member_[i] && (wide_ || i > seed) && Consumer(i, late)) {
          admitted = wide_; // tainted as a member
          continue;
        }
        if (!member_[i]) tainted_[i] = DependsOnGroup(*g_.nodes()[static_cast<size_t>(i)]);
      }
    }
    CutBack(seed);
    std::vector<int> m = members_;
    std::sort(m.begin(), m.end());
    bool has_reduction = false;
    for (int i : m) has_reduction |= static_cast<bool>(reduction_.count(i));
    if (m.size() < 2 || !has_reduction) return {};
    if (!Acyclic()) {
      cyclic_ = true;
      return {};
    }
    return m;
  }

  const Shape& full() const { return full_; }
  int64_t rows() const { return rows_; }
  int64_t len() const { return len_; }
  const RowShape& shape() const { return shape_; }
  /// The last Grow found no group because a member read a member through an outside node.
  bool cyclic() const { return cyclic_; }
  Level LevelOf(const ir::Value* v) const { return level_.at(v); }
  bool IsMemberValue(const ir::Value* v) const {
    return v->node() && member_[static_cast<size_t>(v->node()->id())];
  }
  std::optional<RowReduce> ReductionOf(int i) const {
    auto it = reduction_.find(i);
    return it == reduction_.end() ? std::nullopt : std::optional(it->second);
  }
  std::optional<RowRead> OneHot(const ir::Node& n) const { return geo_.OneHot(n); }
  bool IsBroadcast(const ir::Node& n) const { return geo_.IsBroadcast(n); }
  std::optional<RowRead> ExternalKind(const ir::Value* w, Level level, const Shape& out) const {
    return geo_.ExternalRead(w, level, out);
  }

  /// The group of `members` (what Grow returned), with each member's level and reduction.
  RowGroup Result(const std::vector<int>& members) const {
    RowGroup r = geo_;
    r.members = members;
    for (int m : members) {
      r.levels.push_back(level_.at(g_.nodes()[static_cast<size_t>(m)]->output()));
      r.reduce.push_back(ReductionOf(m));
    }
    return r;
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
    return b && ((b->second == 0 && len_ == 1) || (b->first == stride_ && b->second == rows_) ||
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

  // Elementwise in the kernel's terms: an op with a scalar function, or a broadcast to the whole shape.
  bool Elementwise(const ir::Node& n) const { return Fusable(n) || IsBroadcast(n); }

  // Admits the producers of element value `v` that the kernel can compute instead of reading:
  // elementwise ops over readable operands, and one-hot labels. They are leaves: when read
  // outside the group before the kernel runs, they are dropped again (CutBack).
  void GrowProducers(const ir::Value* v) {
    const ir::Node* n = v->node();
    if (!n || v->shape() != full_ || ScalarConst(v) || !Available(n->id())) return;
    if (OneHot(*n)) {
      if (n->input(0)->node() && tainted_[static_cast<size_t>(n->input(0)->node()->id())]) return;
      Admit(n->id(), Level::kElement);
      leaf_[static_cast<size_t>(n->id())] = true;
      return;
    }
    if (!Elementwise(*n) || !OperandsOk(*n, Level::kElement, false)) return;
    Admit(n->id(), Level::kElement);
    leaf_[static_cast<size_t>(n->id())] = true;
    for (const ir::Value* w : n->inputs()) GrowProducers(w);
  }

  // Admits node i as a consumer when it reads the group and fits: true if admitted. A `late` one
  // (a later sweep) may already be read by members, as an operand computed outside: only element
  // members may have read it, and only as an element value.
  bool Consumer(int i, bool late) {
    if (!Available(i)) return false;
    const ir::Node& n = *g_.nodes()[static_cast<size_t>(i)];
    if (late && !ReadOnlyAsElement(i)) return false;
    if (auto r = RowReduction(n)) { // a chained reduction over the same rows, or a sibling
      const ir::Value* x = n.input(0);
      if (r->layout != shape_.layout || r->len != len_ || r->inner != shape_.inner || x->shape() != full_)
        return false;
      if (!IsMemberValue(x)) {
        if (!wide_) return false;
        // A sibling reduction (of another value over the same rows): one kernel reads the rows
        // once for both. Its elementwise producers come in when they can.
        if (x->node() && tainted_[static_cast<size_t>(x->node()->id())]) return false;
        GrowProducers(x);
        if (!IsMemberValue(x) && ExternalKind(x, Level::kElement, full_) != RowRead::kElement) return false;
      } else if (level_.at(x) != Level::kElement) {
        return false;
      }
      Admit(i, Level::kRow);
      reduction_[i] = r->kind;
      return true;
    }
    if (KeepsRowOrder(n)) { // a row value in another shape
      const ir::Value* x = n.input(0);
      if (!IsMemberValue(x) || level_.at(x) != Level::kRow || n.output()->shape().numel() != rows_ ||
          n.output()->dtype() != DType::kFloat32)
        return false;
      Admit(i, Level::kRow);
      return true;
    }
    if (!Elementwise(n)) return false;
    const Shape& out = n.output()->shape();
    Level level = out == full_ ? Level::kElement : Level::kRow;
    if (level == Level::kRow && out.numel() != rows_) return false;
    if (!OperandsOk(n, level, true)) return false;
    Admit(i, level);
    // Element operands computed outside only for this group come in as producers.
    if (level == Level::kElement)
      for (const ir::Value* w : n.inputs())
        if (!IsMemberValue(w) && w->node() && w->node()->id() < i) GrowProducers(w);
    return true;
  }

  // Node i (not a member) is read by members only as an element value of the whole shape.
  bool ReadOnlyAsElement(int i) const {
    if (g_.nodes()[static_cast<size_t>(i)]->output()->shape() != full_) {
      for (int r : readers_[static_cast<size_t>(i)])
        if (member_[static_cast<size_t>(r)]) return false;
      return true;
    }
    for (int r : readers_[static_cast<size_t>(i)]) {
      if (!member_[static_cast<size_t>(r)] || reduction_.count(r)) continue;
      if (level_.at(g_.nodes()[static_cast<size_t>(r)]->output()) != Level::kElement) return false;
    }
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
          if (m < seed || leaf_[static_cast<size_t>(m)])
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
  const bool wide_;
  const int num_threads_;
  RowGroup geo_; // the geometry of the group being grown (no members)
  bool cyclic_ = false;
  std::vector<bool> member_, tainted_, leaf_;
  std::vector<int> members_;
  std::unordered_map<const ir::Value*, Level> level_;
  std::unordered_map<int, RowReduce> reduction_;
  Shape full_;
  RowShape shape_;
  int64_t rows_ = 0, len_ = 0, stride_ = 0;
};
} // namespace

std::vector<RowGroup> FindRowGroups(const ir::Graph& graph, const std::vector<bool>& live,
                                    std::vector<bool>* claimed, const RowFusionOptions& options) {
  const size_t n_nodes = graph.nodes().size();
  std::vector<std::vector<int>> readers(n_nodes);
  for (size_t i = 0; i < n_nodes; ++i)
    if (live[i])
      for (const ir::Value* v : graph.nodes()[i]->inputs())
        if (v->node()) readers[static_cast<size_t>(v->node()->id())].push_back(static_cast<int>(i));
  std::vector<RowGroup> groups;
  for (size_t seed = 0; seed < n_nodes; ++seed) {
    if (!live[seed] || (*claimed)[seed]) continue;
    auto seed_shape = RowReduction(*graph.nodes()[seed]);
    if (!seed_shape) continue;
    auto builder =
        std::make_unique<RowGroupBuilder>(graph, live, *claimed, readers, /*wide=*/true, options.num_threads);
    std::vector<int> members = builder->Grow(static_cast<int>(seed), *seed_shape);
    if (members.empty() && builder->cyclic()) {
      builder = std::make_unique<RowGroupBuilder>(graph, live, *claimed, readers, /*wide=*/false,
                                                  options.num_threads);
      members = builder->Grow(static_cast<int>(seed), *seed_shape);
    }
    if (members.empty()) continue;
    RowGroup group = builder->Result(members);
    if (options.accept && !options.accept(group)) continue; // runs unfused
    for (int m : members) (*claimed)[static_cast<size_t>(m)] = true;
    groups.push_back(std::move(group));
  }
  return groups;
}

bool RunRowFusion(ir::Graph& graph, const RowFusionOptions& options) {
  const auto& nodes = graph.nodes();
  std::vector<bool> live(nodes.size(), true), claimed(nodes.size(), false);
  int next = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    claimed[i] = nodes[i]->note().group >= 0;
    next = std::max(next, nodes[i]->note().group + 1);
  }
  const std::vector<RowGroup> groups = FindRowGroups(graph, live, &claimed, options);
  for (const RowGroup& grp : groups) {
    for (int m : grp.members) nodes[static_cast<size_t>(m)]->note().group = next;
    ++next;
  }
  return !groups.empty();
}

} // namespace kiln::passes
