// The op table: registration, attribute resolution, arity checks.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <vector>

#include "kiln/ir/op.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"

namespace kiln::ir {

const char* FusionKindName(FusionKind k) {
  switch (k) {
    case FusionKind::kElementwise: return "elementwise";
    case FusionKind::kBroadcast: return "broadcast";
    case FusionKind::kInjective: return "injective";
    case FusionKind::kReduce: return "reduce";
    case FusionKind::kOutEwiseFusable: return "out_elementwise_fusable";
    case FusionKind::kOpaque: return "opaque";
  }
  return "?";
}

Attrs OpDef::Resolve(const Attrs& given) const {
  for (const auto& [n, v] : given.items()) {
    bool known = false;
    for (const AttrSpec& s : attrs) known |= std::strcmp(s.name, n) == 0;
    if (!known) {
      std::ostringstream os;
      for (const AttrSpec& s : attrs) os << (os.tellp() ? ", " : "") << s.name;
      KILN_THROW(ValueError) << name << ": unknown attribute '" << n << "'; expected one of: "
                             << (attrs.empty() ? std::string("(none)") : os.str());
    }
  }
  Attrs out;
  out.items().reserve(attrs.size());
  for (const AttrSpec& s : attrs) {
    const AttrValue* v = nullptr;
    for (const auto& [n, gv] : given.items())
      if (std::strcmp(s.name, n) == 0) v = &gv;
    if (!v) {
      if (!s.default_value)
        KILN_THROW(ValueError) << name << ": attribute '" << s.name << "' (" << AttrKindName(s.kind)
                               << ") is required";
      out.items().emplace_back(s.name, *s.default_value);
      continue;
    }
    AttrValue val = *v;
    // Let an int stand for a float and a single int for a one-element list.
    if (s.kind == AttrKind::kFloat && KindOf(val) == AttrKind::kInt)
      val = static_cast<double>(std::get<int64_t>(val));
    if (s.kind == AttrKind::kInts && KindOf(val) == AttrKind::kInt)
      val = std::vector<int64_t>{std::get<int64_t>(val)};
    if (s.kind == AttrKind::kInt && KindOf(val) == AttrKind::kBool)
      val = static_cast<int64_t>(std::get<bool>(val));
    if (KindOf(val) != s.kind)
      KILN_THROW(ValueError) << name << ": attribute '" << s.name << "' expects a "
                             << AttrKindName(s.kind) << ", found a " << AttrKindName(KindOf(val))
                             << " (" << AttrValueStr(val) << ")";
    out.items().emplace_back(s.name, std::move(val));
  }
  return out;
}

int OpDef::NumOutputs(const Attrs& a, int n_inputs) const {
  return num_outputs >= 0 ? num_outputs : outputs_from_attrs(a, n_inputs);
}

std::vector<TensorType> OpDef::Infer(std::span<const TensorType> in, const Attrs& a) const {
  if (num_inputs >= 0 && static_cast<int>(in.size()) != num_inputs)
    KILN_THROW(ValueError) << name << ": expected " << num_inputs << " input(s), found " << in.size();
  if (num_inputs < 0 && in.empty())
    KILN_THROW(ValueError) << name << ": expected at least one input, found none";
  std::vector<TensorType> out = infer(*this, in, a);
  // Every output, eager or traced, passes here: a size that wraps around 64 bits would otherwise
  // get a tiny buffer and the kernels would write far past it.
  for (const TensorType& t : out) {
    for (int64_t d : t.shape)
      if (d < 0)
        KILN_THROW(ShapeError) << name << ": the output shape " << t.shape.str()
                               << " has a negative dimension; sizes must be >= 0";
    try {
      t.shape.NumBytes(static_cast<int64_t>(DTypeSize(t.dtype)));
    } catch (const ShapeError& e) {
      KILN_THROW(ShapeError) << name << ": the output " << e.what();
    }
  }
  return out;
}

const OpTable& OpTable::Get() {
  static const OpTable* table = [] {
    auto* t = new OpTable();
    RegisterElementwiseOps(*t);
    RegisterReduceOps(*t);
    RegisterMovementOps(*t);
    RegisterNNOps(*t);
    RegisterCreationOps(*t);
    RegisterGraphOps(*t);
    t->CheckComplete();
    return t;
  }();
  return *table;
}

OpDef::OpDef(OpId op_id) {
  KILN_CHECK(op_id < op::kNumOps) << "op id " << op_id << " is not in the op list";
  id = op_id;
  name = std::string(OpName(op_id));
  unary_fn = UnaryFnOf(op_id);
  binary_fn = BinaryFnOf(op_id);
}

OpDef& OpTable::Add(OpDef def) {
  KILN_CHECK(def.id < op::kNumOps && def.name == OpName(def.id))
      << "op '" << def.name << "' (id " << def.id << ") is not declared by its id; use OpDef(op::k...)";
  KILN_CHECK(!ops_[def.id]) << "op '" << def.name << "' is declared twice";
  KILN_CHECK(def.infer) << "op '" << def.name << "' has no inference function";
  KILN_CHECK(def.num_outputs >= 0 || def.outputs_from_attrs) << def.name;
  KILN_CHECK(def.unary_fn == UnaryFnOf(def.id) && def.binary_fn == BinaryFnOf(def.id))
      << "op '" << def.name << "': its scalar function is the op list's";
  OpId id = def.id;
  ops_[id] = std::make_unique<OpDef>(std::move(def));
  return *ops_[id];
}

void OpTable::CheckComplete() const {
  std::string missing;
  for (OpId i = 0; i < op::kNumOps; ++i)
    if (!ops_[i]) missing += (missing.empty() ? "" : ", ") + std::string(OpName(i));
  KILN_CHECK(missing.empty()) << "ops of kiln/runtime/op_list.h never declared in ir/ops_*.cc: " << missing;
}

std::optional<OpId> OpTable::TryFind(std::string_view name) const {
  std::optional<OpId> id = OpIdOf(name);
  if (!id || !ops_[*id]) return std::nullopt;
  return id;
}

OpId OpTable::Find(std::string_view name) const {
  if (auto id = TryFind(name)) return *id;
  std::ostringstream os;
  for (const auto& op : ops_)
    if (op && op->name.find(name.substr(0, 3)) != std::string::npos) os << " " << op->name;
  KILN_THROW(ValueError) << "unknown op '" << name << "'"
                         << (os.tellp() ? "; similar ops:" + os.str() : std::string());
}


std::string ClosestOpName(std::string_view name) {
  const OpTable& t = OpTable::Get();
  std::string best;
  size_t best_d = SIZE_MAX;
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string& op = t[static_cast<OpId>(i)].name;
    size_t d = env::EditDistance(name, op);
    if (d < best_d) best_d = d, best = op;
  }
  return best;
}

}  // namespace kiln::ir
