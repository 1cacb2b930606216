// The graph JSON format (`NAME-symbol.json`, layout documented in serialize.h). Loading goes:
// parse -> check "format" -> upgrade an older version to the current one -> check every field
// while rebuilding the graph through Graph::AddNode, which re-runs inference so the recorded types
// are verified rather than trusted. Not here: the params file (params.cc), atomic writes
// (runtime/atomic_file.cc).
#include "kiln/ir/serialize.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "kiln/runtime/atomic_file.h"
#include "kiln/runtime/error.h"

namespace kiln::ir {

namespace {

using Json = nlohmann::ordered_json;

// ---- upgrades ----------------------------------------------------------------------------------

// Upgrades a document of version v (the key) to v + 1, in place. When the format changes, bump
// kGraphFormatVersion and add the step from the previous version here; nothing else in the loader
// deals with old versions.
using UpgradeFn = std::function<void(Json&)>;
std::map<int, UpgradeFn>& Upgrades() {
  static std::map<int, UpgradeFn> table;
  return table;
}

// ---- messages ----------------------------------------------------------------------------------

// "a string \"yes\"", "an array [1,2]" (long values cut short).
std::string Found(const Json& j) {
  const char* kind = j.is_object()           ? "an object "
                     : j.is_array()          ? "an array "
                     : j.is_string()         ? "a string "
                     : j.is_boolean()        ? "a bool "
                     : j.is_number_integer() ? "an integer "
                     : j.is_number()         ? "a number "
                                             : "";
  std::string text = j.dump(-1, ' ', true, Json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return kind + text;
}

std::string TypeStr(const TensorType& t) { return std::string(DTypeName(t.dtype)) + t.shape.str(); }

std::string DTypeNames() {
  std::string s;
  for (int i = 0; i < kNumDTypes; ++i) s += std::string(i ? ", " : "") + DTypeName(static_cast<DType>(i));
  return s;
}


// ---- checked reading ---------------------------------------------------------------------------

// Reads fields of the document, throwing FormatError "<source>: <where>: <what>; <fix>".
class Reader {
public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void Fail(const std::string& where, const std::string& what) const {
    KILN_THROW(FormatError) << source_ << ": " << where << ": " << what
                            << "; the file is damaged or was not written by kiln, export the model again";
  }

  const Json& Key(const Json& obj, const char* key, const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end()) Fail(where, std::string("missing key \"") + key + "\"");
    return *it;
  }
  void OnlyKeys(const Json& obj, std::initializer_list<const char*> keys, const std::string& where) const {
    for (const auto& [k, v] : obj.items()) {
      bool known = false;
      for (const char* key : keys) known |= k == key;
      if (known) continue;
      std::string expected;
      for (const char* key : keys) expected += std::string(expected.empty() ? "" : ", ") + key;
      Fail(where, "unknown key \"" + k + "\" (expected the keys " + expected + ")");
    }
  }
  const Json& Object(const Json& j, const std::string& where) const {
    if (!j.is_object()) Fail(where, "expected an object, found " + Found(j));
    return j;
  }
  const Json& Array(const Json& j, const std::string& where) const {
    if (!j.is_array()) Fail(where, "expected an array, found " + Found(j));
    return j;
  }
  std::string String(const Json& j, const std::string& where) const {
    if (!j.is_string()) Fail(where, "expected a string, found " + Found(j));
    return j.get<std::string>();
  }
  int64_t Int(const Json& j, const std::string& where) const {
    if (!j.is_number_integer() || (j.is_number_unsigned() && j.get<uint64_t>() > INT64_MAX))
      Fail(where, "expected an integer, found " + Found(j));
    return j.get<int64_t>();
  }
  DType ParseDTypeAt(const Json& j, const std::string& where) const {
    std::string name = String(j, where);
    for (int i = 0; i < kNumDTypes; ++i)
      if (name == DTypeName(static_cast<DType>(i))) return static_cast<DType>(i);
    Fail(where, "unknown dtype \"" + name + "\" (expected one of " + DTypeNames() + ")");
  }
  TensorType Type(const Json& entry, const std::string& where) const {
    TensorType t;
    t.dtype = ParseDTypeAt(Key(entry, "dtype", where), where + ".dtype");
    const Json& dims = Array(Key(entry, "shape", where), where + ".shape");
    if (dims.size() > static_cast<size_t>(kMaxRank))
      Fail(where + ".shape",
           "rank " + std::to_string(dims.size()) + " exceeds kiln's maximum of " + std::to_string(kMaxRank));
    for (size_t i = 0; i < dims.size(); ++i) {
      int64_t d = Int(dims[i], where + ".shape[" + std::to_string(i) + "]");
      if (d < 0)
        Fail(where + ".shape[" + std::to_string(i) + "]", "expected a size >= 0, found " + std::to_string(d));
      t.shape.push_back(d);
    }
    return t;
  }
  AttrValue Attr(const Json& j, const AttrSpec& spec, const std::string& where) const {
    switch (spec.kind) {
    case AttrKind::kInt:
      if (!j.is_number_integer() || (j.is_number_unsigned() && j.get<uint64_t>() > INT64_MAX))
        WrongAttr(j, spec, where, "an int");
      return j.get<int64_t>();
    case AttrKind::kFloat:
      if (j.is_number()) return j.get<double>();
      if (j == "inf") return HUGE_VAL;
      if (j == "-inf") return -HUGE_VAL;
      if (j == "nan") return std::nan("");
      WrongAttr(j, spec, where, "a float (a number, \"inf\", \"-inf\" or \"nan\")");
    case AttrKind::kBool:
      if (!j.is_boolean()) WrongAttr(j, spec, where, "a bool");
      return j.get<bool>();
    case AttrKind::kInts: {
      if (!j.is_array()) WrongAttr(j, spec, where, "an int list");
      std::vector<int64_t> xs;
      for (const Json& x : j) {
        if (!x.is_number_integer() || (x.is_number_unsigned() && x.get<uint64_t>() > INT64_MAX))
          WrongAttr(j, spec, where, "an int list");
        xs.push_back(x.get<int64_t>());
      }
      return xs;
    }
    case AttrKind::kDType:
      if (!j.is_string()) WrongAttr(j, spec, where, "a dtype name (" + DTypeNames() + ")");
      for (int i = 0; i < kNumDTypes; ++i)
        if (j == DTypeName(static_cast<DType>(i))) return static_cast<DType>(i);
      WrongAttr(j, spec, where, "a dtype name (" + DTypeNames() + ")");
    }
    Fail(where, "unreachable attribute kind");
  }

private:
  [[noreturn]] void WrongAttr(const Json& j, const AttrSpec& spec, const std::string& where,
                              const std::string& expected) const {
    Fail(where, std::string("attribute \"") + spec.name + "\" expects " + expected + ", found " + Found(j));
  }

  std::string source_;
};

// Rejects duplicated object keys anywhere in the document (the parser would keep the last), and
// nesting deeper than kMaxJsonDepth (a graph needs 5 levels; hostile nesting would overflow the
// stack of the recursive code that walks, prints or frees the tree).
Json ParseStrict(std::string_view text, const Reader& r) {
  std::vector<std::set<std::string>> keys;
  Json::parser_callback_t cb = [&](int depth, Json::parse_event_t ev, Json& parsed) {
    using E = Json::parse_event_t;
    if ((ev == E::object_start || ev == E::array_start) && depth >= kMaxJsonDepth)
      r.Fail("the document", "arrays and objects nest deeper than the limit of " + std::to_string(kMaxJsonDepth) +
                                 " levels");
    if (ev == E::object_start) keys.emplace_back();
    if (ev == E::object_end) keys.pop_back();
    if (ev == E::key && !keys.back().insert(parsed.get<std::string>()).second)
      r.Fail("the document", "the key \"" + parsed.get<std::string>() + "\" appears twice in one object");
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), cb);
  } catch (const nlohmann::json::parse_error& e) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n')
        line++, col = 1;
      else
        col++;
    }
    std::string detail = e.what();
    if (auto p = detail.find("syntax error"); p != std::string::npos) detail = detail.substr(p);
    r.Fail("the document", "not valid JSON at line " + std::to_string(line) + ", column " +
                               std::to_string(col) + " (byte " + std::to_string(e.byte) + "): " + detail);
  } catch (const nlohmann::json::out_of_range& e) { // 406: a number past a double (found by fuzz_symbol_json)
    std::string detail = e.what();
    if (auto p = detail.find("number overflow"); p != std::string::npos) detail = detail.substr(p);
    r.Fail("the document", "expected numbers that fit a double, found " + detail);
  }
}

