// Row fusion decisions (passes/row_fusion.h) on graphs written as IR text, without codegen:
// softmax over the last axis is one contiguous group, batch-norm statistics over (0, 2, 3) one
// strided group, two sibling reductions over the same rows one group, and reductions over an
// inner axis or over stretches of 2 to 7 floats no group; a group refused by `accept` leaves its
// nodes to later seeds; deciding twice gives the same groups. The pass over a graph
// (RunRowFusion) records its groups as `#group=` notes: golden text, and a second run (or a run on
// the text parsed back) changes nothing.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kiln/ir/text.h"
#include "kiln/passes/fusion.h"
#include "kiln/passes/memory_planning.h"
#include "kiln/passes/row_fusion.h"

using kiln::passes::FindRowGroups;
using kiln::passes::RowFusionOptions;
using kiln::passes::RowGroup;
using kiln::passes::RowLayout;
using kiln::passes::RowLevel;
using kiln::passes::RowReduce;

namespace {
std::vector<RowGroup> Find(const kiln::ir::Graph& g, const RowFusionOptions& o = {}) {
  std::vector<bool> live(g.nodes().size(), true), claimed(g.nodes().size(), false);
  return FindRowGroups(g, live, &claimed, o);
}
std::vector<std::vector<int>> Members(const std::vector<RowGroup>& groups) {
  std::vector<std::vector<int>> out;
  for (const RowGroup& grp : groups) out.push_back(grp.members);
  return out;
}
using G = std::vector<std::vector<int>>;

const char* kSoftmax = "%x = input \"x\" : float32(32, 10)\n"
                       "%m = max(%x) {axes=[1], keepdims=true} : float32(32, 1)\n"
                       "%d = sub(%x, %m) : float32(32, 10)\n"
                       "%e = exp(%d) : float32(32, 10)\n"
                       "%s = sum(%e) {axes=[1], keepdims=true} : float32(32, 1)\n"
                       "%y = div(%e, %s) : float32(32, 10)\n"
                       "return %y\n";
} // namespace

TEST_CASE("row fusion groups: softmax over the last axis is one contiguous group") {
  auto g = kiln::ir::ParseGraph(kSoftmax);
  auto groups = Find(*g);
  REQUIRE(Members(groups) == G{{0, 1, 2, 3, 4}});
  const RowGroup& r = groups[0];
  CHECK(r.layout == RowLayout::kContiguous);
  CHECK(r.rows == 32);
  CHECK(r.len == 10);
  CHECK(r.levels == std::vector<RowLevel>{RowLevel::kRow, RowLevel::kElement, RowLevel::kElement,
                                          RowLevel::kRow, RowLevel::kElement});
  CHECK(r.ReductionOf(0) == RowReduce::kMax);
  CHECK(r.ReductionOf(3) == RowReduce::kSum);
  CHECK(!r.ReductionOf(2));
  // The input is read per element; the max (a member) is not an external operand.
  CHECK(r.ExternalRead(g->inputs()[0], RowLevel::kElement, r.full) == kiln::passes::RowRead::kElement);
  CHECK(r.IsMemberValue(g->nodes()[1]->output()));
  CHECK(!r.IsMemberValue(g->inputs()[0]));
}

TEST_CASE("row fusion groups: batch-norm statistics over (0, 2, 3) are one strided group") {
  auto g = kiln::ir::ParseGraph("%x = input \"x\" : float32(8, 4, 6, 6)\n"
                                "%mu = mean(%x) {axes=[0, 2, 3], keepdims=true} : float32(1, 4, 1, 1)\n"
                                "%c = sub(%x, %mu) : float32(8, 4, 6, 6)\n"
                                "%q = square(%c) : float32(8, 4, 6, 6)\n"
                                "%v = mean(%q) {axes=[0, 2, 3], keepdims=true} : float32(1, 4, 1, 1)\n"
                                "%r = rsqrt(%v) : float32(1, 4, 1, 1)\n"
                                "%y = mul(%c, %r) : float32(8, 4, 6, 6)\n"
                                "return %y\n");
  auto groups = Find(*g);
  REQUIRE(Members(groups) == G{{0, 1, 2, 3, 4, 5}});
  const RowGroup& r = groups[0];
  CHECK(r.layout == RowLayout::kStrided);
  CHECK(r.rows == 4);
  CHECK(r.len == 8 * 36);
  CHECK(r.inner == 36);
  CHECK(r.LevelOf(g->nodes()[4]->output()) == RowLevel::kRow); // rsqrt of a row value: per row
  CHECK(r.ReductionOf(3) == RowReduce::kMean);
}

TEST_CASE("row fusion groups: sibling reductions over the same rows join one group") {
  // The bias and scale gradients of batch norm: sum(dy) and sum(dy * xhat) over (0, 2, 3).
  auto g = kiln::ir::ParseGraph("%dy = input \"dy\" : float32(8, 4, 4, 4)\n"
                                "%xh = input \"xh\" : float32(8, 4, 4, 4)\n"
                                "%db = sum(%dy) {axes=[0, 2, 3], keepdims=true} : float32(1, 4, 1, 1)\n"
                                "%p = mul(%dy, %xh) : float32(8, 4, 4, 4)\n"
                                "%dg = sum(%p) {axes=[0, 2, 3], keepdims=true} : float32(1, 4, 1, 1)\n"
                                "return %db, %dg\n");
  auto groups = Find(*g);
  CHECK(Members(groups) == G{{0, 1, 2}});
  CHECK(groups[0].layout == RowLayout::kStrided);
}

