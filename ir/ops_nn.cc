#include "infer_util.h"

namespace kiln::ir {

void RegisterNNOps(OpTable& t) { (void)t; }

}  // namespace kiln::ir