void CheckStructure(const OutputStructure& s, int num_outputs, std::vector<bool>& used,
                    const std::function<void(const std::string&)>& fail) {
  if (!s.is_leaf()) {
    for (const OutputStructure& item : s.items) CheckStructure(item, num_outputs, used, fail);
    return;
  }
  if (s.index >= num_outputs)
    fail("refers to output " + std::to_string(s.index) + " but the graph has " + std::to_string(num_outputs));
  used[s.index] = true;
}

void CheckAllUsed(const std::vector<bool>& used, const std::function<void(const std::string&)>& fail) {
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i]) fail("does not contain output " + std::to_string(i) + "; every output must appear in it");
}

OutputStructure ReadStructure(const Json& j, const Reader& r, const std::string& where, int depth = 0) {
  if (j.is_array()) {
    if (depth == 64) r.Fail(where, "lists nested more than 64 deep; no model returns that");
    OutputStructure s;
    for (size_t i = 0; i < j.size(); ++i)
      s.items.push_back(ReadStructure(j[i], r, where + "[" + std::to_string(i) + "]", depth + 1));
    return s;
  }
  int64_t i = r.Int(j, where);
  if (i < 0 || i > INT32_MAX) r.Fail(where, "expected an output index >= 0, found " + std::to_string(i));
  return OutputStructure::Leaf(static_cast<int>(i));
}