TEST_CASE("row fusion groups: an inner axis, short stretches and int32 do not fuse") {
  // The reduced axis lies inside the kept ones.
  CHECK(Find(*kiln::ir::ParseGraph("%x = input \"x\" : float32(4, 8, 16)\n"
                                   "%s = sum(%x) {axes=[1], keepdims=true} : float32(4, 1, 16)\n"
                                   "%y = div(%x, %s) : float32(4, 8, 16)\n"
                                   "return %y\n"))
            .empty());
  // (0, 2) of (64, 16, 4): stretches of 4 floats run slower fused.
  CHECK(Find(*kiln::ir::ParseGraph("%x = input \"x\" : float32(64, 16, 4)\n"
                                   "%e = exp(%x) : float32(64, 16, 4)\n"
                                   "%s = sum(%e) {axes=[0, 2], keepdims=true} : float32(1, 16, 1)\n"
                                   "return %s\n"))
            .empty());
  CHECK(Find(*kiln::ir::ParseGraph("%x = input \"x\" : int32(4, 8)\n"
                                   "%a = abs(%x) : int32(4, 8)\n"
                                   "%s = sum(%a) {axes=[1], keepdims=true} : int32(4, 1)\n"
                                   "return %s\n"))
            .empty());
}

TEST_CASE("row fusion groups: a refused group leaves its nodes to later seeds") {
  auto g = kiln::ir::ParseGraph(kSoftmax);
  RowFusionOptions o;
  std::vector<int> seeds;
  o.accept = [&](const RowGroup& r) {
    seeds.push_back(r.members.front());
    return r.members.size() < 5; // refuses the whole softmax
  };
  // The max's group is refused; the sum then seeds one of its own, without the max (a reader
  // computed outside), and is accepted.
  auto groups = Find(*g, o);
  REQUIRE(groups.size() == 1);
  CHECK(groups[0].ReductionOf(3) == RowReduce::kSum);
  CHECK(!groups[0].IsMember(0));
  CHECK(seeds.size() == 2);
}

TEST_CASE("row fusion groups: deciding twice gives the same groups") {
  for (const char* text : {kSoftmax, "%x = input \"x\" : float32(8, 4, 6, 6)\n"
                                     "%mu = mean(%x) {axes=[0, 2, 3], keepdims=true} : float32(1, 4, 1, 1)\n"
                                     "%c = sub(%x, %mu) : float32(8, 4, 6, 6)\n"
                                     "%q = square(%c) : float32(8, 4, 6, 6)\n"
                                     "%v = mean(%q) {axes=[0, 2, 3], keepdims=true} : float32(1, 4, 1, 1)\n"
                                     "return %v, %c\n"}) {
    auto g = kiln::ir::ParseGraph(text);
    auto a = Find(*g), b = Find(*g);
    REQUIRE(a.size() == b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      CHECK(a[k].members == b[k].members);
      CHECK(a[k].levels == b[k].levels);
      CHECK(a[k].reduce == b[k].reduce);
    }
  }
}

TEST_CASE("row fusion pass: golden text, then elementwise fusion and memory planning, and a second run changes "
          "nothing") {
  auto g = kiln::ir::ParseGraph("%x = input \"x\" : float32(32, 10)\n"
                                "%t = tanh(%x) : float32(32, 10)\n"
                                "%m = max(%t) {axes=[1], keepdims=true} : float32(32, 1)\n"
                                "%d = sub(%t, %m) : float32(32, 10)\n"
                                "%e = exp(%d) : float32(32, 10)\n"
                                "%s = sum(%e) {axes=[1], keepdims=true} : float32(32, 1)\n"
                                "%y = div(%e, %s) : float32(32, 10)\n"
                                "%z = transpose(%y) {axes=[1, 0]} : float32(10, 32)\n"
                                "%w = neg(%z) : float32(10, 32)\n"
                                "%v = relu(%w) : float32(10, 32)\n"
                                "return %v\n");
  CHECK(kiln::passes::RunRowFusion(*g, {}));
  CHECK(kiln::passes::RunElementwiseFusion(*g));
  CHECK(kiln::passes::RunMemoryPlanning(*g, {}));
  const std::string out = kiln::ir::PrintGraph(*g);
  // The row group (tanh joins as a producer) writes %6, which the transpose reads; the
  // transpose is no elementwise op and takes a new block; neg and relu are one elementwise group.
  CHECK(out == "%0 = input \"x\" : float32(32, 10)\n"
               "%1 = tanh(%0) : float32(32, 10) #group=0\n"
               "%2 = max(%1) {axes=[1], keepdims=true} : float32(32, 1) #group=0\n"
               "%3 = sub(%1, %2) : float32(32, 10) #group=0\n"
               "%4 = exp(%3) : float32(32, 10) #group=0\n"
               "%5 = sum(%4) {axes=[1], keepdims=true} : float32(32, 1) #group=0\n"
               "%6 = div(%4, %5) : float32(32, 10) #group=0 @arena+0\n"
               "%7 = transpose(%6) {axes=[1, 0]} : float32(10, 32) @arena+1280\n"
               "%8 = neg(%7) : float32(10, 32) #group=1\n"
               "%9 = relu(%8) : float32(10, 32) #group=1\n"
               "return %9\n");
  CHECK(!kiln::passes::RunRowFusion(*g, {}));
  CHECK(!kiln::passes::RunElementwiseFusion(*g));
  CHECK(!kiln::passes::RunMemoryPlanning(*g, {}));
  CHECK(kiln::ir::PrintGraph(*g) == out);
  // The annotated text parses back with its groups: the passes then find nothing more to do.
  auto back = kiln::ir::ParseGraph(out);
  CHECK(!kiln::passes::RunRowFusion(*back, {}));
  CHECK(!kiln::passes::RunElementwiseFusion(*back));
  CHECK(!kiln::passes::RunMemoryPlanning(*back, {}));
  CHECK(kiln::ir::PrintGraph(*back) == out);
}
