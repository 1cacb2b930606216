// ReshapeInputs: an exported graph re-shaped for new input shapes (see the header for the rule).
#include "kiln/passes/reshape_inputs.h"

#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>

#include "kiln/runtime/error.h"

namespace kiln::passes {

namespace {

using ir::Graph;
using ir::Node;
using ir::Value;
using Ints = std::vector<int64_t>;

// Attributes whose entries are sizes of dimensions, by the op table's naming: `shape` (reshape,
// broadcast_to, creation ops, slice_grad) and `*_shape` (gradient ops' recorded input shapes).
bool IsSizeList(std::string_view name) { return name == "shape" || name.ends_with("_shape"); }

// What changed at the data inputs.
struct Resizing {
  std::map<int64_t, int64_t> to; // traced size -> new size
  std::set<int64_t> kept;        // sizes of data input dimensions that did not change
  std::string inputs;            // "input 'data' (64, 784) -> (3, 784)", for messages
};

std::string Describe(const Node& n) {
  std::ostringstream s;
  s << "node " << n.id() << " (" << n.def().name;
  if (!n.outputs().empty()) s << ", value %" << n.output(0)->id();
  s << ")";
  return s.str();
}

[[noreturn]] void Fail(const Node& n, const Resizing& r, const std::string& why) {
  KILN_THROW(ShapeError) << "cannot re-shape " << Describe(n) << " for " << r.inputs << ": " << why
                         << "; export the graph again, traced with inputs of this shape";
}

// The sizes of the node's (traced) input dimensions that keep their size at the new shapes.
std::set<int64_t> KeptAt(const Node& n, const std::vector<Value*>& now) {
  std::set<int64_t> kept;
  for (size_t k = 0; k < now.size(); ++k) {
    const Shape& was = n.input(static_cast<int>(k))->shape();
    const Shape& is = now[k]->shape();
    for (int j = 0; j < was.rank() && j < is.rank(); ++j)
      if (was[j] == is[j]) kept.insert(was[j]);
  }
  return kept;
}

// One size-valued list rewritten; `ambiguous` receives the positions that could be either.
Ints Substitute(const Ints& v, const Resizing& r, const std::set<int64_t>& local_kept,
                std::vector<size_t>* ambiguous) {
  Ints out = v;
  for (size_t i = 0; i < v.size(); ++i) {
    auto it = r.to.find(v[i]);
    if (it == r.to.end()) continue;
    if (r.kept.count(v[i]) || local_kept.count(v[i]))
      ambiguous->push_back(i);
    else
      out[i] = it->second;
  }
  return out;
}

// Whether a reshape target fits `numel` elements (one -1 inferred).
bool Fits(const Ints& spec, int64_t numel) {
  int64_t known = 1;
  bool infer = false;
  for (int64_t d : spec) {
    if (d == -1)
      infer = true;
    else
      known *= d;
  }
  return infer ? known != 0 && numel % known == 0 : known == numel;
}

// A reshape's target. Its leading entries that equal the input's leading dimensions are those
// dimensions (MXNet's reshape code 0, "copy this dimension": how flatten keeps the batch), so
// they take the input's new sizes. Of the others, ambiguous entries are settled by the element
// count when exactly one choice of which of them take the new size fits it.
Ints ReshapeTarget(const Node& n, const Ints& spec, const Resizing& r, const std::set<int64_t>& local_kept,
                   const Shape& was, const Shape& is) {
  size_t prefix = 0;
  while (prefix < spec.size() && static_cast<int>(prefix) < was.rank() &&
         spec[prefix] == was[static_cast<int>(prefix)])
    ++prefix;
  Ints rest(spec.begin() + static_cast<std::ptrdiff_t>(prefix), spec.end());
  std::vector<size_t> amb;
  Ints base = Substitute(rest, r, local_kept, &amb);
  base.insert(base.begin(), is.begin(), is.begin() + prefix);
  for (size_t& i : amb) i += prefix;
  if (amb.empty()) return base;
  if (amb.size() > 12)
    Fail(n, r, "its target shape has too many sizes that may or may not be the resized one");
  std::vector<Ints> fitting;
  for (uint32_t mask = 0; mask < (1u << amb.size()); ++mask) {
    Ints c = base;
    for (size_t b = 0; b < amb.size(); ++b)
      if (mask & (1u << b)) c[amb[b]] = r.to.at(c[amb[b]]);
    if (Fits(c, is.numel())) fitting.push_back(c);
  }
  if (fitting.size() == 1) return fitting[0];
  std::ostringstream s;
  s << "its target shape " << AttrValueStr(spec) << " holds the traced size " << spec[amb[0]]
    << ", which is both a resized dimension and one that kept its size, and "
    << (fitting.empty() ? "no choice" : "more than one choice") << " of which entries take the new size fits "
    << is.numel() << " elements";
  Fail(n, r, s.str());
}

// A slice's bounds on resized axes: only a slice taking the whole axis carries over.
void ResliceAxes(const Node& n, const Resizing& r, const Shape& was, const Shape& is, Ints& begin, Ints& end,
                 const Ints& step) {
  size_t given = std::max({begin.size(), end.size(), step.size()});
  std::vector<SliceAxis> old = NormalizeSlice(was, begin, end, step, n.def().name.c_str());
  for (size_t j = 0; j < given && static_cast<int>(j) < was.rank(); ++j) {
    if (was[static_cast<int>(j)] == is[static_cast<int>(j)]) continue;
    const SliceAxis& a = old[j];
    if (!(a.begin == 0 && a.step == 1 && a.len == was[static_cast<int>(j)])) {
      std::ostringstream s;
      s << "it slices axis " << j << ", resized from " << was[static_cast<int>(j)] << " to "
        << is[static_cast<int>(j)] << ", with constant bounds (" << a.len << " elements from " << a.begin
        << "), which mean nothing at another size";
      Fail(n, r, s.str());
    }
    if (j < begin.size()) begin[j] = 0;
    if (j < end.size()) end[j] = std::numeric_limits<int64_t>::max();
  }
}

ir::Attrs Rewrite(const Node& n, const std::vector<Value*>& now, const Resizing& r) {
  ir::Attrs attrs = n.attrs();
  std::set<int64_t> local_kept = KeptAt(n, now);
  bool changed_in = false;
  for (size_t k = 0; k < now.size(); ++k)
    changed_in |= !(now[k]->shape() == n.input(static_cast<int>(k))->shape());
  if (n.op() == op::kCallGraph || n.op() == op::kCallGraphBackward) {
    if (changed_in) Fail(n, r, "a call of another compiled graph has fixed shapes; inline it first");
    return attrs;
  }
  Shape slice_was, slice_is; // the shapes a slice's bounds refer to
  if (n.op() == op::kSlice) slice_was = n.input(0)->shape(), slice_is = now[0]->shape();
  for (auto& [name, value] : attrs.items()) {
    if (!IsSizeList(name) || !std::holds_alternative<Ints>(value)) continue;
    const Ints& v = std::get<Ints>(value);
    if (n.op() == op::kReshape) {
      value = ReshapeTarget(n, v, r, local_kept, n.input(0)->shape(), now[0]->shape());
      continue;
    }
    std::vector<size_t> amb;
    Ints out = Substitute(v, r, local_kept, &amb);
    if (!amb.empty()) {
      std::ostringstream s;
      s << "its attribute " << name << "=" << AttrValueStr(v) << " holds the traced size " << v[amb[0]]
        << ", which is both a resized dimension and one that kept its size here, so which it means is "
           "ambiguous";
      Fail(n, r, s.str());
    }
    if (n.op() == op::kSliceGrad && std::string_view(name) == "shape")
      slice_was = Shape(v), slice_is = Shape(out);
    value = std::move(out);
  }
  if (n.op() == op::kSlice || n.op() == op::kSliceGrad) {
    Ints begin = attrs.Ints("begin"), end = attrs.Ints("end");
    ResliceAxes(n, r, slice_was, slice_is, begin, end, attrs.Ints("step"));
    for (auto& [name, value] : attrs.items()) {
      if (std::string_view(name) == "begin") value = begin;
      if (std::string_view(name) == "end") value = end;
    }
  }
  if (n.op() == op::kSplit && attrs.Ints("sections").size() > 1) {
    const Shape& was = n.input(0)->shape();
    int axis = NormalizeAxis(attrs.Int("axis"), was.rank(), "split");
    if (was[axis] != now[0]->shape()[axis])
      Fail(n, r,
           "it cuts axis " + std::to_string(axis) + ", which is resized, into parts of constant sizes " +
               AttrValueStr(attrs.Ints("sections")));
  }
  return attrs;
}

} // namespace

std::unique_ptr<ir::Graph> ReshapeInputs(const ir::Graph& g, std::span<const Shape> shapes) {
  KILN_CHECK(shapes.size() <= g.inputs().size())
      << "ReshapeInputs: " << shapes.size() << " shapes for " << g.inputs().size() << " graph inputs";
  Resizing r;
  std::map<int64_t, std::string> first; // traced size -> the input dimension that resized it first
  auto graph = std::make_unique<Graph>();
  ir::ValueMap map;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const Value* in = g.inputs()[i];
    ir::TensorType t = in->type();
    if (i < shapes.size()) {
      const Shape& is = shapes[i];
      if (is.rank() != t.shape.rank())
        KILN_THROW(ShapeError) << "input '" << in->name() << "' has shape " << is.str() << " of rank "
                               << is.rank() << ", but the graph was traced with " << t.shape.str()
                               << " of rank " << t.shape.rank() << "; only sizes can change, pass a rank-"
                               << t.shape.rank() << " input";
      for (int j = 0; j < is.rank(); ++j) {
        int64_t was = t.shape[j];
        if (is[j] < 0)
          KILN_THROW(ShapeError) << "input '" << in->name() << "' has a negative size in " << is.str();
        std::string where = "input '" + in->name() + "' axis " + std::to_string(j);
        if (was == is[j]) {
          r.kept.insert(was);
          continue;
        }
        auto [it, fresh] = r.to.emplace(was, is[j]);
        if (!fresh && it->second != is[j])
          KILN_THROW(ShapeError) << "input sizes disagree: " << first[was] << " and " << where
                                 << " were both " << was << " when the graph was traced, but are now "
                                 << it->second << " and " << is[j]
                                 << "; sizes that were equal when traced must change together (or "
                                    "export again, traced with sizes that differ)";
        first.emplace(was, where);
      }
      if (!(is == t.shape)) {
        if (!r.inputs.empty()) r.inputs += ", ";
        r.inputs += "input '" + in->name() + "' " + t.shape.str() + " -> " + is.str();
      }
      t.shape = is;
    }
    map[in] = graph->AddInput(in->name(), t);
  }
  for (const auto& node : g.nodes()) {
    const Node& n = *node;
    std::vector<Value*> in;
    for (const Value* v : n.inputs()) in.push_back(map.at(v));
    ir::Attrs attrs = r.to.empty() ? n.attrs() : Rewrite(n, in, r);
    Node* c;
    try {
      c = graph->AddNode(n.op(), in, attrs);
    } catch (const InternalError&) {
      throw;
    } catch (const Error& e) {
      Fail(n, r, e.what());
    }
    for (size_t k = 0; k < n.outputs().size(); ++k) {
      KILN_CHECK(c->output(static_cast<int>(k))->dtype() == n.output(static_cast<int>(k))->dtype())
          << "ReshapeInputs: " << Describe(n) << " changed its output dtype";
      map[n.outputs()[k]] = c->outputs()[k];
    }
  }
  std::vector<Value*> outs;
  for (const Value* v : g.outputs()) outs.push_back(map.at(v));
  graph->SetOutputs(std::move(outs));
  return graph;
}

} // namespace kiln::passes
