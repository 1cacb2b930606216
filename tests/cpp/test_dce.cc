// passes::LiveNodes: which nodes the requested values depend on.
#include <doctest/doctest.h>

#include "kiln/ir/graph.h"
#include "kiln/ir/text.h"
#include "kiln/passes/dce.h"

namespace {

using namespace kiln;

TEST_CASE("dce: only the nodes the roots depend on are live") {
  auto g = ir::ParseGraph(R"(%0 = input "x" : float32(2, 3)
%1 = input "w" : float32(3, 3)
%2 = matmul(%0, %1) : float32(2, 3)
%3 = exp(%0) : float32(2, 3)
%4 = relu(%2) : float32(2, 3)
%5 = add(%3, %3) : float32(2, 3)
return %4
)");
  std::vector<ir::Value*> roots = {g->outputs()[0]};
  CHECK(passes::LiveNodes(*g, roots) == std::vector<bool>{true, false, true, false});
  roots = {g->nodes()[3]->output()};
  CHECK(passes::LiveNodes(*g, roots) == std::vector<bool>{false, true, false, true});
  roots = {g->inputs()[0]};  // a graph input needs no node
  CHECK(passes::LiveNodes(*g, roots) == std::vector<bool>{false, false, false, false});
}

}  // namespace
