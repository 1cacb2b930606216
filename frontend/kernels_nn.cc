#include "kiln/frontend/dispatch.h"

namespace kiln {

void BindNNKernels(KernelTable& t) { (void)t; }

}  // namespace kiln
