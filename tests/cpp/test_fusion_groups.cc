// Elementwise fusion decisions (passes/fusion.h) on graphs written as IR text: chains and trees
// become one group, a value read twice or returned ends a group, two producer groups merge at
// their common consumer, broadcast operands and `full` constants join, claimed nodes and
// non-float32 ops stay out.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kiln/ir/text.h"
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

TEST_CASE("fusion groups: a bias operand and a full constant join; other broadcasts and dtypes do not") {
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
