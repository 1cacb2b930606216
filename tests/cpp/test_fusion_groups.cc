// Fusion decisions on graphs written as IR text. Elementwise (passes/fusion.h): chains and trees
// become one group, a value read twice or returned ends a group, two producer groups merge at
// their common consumer, broadcast operands and `full` constants join, claimed nodes and
// non-float32 ops stay out. Epilogues (passes/epilogue_fusion.h): a matmul's chain follows single
// readers while the capability callbacks accept the next op.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kiln/ir/text.h"
#include "kiln/passes/epilogue_fusion.h"
#include "kiln/passes/fusion.h"

using kiln::passes::FindElementwiseGroups;

namespace {
// The groups of the graph `text` as lists of node indices; `claimed` node indices left out.
std::vector<std::vector<int>> Groups(const std::string& text, std::vector<int> claimed = {}) {
  auto g = kiln::ir::ParseGraph(text);
  std::vector<bool> live(g->nodes().size(), true), claim(g->nodes().size(), false);
  for (int c : claimed) claim[static_cast<size_t>(c)] = true;
  std::vector<std::vector<int>> out;
  for (const auto& grp : FindElementwiseGroups(*g, live, claim)) out.push_back(grp.members);
  return out;
}
using G = std::vector<std::vector<int>>;
}  // namespace

TEST_CASE("fusion groups: a chain is one group") {
  const std::string text = "%x = input \"x\" : float32(2, 3)\n"
                           "%a = exp(%x) : float32(2, 3)\n"
                           "%b = neg(%a) : float32(2, 3)\n"
                           "%c = relu(%b) : float32(2, 3)\n"
                           "return %c\n";
  CHECK(Groups(text) == G{{0, 1, 2}});
  CHECK(Groups(text, {1}) == G{});  // a claimed middle cuts the chain into single nodes
}

TEST_CASE("fusion groups: a value read twice or returned ends a group") {
  CHECK(Groups("%x = input \"x\" : float32(4,)\n"
               "%a = exp(%x) : float32(4,)\n"
               "%b = neg(%a) : float32(4,)\n"
               "%c = add(%a, %b) : float32(4,)\n"
               "return %c\n") == G{{1, 2}});
  CHECK(Groups("%x = input \"x\" : float32(4,)\n"
               "%a = exp(%x) : float32(4,)\n"
               "%b = neg(%a) : float32(4,)\n"
               "return %b, %a\n") == G{});
}

TEST_CASE("fusion groups: two producer groups merge at their common consumer") {
  CHECK(Groups("%x = input \"x\" : float32(8,)\n"
               "%y = input \"y\" : float32(8,)\n"
               "%p1 = exp(%x) : float32(8,)\n"
               "%p2 = neg(%p1) : float32(8,)\n"
               "%q1 = exp(%y) : float32(8,)\n"
               "%q2 = tanh(%q1) : float32(8,)\n"
               "%r = mul(%p2, %q2) : float32(8,)\n"
               "return %r\n") == G{{0, 1, 2, 3, 4}});
}

TEST_CASE("fusion groups: a bias operand and a full constant join, other broadcasts and dtypes do not") {
  CHECK(Groups("%x = input \"x\" : float32(2, 3)\n"
               "%bias = input \"bias\" : float32(3,)\n"
               "%two = full() {shape=[], value=2.0} : float32()\n"
               "%a = add(%x, %bias) : float32(2, 3)\n"
               "%b = mul(%a, %two) : float32(2, 3)\n"
               "return %b\n") == G{{1, 2}});
  // A reshape is not elementwise: the exp after it stays alone.
  CHECK(Groups("%x = input \"x\" : float32(2, 3)\n"
               "%r = reshape(%x) {shape=[3, 2]} : float32(3, 2)\n"
               "%a = exp(%r) : float32(3, 2)\n"
               "return %a\n") == G{});
  CHECK(Groups("%x = input \"x\" : int32(4,)\n"
               "%a = neg(%x) : int32(4,)\n"
               "%b = abs(%a) : int32(4,)\n"
               "return %b\n") == G{});
}

namespace {
// A library whose epilogue takes relu and add after a matmul (channel axis: the last).
int MatmulLast(const kiln::ir::Node& n) { return n.def().name == "matmul" ? n.output()->shape().rank() - 1 : -1; }
int NoAnchor(const kiln::ir::Node&) { return -1; }
bool ReluOnly(kiln::UnaryFn f) { return f == kiln::UnaryFn::kRelu; }
bool AddOnly(kiln::BinaryFn f) { return f == kiln::BinaryFn::kAdd; }

const char* kDense = "%x = input \"x\" : float32(4, 8)\n"
                     "%w = input \"w\" : float32(8, 8)\n"
                     "%b = input \"b\" : float32(8,)\n"
                     "%m = matmul(%x, %w) : float32(4, 8)\n"
                     "%a = add(%m, %b) : float32(4, 8)\n"
                     "%half = full() {shape=[], value=0.5} : float32()\n"
                     "%s = mul(%a, %half) : float32(4, 8)\n"
                     "%r = relu(%s) : float32(4, 8)\n"
                     "%e = exp(%r) : float32(4, 8)\n"
                     "return %e\n";

std::vector<kiln::passes::EpilogueChain> Chains(const std::string& text, const kiln::passes::EpilogueOptions& o) {
  auto g = kiln::ir::ParseGraph(text);
  std::vector<bool> live(g->nodes().size(), true), claimed(g->nodes().size(), false);
  return kiln::passes::FindEpilogueChains(*g, live, claimed, o);
}
}  // namespace

TEST_CASE("epilogue chains: a matmul takes its bias, a scalar scale and relu, and exp ends the chain") {
  using kiln::passes::EpilogueOp;
  auto chains = Chains(kDense, {MatmulLast, ReluOnly, AddOnly, 4});
  REQUIRE(chains.size() == 1);
  CHECK(chains[0].members == std::vector<int>{0, 1, 3, 4});  // node 2 is the `full` constant
  REQUIRE(chains[0].ops.size() == 3);
  CHECK(chains[0].ops[0].kind == EpilogueOp::kBinary);
  CHECK(chains[0].ops[0].per_channel);
  CHECK(chains[0].ops[1].kind == EpilogueOp::kLinear);
  CHECK(chains[0].ops[1].alpha == 0.5f);
  CHECK(chains[0].ops[2].kind == EpilogueOp::kUnary);
  CHECK(chains[0].operands.size() == 1);
}

TEST_CASE("epilogue chains: the capability callbacks decide") {
  CHECK(Chains(kDense, {NoAnchor, ReluOnly, AddOnly, 4}).empty());
  // Without binary post-ops the bias add cannot follow: nothing after the matmul joins.
  CHECK(Chains(kDense, {MatmulLast, ReluOnly, [](kiln::BinaryFn) { return false; }, 4}).empty());
  // No tensor operands allowed: the bias ends the chain before it starts.
  CHECK(Chains(kDense, {MatmulLast, ReluOnly, AddOnly, 0}).empty());
}
