// Generated kernels as executor steps (DESIGN.md sections 9 and 10): the launch callbacks that run
// a compiled elementwise or row kernel over the views the executor (runtime/executor.h) hands a
// step. The plan builder calls these when it binds fused groups; the executor never sees a kernel.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "kiln/codegen/elementwise.h"
#include "kiln/codegen/ptx.h"
#include "kiln/codegen/row.h"
#include "kiln/runtime/executor.h"

namespace kiln::codegen {

/// A step running `kernel` over `numel` elements: its inputs are the step's inputs, its output
/// the step's first output (float32, contiguous). The step keeps `kernel` alive.
std::function<void(const exec::StepArgs&)> ElementwiseStep(std::shared_ptr<const CompiledKernel> kernel, int64_t numel);

/// A step running `kernel` over `rows` rows of `len`: its inputs and outputs are the step's.
std::function<void(const exec::StepArgs&)> RowStep(std::shared_ptr<const RowKernel> kernel, int64_t rows, int64_t len);

/// A step running the generated GPU kernel `kernel` (GeneratePtx) over `numel` elements on the
/// call's GPU, on the worker's stream; loaded once per device. Inputs and output as above.
std::function<void(const exec::StepArgs&)> GpuElementwiseStep(std::shared_ptr<const PtxKernel> kernel, int64_t numel);

}  // namespace kiln::codegen
