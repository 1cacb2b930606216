// passes::ChooseSaved: which forward values a training pair's backward is handed, and which it
// computes again. The graphs hold a forward (nodes before `mark`) and stand-in gradient nodes
// after it that read forward values.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kiln/ir/graph.h"
#include "kiln/ir/text.h"
#include "kiln/passes/rematerialize.h"

namespace {

using namespace kiln;

// The forward values the nodes from `mark` on read, in order.
std::vector<const ir::Value*> Needed(const ir::Graph& g, size_t mark) {
  std::vector<const ir::Value*> out;
  for (size_t i = mark; i < g.nodes().size(); ++i)
    for (const ir::Value* v : g.nodes()[i]->inputs()) out.push_back(v);
  return out;
}

const ir::Value* Out(const ir::Graph& g, size_t node) { return g.nodes()[node]->output(); }

// A dense layer, a batch norm composed of pointwise ops and reductions, relu, the next dense
// layer and a loss; the "gradient" reads what such a backward reads: relu's output (its own
// gradient and the next layer's weight gradient), the normalized x, x - mean and 1/std.
constexpr const char* kBatchNormRelu = R"(%0 = input "x" : float32(8, 4)
%1 = input "w" : float32(4, 4)
%2 = input "gamma" : float32(1, 4)
%3 = matmul(%0, %1) : float32(8, 4)
%4 = mean(%3) {axes=[0], keepdims=true} : float32(1, 4)
%5 = sub(%3, %4) : float32(8, 4)
%6 = mul(%5, %5) : float32(8, 4)
%7 = mean(%6) {axes=[0], keepdims=true} : float32(1, 4)
%8 = rsqrt(%7) : float32(1, 4)
%9 = mul(%5, %8) : float32(8, 4)
%10 = mul(%9, %2) : float32(8, 4)
%11 = relu(%10) : float32(8, 4)
%12 = matmul(%11, %1) : float32(8, 4)
%13 = sum(%12) {axes=[], keepdims=false} : float32()
%14 = sign(%11) : float32(8, 4)
%15 = mul(%14, %9) : float32(8, 4)
%16 = mul(%5, %8) : float32(8, 4)
%17 = matmul(%11, %15) {transpose_a=true} : float32(4, 4)
return %13, %16, %17
)";

TEST_CASE("rematerialize: a batch norm and relu keep x - mean and 1/std, the rest is computed again") {
  auto g = ir::ParseGraph(kBatchNormRelu);
  const size_t mark = 11;  // nodes 0-10 are the forward
  std::vector<const ir::Value*> needed = Needed(*g, mark), keep = {Out(*g, 10)};
  passes::SavePlan p = passes::ChooseSaved(*g, mark, needed, keep);
  // x - mean (node 2) costs what recomputing it would (the matmul's output and the mean), so it
  // is kept; 1/std (node 5) too (its input, the variance, is as large). The normalized x, the
  // scaled x and relu's output (nodes 6-8) come from them and gamma, a graph input.
  CHECK(p.saved == std::vector<const ir::Value*>{Out(*g, 2), Out(*g, 5)});
  CHECK(p.recompute == std::vector<const ir::Node*>{g->nodes()[6].get(), g->nodes()[7].get(), g->nodes()[8].get()});
}

TEST_CASE("rematerialize: outputs, values read from overwritten inputs and values no cheaper to recompute are kept") {
  auto g = ir::ParseGraph(kBatchNormRelu);
  const size_t mark = 11;
  std::vector<const ir::Value*> needed = Needed(*g, mark);
  // relu's output is an output of the forward: kept, and nothing is recomputed for it.
  std::vector<const ir::Value*> keep = {Out(*g, 8), Out(*g, 10)};
  passes::SavePlan p = passes::ChooseSaved(*g, mark, needed, keep);
  CHECK(p.saved == std::vector<const ir::Value*>{Out(*g, 2), Out(*g, 5), Out(*g, 8)});
  CHECK(p.recompute == std::vector<const ir::Node*>{g->nodes()[6].get()});

  // gamma overwritten by the call (as running statistics are): the backward would read its new
  // values, so nothing that reads it is recomputed; relu's output is kept.
  std::vector<const ir::Value*> stale = {g->inputs()[2]};
  keep = {Out(*g, 10)};
  passes::SavePlan r = passes::ChooseSaved(*g, mark, needed, keep, stale);
  CHECK(r.saved == std::vector<const ir::Value*>{Out(*g, 2), Out(*g, 5), Out(*g, 8)});
  CHECK(r.recompute == std::vector<const ir::Node*>{g->nodes()[6].get()});

  // relu(x W + b) read by its gradient: recomputing it needs x W, as large as relu's output, so
  // relu's output is kept (a tie keeps the value: the same memory for less work).
  auto h = ir::ParseGraph(R"(%0 = input "x" : float32(8, 4)
%1 = input "w" : float32(4, 4)
%2 = input "b" : float32(4)
%3 = matmul(%0, %1) : float32(8, 4)
%4 = add(%3, %2) : float32(8, 4)
%5 = relu(%4) : float32(8, 4)
%6 = sum(%5) {axes=[], keepdims=false} : float32()
%7 = sign(%5) : float32(8, 4)
return %6, %7
)");
  std::vector<const ir::Value*> hneeded = Needed(*h, 4), hkeep = {Out(*h, 3)};
  passes::SavePlan q = passes::ChooseSaved(*h, 4, hneeded, hkeep);
  CHECK(q.saved == std::vector<const ir::Value*>{Out(*h, 2)});
  CHECK(q.recompute.empty());
}

}  // namespace

TEST_CASE("rematerialize: a value is not computed again from more than 16 pointwise ops away") {
  // relu(x + b + b + ... + b), 40 adds from the input x: recomputing it would cost no memory, but
  // 41 ops of work (and as deep a recursion); it is kept.
  std::string text = "%0 = input \"x\" : float32(8, 4)\n%1 = input \"b\" : float32(8, 4)\n";
  int last = 0;
  for (int i = 0; i < 40; ++i) {
    text += "%" + std::to_string(i + 2) + " = add(%" + std::to_string(last) + ", %1) : float32(8, 4)\n";
    last = i + 2;
  }
  text += "%42 = relu(%41) : float32(8, 4)\n%43 = sign(%42) : float32(8, 4)\nreturn %43\n";
  auto g = ir::ParseGraph(text);
  const size_t mark = 41;  // the adds and relu
  std::vector<const ir::Value*> needed = Needed(*g, mark);
  passes::SavePlan p = passes::ChooseSaved(*g, mark, needed, {});
  CHECK(p.saved == std::vector<const ir::Value*>{Out(*g, 40)});
  CHECK(p.recompute.empty());

  // Two adds deep: computed again from x and b.
  auto h = ir::ParseGraph(R"(%0 = input "x" : float32(8, 4)
%1 = input "b" : float32(8, 4)
%2 = add(%0, %1) : float32(8, 4)
%3 = add(%2, %1) : float32(8, 4)
%4 = relu(%3) : float32(8, 4)
%5 = sign(%4) : float32(8, 4)
return %5
)");
  std::vector<const ir::Value*> hneeded = Needed(*h, 3);
  passes::SavePlan q = passes::ChooseSaved(*h, 3, hneeded, {});
  CHECK(q.saved.empty());
  CHECK(q.recompute.size() == 3);
}
