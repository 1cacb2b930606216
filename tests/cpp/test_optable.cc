// The op table's completeness test (DESIGN.md section 3, STYLE.md convention 1): every op has
// inference, a fusion kind, a gradient rule or an explicit "not differentiable", and a CPU
// kernel; pure unary/binary math ops name their scalar function. Also the exact errors of
// attribute resolution and op lookup.
#include <doctest/doctest.h>

#include <string>

#include "kiln/frontend/dispatch.h"
#include "kiln/ir/op.h"

using namespace kiln;

namespace {

/// The message of the ValueError `f` throws ("" when it throws none).
template <class F>
std::string ValueErrorOf(F&& f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("op table: completeness") {
  const ir::OpTable& table = ir::OpTable::Get();
  REQUIRE(table.size() > 0);
  for (size_t i = 0; i < table.size(); ++i) {
    const ir::OpDef& d = table[static_cast<ir::OpId>(i)];
    INFO("op '" << d.name << "'");
    CHECK(d.id == i);
    CHECK(table.Find(d.name) == d.id);
    CHECK_MESSAGE(static_cast<bool>(d.infer), "no inference function");
    CHECK_MESSAGE(std::string(ir::FusionKindName(d.fusion)) != "?", "no valid fusion kind");
    CHECK_MESSAGE(!d.doc.empty(), "no one-line doc");
    if (d.differentiable)
      CHECK_MESSAGE(static_cast<bool>(d.grad), "differentiable but has no gradient rule");
    else
      CHECK_MESSAGE(!d.grad, "has a gradient rule but is marked differentiable=false");
    CHECK_MESSAGE(KernelTable::Get().Find(d.id, DeviceType::kCPU) != nullptr, "no CPU kernel");
    for (const ir::AttrSpec& a : d.attrs)
      if (a.default_value)
        CHECK_MESSAGE(ir::KindOf(*a.default_value) == a.kind,
                      "default of attribute '" << a.name << "' is a "
                                               << ir::AttrKindName(ir::KindOf(*a.default_value))
                                               << ", the schema says " << ir::AttrKindName(a.kind));

    // Pure math: one input, no attributes, elementwise -> a unary function; two inputs, no
    // attributes, broadcast -> a binary function. (cast has an attribute, where three inputs,
    // creation ops none, so they are not pure math ops.)
    const bool plain = d.attrs.empty() && !d.random && d.num_outputs == 1;
    if (plain && d.num_inputs == 1 && d.fusion == ir::FusionKind::kElementwise)
      CHECK_MESSAGE(d.unary_fn.has_value(), "a unary elementwise op without unary_fn");
    if (plain && d.num_inputs == 2 && d.fusion == ir::FusionKind::kBroadcast)
      CHECK_MESSAGE(d.binary_fn.has_value(), "a binary broadcast op without binary_fn");
    if (d.unary_fn)
      CHECK_MESSAGE((d.num_inputs == 1 && d.fusion == ir::FusionKind::kElementwise),
                    "declares unary_fn but is not a one-input elementwise op");
    if (d.binary_fn)
      CHECK_MESSAGE((d.num_inputs == 2 && d.fusion == ir::FusionKind::kBroadcast),
                    "declares binary_fn but is not a two-input broadcast op");
  }
}

TEST_CASE("op table: attribute resolution errors") {
  const ir::OpDef& full = ir::GetOp(ir::FindOp("full"));

  SUBCASE("unknown name lists the valid ones") {
    std::string msg = ValueErrorOf([&] {
      full.Resolve({{"shape", std::vector<int64_t>{2}}, {"valu", 1.0}});
    });
    INFO(msg);
    CHECK(Contains(msg, "full"));
    CHECK(Contains(msg, "'valu'"));
    CHECK(Contains(msg, "shape"));
    CHECK(Contains(msg, "value"));
    CHECK(Contains(msg, "dtype"));
  }
  SUBCASE("wrong kind") {
    std::string msg = ValueErrorOf([&] { full.Resolve({{"shape", 1.5}}); });
    INFO(msg);
    CHECK(Contains(msg, "full"));
    CHECK(Contains(msg, "shape"));
    msg = ValueErrorOf([&] { full.Resolve({{"shape", std::vector<int64_t>{2}}, {"dtype", int64_t{3}}}); });
    CHECK(Contains(msg, "dtype"));
  }
  SUBCASE("missing required") {
    std::string msg = ValueErrorOf([&] { full.Resolve({}); });
    INFO(msg);
    CHECK(Contains(msg, "full"));
    CHECK(Contains(msg, "shape"));
    CHECK(Contains(msg, "required"));
  }
  SUBCASE("an op without attributes rejects any") {
    std::string msg = ValueErrorOf([] { ir::GetOp(ir::FindOp("add")).Resolve({{"axis", int64_t{0}}}); });
    INFO(msg);
    CHECK(Contains(msg, "add"));
    CHECK(Contains(msg, "'axis'"));
  }
  SUBCASE("defaults are filled in schema order; an int stands for a float or a one-element list") {
    ir::Attrs a = full.Resolve({{"value", int64_t{2}}, {"shape", int64_t{3}}});
    REQUIRE(a.items().size() == full.attrs.size());
    for (size_t i = 0; i < a.items().size(); ++i)
      CHECK(std::string(a.items()[i].first) == full.attrs[i].name);
    CHECK(a.Float("value") == 2.0);
    CHECK(a.Ints("shape") == std::vector<int64_t>{3});
    CHECK(a.Type("dtype") == DType::kFloat32);
  }
  SUBCASE("dispatch surfaces the same errors") {
    Tensor x = Tensor::FromVector<float>({1, 2}, {2});
    CHECK(Contains(ValueErrorOf([&] { Invoke1("cast", {x}); }), "required"));
    CHECK(Contains(ValueErrorOf([&] { Invoke1("cast", {x}, {{"dtyp", DType::kInt32}}); }), "'dtyp'"));
  }
}

TEST_CASE("op table: unknown op name") {
  std::string msg = ValueErrorOf([] { ir::FindOp("no_such_op"); });
  INFO(msg);
  CHECK(Contains(msg, "unknown op 'no_such_op'"));
  CHECK(!ir::OpTable::Get().TryFind("no_such_op").has_value());
  msg = ValueErrorOf([] { Invoke1("addd", {Tensor::FromVector<float>({1}, {1})}); });
  CHECK(Contains(msg, "'addd'"));
  CHECK(Contains(msg, "add"));  // similar names are suggested
}


TEST_CASE("op table: the op list's ids, names and scalar functions are the table's") {
  const ir::OpTable& table = ir::OpTable::Get();
  REQUIRE(table.size() == op::kNumOps);
  for (OpId id = 0; id < op::kNumOps; ++id) {
    const ir::OpDef& d = table[id];
    INFO("op '" << OpName(id) << "'");
    CHECK(d.id == id);
    CHECK(d.name == OpName(id));
    CHECK(OpIdOf(d.name) == id);
    CHECK(d.unary_fn == UnaryFnOf(id));
    CHECK(d.binary_fn == BinaryFnOf(id));
  }
  static_assert(op::kAdd != op::kSub && OpName(op::kOneHot) == "one_hot");
  CHECK(ir::FindOp("broadcast_to") == op::kBroadcastTo);
  CHECK(ir::GetOp(op::kSoftplus).unary_fn == UnaryFn::kSoftplus);
  CHECK(ir::GetOp(op::kCopy).unary_fn == UnaryFn::kIdentity);
  CHECK(!OpIdOf("no_such_op").has_value());
  CHECK(OpName(op::kNumOps) == "?");
}

TEST_CASE("op table: an op is declared once, by its id, and every listed op is declared") {
  auto declare = [](ir::OpTable& t, OpId id) {
    ir::OpDef d(id);
    d.infer = [](const ir::OpDef&, std::span<const ir::TensorType> in, const ir::Attrs&) {
      return std::vector<ir::TensorType>(in.begin(), in.end());
    };
    return t.Add(std::move(d)).id;
  };
  ir::OpTable t;
  CHECK(declare(t, op::kAdd) == op::kAdd);
  CHECK_THROWS_WITH_AS(declare(t, op::kAdd), doctest::Contains("'add' is declared twice"), InternalError);
  ir::OpDef by_name;
  by_name.name = "add";
  by_name.infer = ir::GetOp(op::kAdd).infer;
  CHECK_THROWS_WITH_AS(t.Add(by_name), doctest::Contains("not declared by its id"), InternalError);
  // Everything but add is missing: the error names what is missing, in list order.
  CHECK_THROWS_WITH_AS(t.CheckComplete(), doctest::Contains("never declared in ir/ops_*.cc: neg, abs, sign"),
                       InternalError);
  CHECK_NOTHROW(ir::OpTable::Get().CheckComplete());
}

TEST_CASE("kernel table: every op has a CPU kernel bound by id, in runtime/") {
  const KernelTable& kernels = KernelTable::Get();
  for (OpId id = 0; id < op::kNumOps; ++id) {
    INFO("op '" << OpName(id) << "'");
    CHECK(kernels.Find(id, DeviceType::kCPU) != nullptr);
  }
  CHECK(kernels.Find(op::kNumOps, DeviceType::kCPU) == nullptr);
  // Binding twice is an internal error naming the op.
  KernelTable t;
  t.Bind(op::kExp, DeviceType::kCPU, *kernels.Find(op::kExp, DeviceType::kCPU));
  CHECK_THROWS_WITH_AS(t.Bind("exp", DeviceType::kCPU, *kernels.Find(op::kExp, DeviceType::kCPU)),
                       doctest::Contains("kernel for 'exp' bound twice"), InternalError);
}
