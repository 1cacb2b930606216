// The graph verifier: the invariants listed in include/kiln/ir/verify.h, checked in one pass over
// the graph inputs, the nodes and the graph outputs. It repairs nothing and stops at nothing:
// VerifyAll collects every violation, Verify reports the first.
#include "kiln/ir/verify.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "kiln/runtime/error.h"

namespace kiln::ir {
namespace {

const char* kTitles[] = {
    "",
    "graph inputs are distinct values with no producer",
    "input names are non-empty and unique",
    "node ids are positions",
    "operands are defined before use",
    "attributes match the op's schema",
    "arity matches the op",
    "each value is produced once",
    "output types match inference",
    "graph outputs are values of the graph",
    "value ids are unique and dense",
};

std::string TypeText(const TensorType& t) { return DTypeName(t.dtype) + t.shape.str(); }

const char* Article(AttrKind k) { return k == AttrKind::kInt || k == AttrKind::kInts ? "an" : "a"; }

class Checker {
public:
  explicit Checker(const Graph& g) : g_(g) {}

  std::vector<std::string> Run() {
    // Where each value is first defined: -1 for a graph input, else the producing node's position.
    for (const Value* v : g_.inputs())
      if (v) def_.emplace(v, -1);
    for (size_t k = 0; k < g_.nodes().size(); ++k)
      for (const Value* v : g_.nodes()[k]->outputs())
        if (v) def_.emplace(v, static_cast<int>(k));

    Inputs();
    for (size_t k = 0; k < g_.nodes().size(); ++k) CheckNode(static_cast<int>(k));
    Outputs();
    Ids();
    return std::move(out_);
  }

private:
  void Report(int invariant, const std::string& where, const std::string& what) {
    out_.push_back("invariant " + std::to_string(invariant) + " (" + kTitles[invariant] + "): " + where +
                   ": " + what);
  }

  std::string NodeName(int k) const {
    const Node& n = *g_.nodes()[k];
    return "node #" + std::to_string(k) + " (" + n.def().name + ")";
  }

  /// Where `v` (known to the graph) comes from, for messages.
  std::string Origin(const Value* v) const {
    int k = def_.at(v);
    return k < 0 ? "a graph input" : "output " + std::to_string(v->index()) + " of " + NodeName(k);
  }

  void Inputs() {
    std::unordered_map<const Value*, size_t> seen;
    std::unordered_map<std::string, size_t> names;
    for (size_t i = 0; i < g_.inputs().size(); ++i) {
      const Value* v = g_.inputs()[i];
      std::string where = "graph input " + std::to_string(i);
      if (!v) {
        Report(1, where, "is null");
        continue;
      }
      if (auto [it, fresh] = seen.emplace(v, i); !fresh)
        Report(1, where, "is the same value as graph input " + std::to_string(it->second));
      else if (v->node())
        Report(1, where,
               "(value id " + std::to_string(v->id()) + ") is produced by a node (" + v->node()->def().name +
                   ")");
      if (v->name().empty())
        Report(2, where, "has an empty name");
      else if (auto [it, fresh] = names.emplace(v->name(), i); !fresh)
        Report(2, where, "is named \"" + v->name() + "\", like graph input " + std::to_string(it->second));
    }
  }

  void CheckNode(int k) {
    const Node& n = *g_.nodes()[k];
    const OpDef& def = n.def();
    std::string where = NodeName(k);
    if (n.id() != k) Report(3, where, "has id " + std::to_string(n.id()));

    bool operands_ok = true;
    for (size_t i = 0; i < n.inputs().size(); ++i) {
      const Value* v = n.inputs()[i];
      std::string in = "input " + std::to_string(i);
      auto it = v ? def_.find(v) : def_.end();
      if (!v)
        Report(4, where, in + " is null");
      else if (it == def_.end())
        Report(4, where, in + " (value id " + std::to_string(v->id()) + ") is not a value of this graph");
      else if (it->second >= k)
        Report(4, where, in + " is " + Origin(v) + ", which does not come before it");
      else
        continue;
      operands_ok = false;
    }

    bool attrs_ok = Attributes(n, where);

    bool arity_ok = true;
    int n_in = static_cast<int>(n.inputs().size());
    if (def.num_inputs >= 0 && n_in != def.num_inputs) {
      Report(6, where,
             "expected " + std::to_string(def.num_inputs) + " input(s), found " + std::to_string(n_in));
      arity_ok = false;
    } else if (def.num_inputs < 0 && n_in == 0) {
      Report(6, where, "expected at least one input, found none");
      arity_ok = false;
    }
    if (attrs_ok) {
      int n_out = -1;
      try {
        n_out = def.NumOutputs(n.attrs(), n_in);
      } catch (const std::exception& e) {
        Report(6, where, std::string("the number of outputs cannot be computed: ") + e.what());
      }
      if (n_out < 0) {
        arity_ok = false;
      } else if (n_out != static_cast<int>(n.outputs().size())) {
        Report(6, where,
               "expected " + std::to_string(n_out) + " output(s), found " +
                   std::to_string(n.outputs().size()));
        arity_ok = false;
      }
    }

    for (size_t i = 0; i < n.outputs().size(); ++i) {
      const Value* v = n.outputs()[i];
      std::string out = "output " + std::to_string(i);
      if (!v)
        Report(7, where, out + " is null");
      else if (def_.at(v) != k)
        Report(7, where, out + " (value id " + std::to_string(v->id()) + ") is also " + Origin(v));
      else if (v->node() != &n)
        Report(7, where,
               out + " (value id " + std::to_string(v->id()) + ") names " +
                   (v->node() ? "another node, " + v->node()->def().name : std::string("no producer")) +
                   ", as its producer");
      else if (v->index() != static_cast<int>(i))
        Report(7, where,
               out + " (value id " + std::to_string(v->id()) + ") has index " + std::to_string(v->index()));
    }

    if (operands_ok && attrs_ok && arity_ok) Types(n, where);
  }

