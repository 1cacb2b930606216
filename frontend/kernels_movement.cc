#include "kiln/frontend/dispatch.h"

namespace kiln {

void BindMovementKernels(KernelTable& t) { (void)t; }

}  // namespace kiln
