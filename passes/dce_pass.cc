// Dead-code elimination as a pass: keeps the nodes the graph outputs depend on (LiveNodes) and
// drops the rest.
//  - Graph inputs always stay, used or not: their order is the graph's calling convention.
//  - A dead random op is dropped like any other node. Random ops draw from the generator stream
//    that dispatch assigns in node order, so dropping one can shift the draws of later random
//    ops: the optimized graph's samples are valid draws but not bit-identical to the unoptimized
//    graph's. Keeping dead draws only to preserve offsets would cost work for nothing observable.
#include <algorithm>

#include "kiln/passes/dce.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {

bool RunDCE(std::unique_ptr<ir::Graph>& g) {
  std::vector<bool> live = LiveNodes(*g, g->outputs());
  if (std::find(live.begin(), live.end(), false) == live.end()) return false;
  GraphCopier c(*g);
  for (const auto& n : g->nodes())
    if (live[static_cast<size_t>(n->id())]) c.Copy(*n);
  g = c.Finish();
  return true;
}

} // namespace kiln::passes