Json StructureJson(const OutputStructure& s) {
  if (s.is_leaf()) return s.index;
  Json a = Json::array();
  for (const OutputStructure& item : s.items) a.push_back(StructureJson(item));
  return a;
}

Json AttrJson(const AttrValue& v) {
  switch (KindOf(v)) {
  case AttrKind::kInt: return std::get<int64_t>(v);
  case AttrKind::kFloat: {
    double d = std::get<double>(v);
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
    return d;
  }
  case AttrKind::kBool: return std::get<bool>(v);
  case AttrKind::kInts: return std::get<std::vector<int64_t>>(v);
  case AttrKind::kDType: return DTypeName(std::get<DType>(v));
  }
  return nullptr;
}

Json TypeJson(Json entry, const TensorType& t) {
  entry["dtype"] = DTypeName(t.dtype);
  entry["shape"] = t.shape.vec();
  return entry;
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', true); }

// Applies the upgrade table until the document has the current version.
void Upgrade(Json& doc, int64_t version, const Reader& r) {
  for (int64_t v = version; v < kGraphFormatVersion; ++v) {
    auto it = Upgrades().find(static_cast<int>(v));
    if (it == Upgrades().end())
      r.Fail("\"version\"",
             "version " + std::to_string(version) +
                 " is older than any this kiln can read or upgrade (oldest: " +
                 std::to_string(Upgrades().empty() ? kGraphFormatVersion : Upgrades().begin()->first) + ")");
    it->second(doc);
    doc["version"] = v + 1;
  }
}

LoadedGraph FromJson(std::string_view text, const std::string& source) {
  Reader r(source);
  Json doc = ParseStrict(text, r);
  r.Object(doc, "the document");
  const Json& format = r.Key(doc, "format", "the document");
  if (format != "kiln-graph")
    r.Fail("\"format\"",
           "expected \"kiln-graph\", found " + Found(format) + "; this is not a kiln graph file");
  int64_t version = r.Int(r.Key(doc, "version", "the document"), "\"version\"");
  if (version > kGraphFormatVersion) {
    KILN_THROW(FormatError) << source << ": version " << version << " is newer than this kiln ("
                            << kGraphFormatVersion << "); upgrade kiln to load it";
  }
  Upgrade(doc, version, r);
  r.OnlyKeys(doc, {"format", "version", "inputs", "params", "nodes", "outputs", "output_structure"},
             "the document");

  LoadedGraph out;
  out.graph = std::make_unique<Graph>();
  Graph& g = *out.graph;
  std::vector<Value*> values;               // by file number
  std::map<std::string, std::string> names; // name -> where it was first seen

  for (const char* list : {"inputs", "params"}) {
    const Json& entries = r.Array(r.Key(doc, list, "the document"), list);
    for (size_t i = 0; i < entries.size(); ++i) {
      std::string where = std::string(list) + "[" + std::to_string(i) + "]";
      const Json& e = r.Object(entries[i], where);
      r.OnlyKeys(e, {"name", "dtype", "shape"}, where);
      std::string name = r.String(r.Key(e, "name", where), where + ".name");
      if (auto [it, fresh] = names.emplace(name, where); !fresh)
        r.Fail(where + ".name",
               "\"" + name + "\" is used twice (also by " + it->second + "); names must be unique");
      values.push_back(g.AddInput(name, r.Type(e, where)));
      (list[0] == 'i' ? out.manifest.inputs : out.manifest.params).push_back(name);
    }
  }

  const Json& nodes = r.Array(r.Key(doc, "nodes", "the document"), "nodes");
  for (size_t k = 0; k < nodes.size(); ++k) {
    std::string where = "nodes[" + std::to_string(k) + "]";
    const Json& n = r.Object(nodes[k], where);
    r.OnlyKeys(n, {"op", "inputs", "attrs", "outputs"}, where);
    std::string op_name = r.String(r.Key(n, "op", where), where + ".op");
    std::optional<OpId> op = OpTable::Get().TryFind(op_name);
    if (!op)
      r.Fail(where, "unknown op \"" + op_name + "\"; did you mean \"" + ClosestOpName(op_name) +
                        "\"? (a newer kiln may know it)");
    const OpDef& def = GetOp(*op);
    where += " (" + op_name + ")";

    std::vector<Value*> inputs;
    const Json& in = r.Array(r.Key(n, "inputs", where), where + ".inputs");
    for (size_t i = 0; i < in.size(); ++i) {
      int64_t id = r.Int(in[i], where + ".inputs[" + std::to_string(i) + "]");
      if (id < 0 || id >= static_cast<int64_t>(values.size()))
        r.Fail(where, "input " + std::to_string(i) + " refers to value " + std::to_string(id) +
                          ", which is not defined before this node (values 0.." +
                          std::to_string(static_cast<int64_t>(values.size()) - 1) + " are)");
      inputs.push_back(values[id]);
    }

    Attrs attrs;
    const Json& aj = r.Object(r.Key(n, "attrs", where), where + ".attrs");
    for (const auto& [name, val] : aj.items()) {
      const AttrSpec* spec = nullptr;
      for (const AttrSpec& s : def.attrs)
        if (name == s.name) spec = &s;
      if (!spec) {
        std::string known;
        for (const AttrSpec& s : def.attrs) known += std::string(known.empty() ? "" : ", ") + s.name;
        r.Fail(where, "unknown attribute \"" + name + "\"; " + op_name + " takes " +
                          (known.empty() ? std::string("no attributes") : known));
      }
      attrs.items().emplace_back(spec->name, r.Attr(val, *spec, where));
    }

    Node* node = nullptr;
    try {
      node = g.AddNode(*op, std::move(inputs), attrs);
    } catch (const kiln::Error& e) {
      r.Fail(where, std::string("the op rejects its recorded inputs or attributes: ") + e.what());
    }

    const Json& outs = r.Array(r.Key(n, "outputs", where), where + ".outputs");
    if (outs.size() != node->outputs().size())
      r.Fail(where, "records " + std::to_string(outs.size()) + " output(s) but " + op_name + " with " +
                        (node->attrs().empty() ? std::string("these inputs") : node->attrs().str()) +
                        " makes " + std::to_string(node->outputs().size()));
    for (size_t i = 0; i < outs.size(); ++i) {
      std::string ow = where + ".outputs[" + std::to_string(i) + "]";
      const Json& o = r.Object(outs[i], ow);
      r.OnlyKeys(o, {"value", "dtype", "shape"}, ow);
      int64_t id = r.Int(r.Key(o, "value", ow), ow + ".value");
      if (id != static_cast<int64_t>(values.size()))
        r.Fail(ow + ".value",
               "expected " + std::to_string(values.size()) + ", found " + std::to_string(id) +
                   " (values are numbered densely: inputs, params, then node outputs in order)");
      TensorType recorded = r.Type(o, ow);
      Value* v = node->output(static_cast<int>(i));
      if (!(recorded == v->type()))
        r.Fail(where, "output " + std::to_string(i) + " is recorded as " + TypeStr(recorded) + " but " +
                          op_name + " infers " + TypeStr(v->type()) + " from its inputs");
      values.push_back(v);
    }
  }

  std::vector<Value*> outputs;
  const Json& outs = r.Array(r.Key(doc, "outputs", "the document"), "outputs");
  for (size_t i = 0; i < outs.size(); ++i) {
    std::string where = "outputs[" + std::to_string(i) + "]";
    const Json& o = r.Object(outs[i], where);
    r.OnlyKeys(o, {"value", "dtype", "shape"}, where);
    int64_t id = r.Int(r.Key(o, "value", where), where + ".value");
    if (id < 0 || id >= static_cast<int64_t>(values.size()))
      r.Fail(where, "refers to value " + std::to_string(id) + ", which is not defined (values 0.." +
                        std::to_string(static_cast<int64_t>(values.size()) - 1) + " are)");
    TensorType recorded = r.Type(o, where);
    if (!(recorded == values[id]->type()))
      r.Fail(where, "is recorded as " + TypeStr(recorded) + " but value " + std::to_string(id) + " is " +
                        TypeStr(values[id]->type()));
    outputs.push_back(values[id]);
  }
  g.SetOutputs(std::move(outputs));

  const char* sw = "output_structure";
  out.manifest.output_structure = ReadStructure(r.Key(doc, sw, "the document"), r, sw);
  std::vector<bool> used(g.outputs().size());
  auto fail = [&](const std::string& what) { r.Fail(sw, what); };
  CheckStructure(out.manifest.output_structure, static_cast<int>(used.size()), used, fail);
  CheckAllUsed(used, fail);
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    KILN_THROW(FormatError) << "cannot open '" << path << "': " << std::strerror(errno) << "; check the path";
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

} // namespace

OutputStructure OutputStructure::Flat(int n) {
  OutputStructure s;
  for (int i = 0; i < n; ++i) s.items.push_back(Leaf(i));
  return s;
}

std::string GraphToJson(const Graph& g, const GraphManifest& m) {
  size_t n_in = m.inputs.size();
  if (g.inputs().size() != n_in + m.params.size())
    KILN_THROW(ValueError) << "GraphToJson: the manifest names " << n_in << " input(s) and "
                           << m.params.size() << " param(s) but the graph has " << g.inputs().size()
                           << " inputs; list every graph input, data inputs first";
  std::set<std::string> names;
  for (const auto* list : {&m.inputs, &m.params})
    for (const std::string& name : *list)
      if (!names.insert(name).second)
        KILN_THROW(ValueError) << "GraphToJson: the name \"" << name
                               << "\" is used twice; names must be unique";
  std::vector<bool> used(g.outputs().size());
  auto fail = [](const std::string& what) {
    KILN_THROW(ValueError) << "GraphToJson: the output structure " << what;
  };
  CheckStructure(m.output_structure, static_cast<int>(used.size()), used, fail);
  CheckAllUsed(used, fail);

  std::unordered_map<const Value*, int> number;
  auto type_entry = [&](const std::string& name, const Value* v) {
    number.emplace(v, static_cast<int>(number.size()));
    return TypeJson(Json{{"name", name}}, v->type());
  };
  std::vector<Json> inputs, params, nodes, outputs;
  for (size_t i = 0; i < g.inputs().size(); ++i)
    (i < n_in ? inputs : params)
        .push_back(type_entry(i < n_in ? m.inputs[i] : m.params[i - n_in], g.inputs()[i]));
  for (const auto& n : g.nodes()) {
    Json in = Json::array();
    for (const Value* v : n->inputs()) {
      auto it = number.find(v);
      KILN_CHECK(it != number.end()) << "node " << n->id() << " (" << n->def().name
                                     << ") uses a value not in the graph";
      in.push_back(it->second);
    }
    Json attrs = Json::object();
    for (const auto& [name, v] : n->attrs().items()) attrs[name] = AttrJson(v);
    Json outs = Json::array();
    for (const Value* v : n->outputs()) {
      int id = static_cast<int>(number.size());
      number.emplace(v, id);
      outs.push_back(TypeJson(Json{{"value", id}}, v->type()));
    }
    nodes.push_back(Json{{"op", n->def().name}, {"inputs", in}, {"attrs", attrs}, {"outputs", outs}});
  }
  for (const Value* v : g.outputs()) {
    auto it = number.find(v);
    KILN_CHECK(it != number.end()) << "a graph output is not a value of the graph";
    outputs.push_back(TypeJson(Json{{"value", it->second}}, v->type()));
  }

  // One entry per line: readable, and a change to one node is a one-line diff.
  std::string s =
      "{\n  \"format\": \"kiln-graph\",\n  \"version\": " + std::to_string(kGraphFormatVersion) + ",\n";
  for (auto [key, list] :
       {std::pair{"inputs", &inputs}, {"params", &params}, {"nodes", &nodes}, {"outputs", &outputs}}) {
    s += std::string("  \"") + key + "\": [";
    for (size_t i = 0; i < list->size(); ++i) s += (i ? ",\n    " : "\n    ") + Dump((*list)[i]);
    s += list->empty() ? "],\n" : "\n  ],\n";
  }
  s += "  \"output_structure\": " + Dump(StructureJson(m.output_structure)) + "\n}\n";
  return s;
}

LoadedGraph GraphFromJson(std::string_view text) { return FromJson(text, "graph JSON"); }

void SaveGraph(const std::string& path, const Graph& g, const GraphManifest& m) {
  WriteFileAtomic(path, GraphToJson(g, m));
}

LoadedGraph LoadGraph(const std::string& path) { return FromJson(ReadFile(path), "'" + path + "'"); }

namespace detail {
void SetGraphUpgradeForTesting(int from_version, std::function<std::string(const std::string&)> fn) {
  if (!fn) {
    Upgrades().erase(from_version);
    return;
  }
  Upgrades()[from_version] = [fn = std::move(fn)](Json& doc) { doc = Json::parse(fn(doc.dump())); };
}
} // namespace detail

} // namespace kiln::ir
