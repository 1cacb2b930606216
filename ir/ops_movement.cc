#include "infer_util.h"

namespace kiln::ir {

void RegisterMovementOps(OpTable& t) { (void)t; }

}  // namespace kiln::ir