  bool Attributes(const Node& n, const std::string& where) {
    const OpDef& def = n.def();
    const auto& items = n.attrs().items();
    bool ok = true;
    std::unordered_set<std::string_view> given;
    for (const auto& [name, value] : items) {
      const AttrSpec* spec = nullptr;
      for (const AttrSpec& s : def.attrs)
        if (std::strcmp(s.name, name) == 0) spec = &s;
      if (!spec) {
        std::string known;
        for (const AttrSpec& s : def.attrs) known += (known.empty() ? "" : ", ") + std::string(s.name);
        Report(5, where,
               "attribute '" + std::string(name) + "' is not in the schema (" +
                   (known.empty() ? "no attributes" : known) + ")");
        ok = false;
      } else if (!given.insert(name).second) {
        Report(5, where, "attribute '" + std::string(name) + "' is given twice");
        ok = false;
      } else if (KindOf(value) != spec->kind) {
        Report(5, where,
               "attribute '" + std::string(name) + "' holds " + Article(KindOf(value)) + " " +
                   AttrKindName(KindOf(value)) + " (" + AttrValueStr(value) + "); the schema declares " +
                   Article(spec->kind) + " " + AttrKindName(spec->kind));
        ok = false;
      }
    }
    for (const AttrSpec& s : def.attrs)
      if (!given.count(s.name)) {
        Report(5, where, "attribute '" + std::string(s.name) + "' is missing");
        ok = false;
      }
    if (ok) {
      for (size_t i = 0; i < items.size(); ++i)
        if (std::strcmp(items[i].first, def.attrs[i].name) != 0) {
          Report(5, where,
                 "attributes are out of schema order: '" + std::string(items[i].first) +
                     "' where the schema has '" + def.attrs[i].name + "'");
          return false;
        }
    }
    return ok;
  }

  void Types(const Node& n, const std::string& where) {
    std::vector<TensorType> in;
    for (const Value* v : n.inputs()) in.push_back(v->type());
    std::vector<TensorType> inferred;
    try {
      inferred = n.def().Infer(in, n.attrs());
    } catch (const std::exception& e) {
      Report(8, where, std::string("inference fails: ") + e.what());
      return;
    }
    for (size_t i = 0; i < n.outputs().size() && i < inferred.size(); ++i) {
      const Value* v = n.outputs()[i];
      if (v && v->type() != inferred[i])
        Report(8, where,
               "output " + std::to_string(i) + " has type " + TypeText(v->type()) + ", but " + n.def().name +
                   " infers " + TypeText(inferred[i]));
    }
  }

  void Outputs() {
    for (size_t i = 0; i < g_.outputs().size(); ++i) {
      const Value* v = g_.outputs()[i];
      std::string where = "graph output " + std::to_string(i);
      if (!v)
        Report(9, where, "is null");
      else if (!def_.count(v))
        Report(9, where, "(value id " + std::to_string(v->id()) + ") is not a value of this graph");
    }
  }

  void Ids() {
    int n = g_.num_values();
    std::vector<const Value*> by_id(static_cast<size_t>(std::max(n, 0)), nullptr);
    std::unordered_set<const Value*> distinct;
    auto check = [&](const Value* v, const std::string& where) {
      if (!v || !distinct.insert(v).second) return;
      if (v->id() < 0 || v->id() >= n)
        Report(10, where, "has id " + std::to_string(v->id()) + ", outside [0, " + std::to_string(n) + ")");
      else if (by_id[v->id()] && by_id[v->id()] != v)
        Report(10, where, "has id " + std::to_string(v->id()) + ", like another value");
      else
        by_id[v->id()] = v;
    };
    for (size_t i = 0; i < g_.inputs().size(); ++i) check(g_.inputs()[i], "graph input " + std::to_string(i));
    for (size_t k = 0; k < g_.nodes().size(); ++k)
      for (size_t i = 0; i < g_.nodes()[k]->outputs().size(); ++i)
        check(g_.nodes()[k]->outputs()[i], NodeName(static_cast<int>(k)) + " output " + std::to_string(i));
    if (static_cast<int>(distinct.size()) != n)
      Report(10, "graph",
             "has " + std::to_string(n) + " values, but its inputs and node outputs are " +
                 std::to_string(distinct.size()));
  }

  const Graph& g_;
  std::unordered_map<const Value*, int> def_;
  std::vector<std::string> out_;
};

} // namespace

std::vector<std::string> VerifyAll(const Graph& g) { return Checker(g).Run(); }

void Verify(const Graph& g, std::string_view after_pass) {
  std::vector<std::string> v = VerifyAll(g);
  if (v.empty()) return;
  KILN_THROW(InternalError) << "graph verification failed"
                            << (after_pass.empty() ? "" : " after pass '" + std::string(after_pass) + "'")
                            << ": " << v[0];
}

} // namespace kiln::ir
