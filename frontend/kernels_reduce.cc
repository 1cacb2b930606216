#include "kiln/frontend/dispatch.h"

namespace kiln {

void BindReduceKernels(KernelTable& t) { (void)t; }

}  // namespace kiln
